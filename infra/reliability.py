"""Failures and checkpoints: cluster MTBF, checkpoint cost, Young/Daly interval, goodput, spares.

A synchronous job stops at every interruption and resumes from the newest *committed* checkpoint. The
trainer saves asynchronously (docs/design.md §4): training blocks ``blocking_s`` (copy to host memory and save
coordination) and the checkpoint commits ``commit_s`` after the save began, while training continues.

Goodput closed form (exponential failures with mean M, restart R that failures may also interrupt, Daly
2006 generalised to async saves). Progress τ is committed every τ+δ of wall time in steady state; after a
failure the job needs R + τ + W without another failure to commit again. With B = M(e^{(R+τ+W)/M} − 1)
the expected wall time per committed τ is A = (1 − e^{−(τ+δ)/M})(M + B), and goodput = τ / A. For
synchronous saves (W = δ) this is Daly's M·e^{R/M}(e^{(τ+δ)/M} − 1).

What R and the saves are depends on the recovery mode (infra/recovery.py). ``storage``: R is the full relaunch
plus the checkpoint load and τ the Daly interval of storage saves. ``snapshot`` and ``in-process``: the saves are
the per-step snapshots (τ = one step, W = until replicated) and R the mode's restart; storage checkpoints then
only cover disasters (a node and its replica peer lost together, probability p per failure), so their interval
is Daly's against the disaster MTBF M/p, and goodput is the product of the two closed forms (first order: the
two overheads are small and independent). ``replicas``: a failure stops one torchft replica group, not the job,
and costs the cluster a fixed ``lost`` (infra/replica_recovery.py), so goodput is 1 − lost/M times the same
disaster term, the disaster being every group lost at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.layout import Layout
from infra.recovery import DEFAULT_RECOVERY, IN_SMELT, RECOVERY_MODES, Part, SnapshotCost, \
    disaster_probability, full_relaunch_parts, full_relaunch_s, in_process_parts, snapshot_cost, \
    spare_shortage_probability
from infra.recovery_figures import DETECTION_S, PROCESS_GROUP_INIT_S
from infra.replica_figures import RECONFIGURE_S
from infra.replica_recovery import ReplicaCost, StepOverhead, replica_cost

# Llama 3 405B: 419 unexpected interruptions on 16,384 H100s in a 54-day snapshot (Llama 3 paper, §3.3.4).
LLAMA3_MTBF_GPU_HOURS = 16_384 * 54 * 24 / 419


@dataclass(frozen=True)
class FailureAssumptions:
    mtbf_gpu_hours: float = LLAMA3_MTBF_GPU_HOURS  # per GPU, counting every cause that stops the job
    restart_minutes: float = 10.0  # full relaunch: detect, swap in a spare node, relaunch, rendezvous (load added)
    planned_per_day: float = 0.0  # maintenance restarts (Llama 3: 47 in 54 days); they lose no work
    repair_hours: float = 48.0  # a failed node is out this long; spares cover the nodes in repair
    spare_confidence: float = 0.99  # enough spares for this quantile of nodes in repair at once
    storage_gbps: float = 500.0  # aggregate checkpoint storage bandwidth, GB/s, each way
    save_coordination_s: float = 5.0  # blocking part of an async save besides the device→host copy
    state_bytes_per_param: int = 12  # fp32 master weights + Adam m and v
    recovery: str = DEFAULT_RECOVERY  # storage | snapshot | in-process (infra/recovery.py)
    detection_s: float = DETECTION_S.value  # failure → the job knows (infra/recovery_figures.py)
    process_group_init_s: float = PROCESS_GROUP_INIT_S.value  # NCCL communicators at this scale
    snapshot_interval_steps: int = 1  # the trainer snapshots every step by default
    replica_reconfigure_s: float = RECONFIGURE_S.value  # replicas: the cross-group group rebuilt (an assumption)
    replica_allreduce_gbps: float = 0.0  # replicas: the cross-group all-reduce's rate; 0: the GPU's inter-node link

    def __post_init__(self) -> None:
        if self.recovery not in RECOVERY_MODES:
            raise ValueError(f"--recovery {self.recovery!r}: choose one of {', '.join(RECOVERY_MODES)}")
        if (min(self.detection_s, self.process_group_init_s, self.replica_reconfigure_s,
                self.replica_allreduce_gbps) < 0 or self.snapshot_interval_steps < 1):
            raise ValueError("detection_s, process_group_init_s, replica_reconfigure_s and replica_allreduce_gbps "
                             "must not be negative, snapshot_interval_steps at least 1")
        for name in ("mtbf_gpu_hours", "storage_gbps", "repair_hours"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.restart_minutes < 0 or self.planned_per_day < 0 or self.save_coordination_s < 0:
            raise ValueError("restart_minutes, planned_per_day and save_coordination_s must not be negative")
        if not 0 < self.spare_confidence < 1:
            raise ValueError(f"spare_confidence must be in (0, 1), got {self.spare_confidence}")


@dataclass(frozen=True)
class CheckpointCost:
    size_bytes: float
    blocking_s: float  # δ: training stops this long per save
    commit_s: float  # W: save start → committed (W ≥ δ)
    load_s: float  # reading it back at restart


def checkpoint_cost(total_params: int, layout: Layout, gpu: GPU, a: FailureAssumptions) -> CheckpointCost:
    """Every rank stages its shard to host memory, then one replica's shards stream to storage."""
    size = a.state_bytes_per_param * total_params
    shard = size / (layout.tp * layout.pp * layout.dp_shard)
    blocking = a.save_coordination_s + shard / (gpu.host_copy_gbps * 1e9)
    storage = a.storage_gbps * 1e9
    return CheckpointCost(size_bytes=size, blocking_s=blocking, commit_s=blocking + size / storage,
                          load_s=size * layout.dp_replicate / storage)


def cluster_mtbf_s(gpus: int, mtbf_gpu_hours: float) -> float:
    """Mean time between job interruptions: any one GPU's failure stops a synchronous job."""
    return mtbf_gpu_hours * 3600 / gpus


def young_interval(blocking_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2δM)."""
    return math.sqrt(2 * blocking_s * mtbf_s)


def daly_interval(blocking_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum: √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M."""
    if blocking_s >= 2 * mtbf_s:
        return mtbf_s
    x = blocking_s / (2 * mtbf_s)
    return math.sqrt(2 * blocking_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - blocking_s


def goodput(interval_s: float, blocking_s: float, commit_s: float, restart_s: float, mtbf_s: float) -> float:
    """Share of wall time that becomes kept training progress (closed form in the module docstring)."""
    if commit_s < blocking_s:
        raise ValueError("a checkpoint cannot commit before its blocking part ends (commit_s < blocking_s)")
    m = mtbf_s
    after_failure = m * math.expm1((restart_s + interval_s + commit_s) / m)
    per_commit = -math.expm1(-(interval_s + blocking_s) / m) * (m + after_failure)
    return interval_s / per_commit


def spare_nodes(gpus: int, mtbf_gpu_hours: float, repair_hours: float, confidence: float) -> int:
    """Smallest k with P(Poisson(nodes in repair) ≤ k) ≥ confidence; each failure takes out one node."""
    mean = gpus / mtbf_gpu_hours * repair_hours
    k, term = 0, math.exp(-mean)
    cdf = term
    while cdf < confidence:
        k += 1
        term *= mean / k
        cdf += term
    return k


@dataclass(frozen=True)
class Reliability:
    """Failure and checkpoint figures for one layout; ``goodput`` includes planned maintenance.
    ``checkpoint`` and ``interval_s`` are the storage checkpoints (in the snapshot modes: for disasters);
    ``restart_s`` is the mode's mean restart, ``parts`` what one failure costs, by reason (seconds)."""

    mtbf_s: float
    checkpoint: CheckpointCost
    interval_s: float
    interval_steps: int
    restart_s: float
    goodput: float
    spare_gpus: int
    planned_per_s: float
    recovery: str = "storage"
    snapshot: SnapshotCost | None = None
    parts: tuple[Part, ...] = ()
    disaster_probability: float = 0.0
    replicas: ReplicaCost | None = None

    def interruptions(self, wall_s: float) -> float:
        return wall_s / self.mtbf_s + wall_s * self.planned_per_s

    @property
    def in_smelt(self) -> bool:
        return IN_SMELT[self.recovery]

    @property
    def lost_per_failure_s(self) -> float:
        return sum(p.seconds for p in self.parts)

    def deciding(self, n: int = 3) -> list[Part]:
        """The ``n`` parts that cost the most per failure: the figures that decide this goodput."""
        return sorted(self.parts, key=lambda p: -p.seconds)[:n]

    @property
    def recovery_point(self) -> tuple[float, float, float]:
        """(interval, blocking, commit) of the saves a failure rolls back to, for the simulator."""
        if self.replicas is not None:
            raise ValueError("smelt simulate replays whole-job restarts; replica groups are planned only (smelt plan "
                             "--recovery replicas)")
        if self.snapshot is None:
            return self.interval_s, self.checkpoint.blocking_s, self.checkpoint.commit_s
        return self.snapshot.interval_s, self.snapshot.blocking_s, self.snapshot.commit_s


def _storage_steps(blocking_s: float, commit_s: float, mtbf_s: float, step_s: float) -> int:
    """Daly-optimal interval in whole steps, never before the last save commits."""
    return max(1, round(daly_interval(blocking_s, mtbf_s) / step_s), math.ceil((commit_s - blocking_s) / step_s))


def plan_reliability(gpus: int, total_params: int, layout: Layout, gpu: GPU, step_s: float,
                     a: FailureAssumptions, microbatches: int = 1, overhead: StepOverhead | None = None) -> Reliability:
    """Goodput under ``a.recovery``; storage checkpoints every Daly-optimal interval (against every failure in
    the storage mode, against disasters in the others), rounded to whole steps and never before a save commits.
    ``replicas`` needs the layout's ``microbatches`` per rank and the protocol's step ``overhead`` (in ``step_s``)."""
    mtbf = cluster_mtbf_s(gpus, a.mtbf_gpu_hours)
    ckpt = checkpoint_cost(total_params, layout, gpu, a)
    planned = a.planned_per_day / 86400
    spares = spare_nodes(gpus, a.mtbf_gpu_hours, a.repair_hours, a.spare_confidence)
    relaunch = full_relaunch_s(a.restart_minutes, a.detection_s, a.process_group_init_s)
    if a.recovery == "replicas":
        if overhead is None:
            raise ValueError("replica recovery needs the step overhead of torchft's protocol")
        return _replica_reliability(layout, gpu, step_s, a, mtbf, ckpt, planned, spares, relaunch, microbatches,
                                    overhead)
    if a.recovery == "storage":
        restart = relaunch + ckpt.load_s  # at the default sourced parts, exactly restart_minutes + the load
        steps = _storage_steps(ckpt.blocking_s, ckpt.commit_s, mtbf, step_s)
        tau = steps * step_s
        share = goodput(tau, ckpt.blocking_s, ckpt.commit_s, restart, mtbf)
        saves = mtbf * ckpt.blocking_s / tau
        parts = [*full_relaunch_parts(relaunch, a.detection_s, a.process_group_init_s),
                 Part("storage checkpoint load", ckpt.load_s, "checkpoint size × replicas / storage bandwidth"),
                 Part("storage save blocking", saves, "device→host copy + save coordination"),
                 Part("work redone + failed restarts", mtbf * (1 / share - 1) - restart - saves,
                      "Daly's closed form (module docstring)")]
        share *= max(0.0, 1 - planned * (restart + ckpt.commit_s))  # first order: each planned stop costs R + W
        return Reliability(mtbf_s=mtbf, checkpoint=ckpt, interval_s=tau, interval_steps=steps, restart_s=restart,
                           goodput=share, spare_gpus=spares * gpu.gpus_per_node, planned_per_s=planned,
                           recovery="storage", parts=tuple(parts))

    shard = ckpt.size_bytes / (layout.tp * layout.pp * layout.dp_shard)
    snap = snapshot_cost(shard, gpu, a.snapshot_interval_steps, step_s)
    if a.recovery == "snapshot":
        restart_parts = [*full_relaunch_parts(relaunch, a.detection_s, a.process_group_init_s),
                         Part("restore from peer memory", snap.restore_s,
                              "the rank's shard over the inter-node link, checksummed")]
    else:
        no_spare = spare_shortage_probability(gpus, a.mtbf_gpu_hours, a.repair_hours, spares)
        restart_parts = in_process_parts(a.detection_s, a.process_group_init_s, step_s, snap.restore_s, no_spare,
                                         relaunch)
    restart = sum(p.seconds for p in restart_parts)
    p_disaster = disaster_probability(restart + snap.commit_s, gpu.gpus_per_node, a.mtbf_gpu_hours)
    disaster_mtbf = mtbf / p_disaster if p_disaster > 0 else math.inf
    steps = _storage_steps(ckpt.blocking_s, ckpt.commit_s, disaster_mtbf, step_s) if p_disaster > 0 else 0
    failures = goodput(snap.interval_s, snap.blocking_s, snap.commit_s, restart, mtbf)
    disasters = (goodput(steps * step_s, ckpt.blocking_s, ckpt.commit_s, ckpt.load_s, disaster_mtbf)
                 if p_disaster > 0 else 1.0)
    snapshots = mtbf * snap.blocking_s / snap.interval_s
    parts = [*restart_parts,
             Part("snapshot blocking", snapshots, "the step waiting for a snapshot's copy or replication "
                                                  "(tasks/train/snapshot.py)"),
             Part("work redone + failed restarts", mtbf * (1 / failures - 1) - restart - snapshots,
                  "Daly's closed form with one snapshot per step (module docstring)"),
             Part("storage saves + disasters", mtbf * (1 / (failures * disasters) - 1 / failures),
                  f"a node and its replica peer lost together: p = {p_disaster:.1e} per failure")]
    share = failures * disasters * max(0.0, 1 - planned * (restart + snap.commit_s))
    return Reliability(mtbf_s=mtbf, checkpoint=ckpt, interval_s=steps * step_s, interval_steps=steps,
                       restart_s=restart, goodput=share, spare_gpus=spares * gpu.gpus_per_node, planned_per_s=planned,
                       recovery=a.recovery, snapshot=snap, parts=tuple(parts), disaster_probability=p_disaster)


def _replica_reliability(layout: Layout, gpu: GPU, step_s: float, a: FailureAssumptions, mtbf: float,
                         ckpt: CheckpointCost, planned: float, spares: int, relaunch: float, microbatches: int,
                         overhead: StepOverhead) -> Reliability:
    """``replicas``: each failure costs the cluster ``lost_s`` (infra/replica_recovery.py), so failures, which
    strike in wall time, leave 1 − lost/M of it; storage checkpoints cover every group lost at once (a relaunch of
    all of them and the checkpoint's load), with their interval Daly's against that rarer event. The parts sum to
    M·(1 − goodput): the wall seconds each failure costs."""
    shard = ckpt.size_bytes / (layout.tp * layout.pp * layout.dp_shard)
    cost = replica_cost(layout.dp_replicate, microbatches, step_s, overhead, shard, gpu, relaunch, mtbf,
                        detection_s=a.detection_s, reconfigure_s=a.replica_reconfigure_s)
    p_all = cost.all_lost_probability
    disaster_mtbf = mtbf / p_all if p_all > 0 else math.inf
    steps = _storage_steps(ckpt.blocking_s, ckpt.commit_s, disaster_mtbf, step_s) if p_all > 0 else 0
    failures = max(0.0, 1 - cost.lost_s / mtbf)
    restart = relaunch + ckpt.load_s
    disasters = (goodput(steps * step_s, ckpt.blocking_s, ckpt.commit_s, restart, disaster_mtbf)
                 if p_all > 0 else 1.0)
    parts = [*cost.parts(),
             Part("storage saves + every group lost", mtbf * failures * (1 - disasters),
                  f"every other group failing before the first is back: p = {p_all:.1e} per failure; then a "
                  "relaunch of all and the storage checkpoint's load (Daly's closed form)")]
    share = failures * disasters * max(0.0, 1 - planned * cost.lost_s)  # a planned stop taken one group at a time
    return Reliability(mtbf_s=mtbf, checkpoint=ckpt, interval_s=steps * step_s, interval_steps=steps,
                       restart_s=cost.away_s, goodput=share, spare_gpus=spares * gpu.gpus_per_node,
                       planned_per_s=planned, recovery="replicas", parts=tuple(parts), disaster_probability=p_all,
                       replicas=cost)
