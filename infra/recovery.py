"""Recovery modes: what one failure costs, by how the job comes back.

Why: at 4,096 GPUs and a cluster MTBF of two hours, goodput is decided by the seconds each failure costs, and
those depend on what the trainer restores and which processes it restarts. Three modes, each a sum of named
parts whose figures (and sources) live in infra/recovery_figures.py; infra/reliability.py turns a mode's
restart and recovery point into goodput.

- ``storage``: every rank relaunched by torchrun, the newest storage (DCP) checkpoint loaded, and on average
  half a storage interval redone (smelt's trainer before snapshots).
- ``snapshot`` (default; what smelt's trainer does): the same full relaunch, then each rank restores the newest
  step held in its own node's memory or a peer's, so at most one step is redone. Storage checkpoints remain for
  disasters: a node lost together with the node holding its replica before the state is replicated again. It
  assumes the relaunched job keeps its surviving nodes and their /dev/shm (torchrun's in-job restarts do; a Slurm
  requeue onto other nodes would fall back to storage, which is not counted).
- ``in-process``: the healthy ranks keep their processes, CUDA contexts and model; they abort the process group,
  rendezvous with a spare node that was waiting, rebuild the group and restore from memory (nvidia-resiliency-ext's
  in-process restart). NOT YET IN SMELT'S TRAINER: every output names it so.
- ``replicas``: ``dp_replicate`` fault-tolerant replica groups on torchft: only the failed group restarts and heals
  from a live peer while the others keep stepping (infra/replica_recovery.py). On one host only so far: every
  output names it so.

A full relaunch is the planner's flat ``restart_minutes`` (10 minutes, unsourced, as before), of which the sourced
parts are named (detection, process start and imports, model build, process-group init) and the rest is labelled
unsourced. Changing a sourced part (``detection_s``, ``process_group_init_s``) moves the total with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.recovery_figures import ABORT_S, CHECKSUM_GBPS, DETECTION_S, DRAIN_STEPS, FULL_RELAUNCH_S, \
    LAST_CALL_WAIT_S, MODEL_BUILD_S, PROCESS_GROUP_INIT_S, RANK_ASSIGNMENT_S, SHM_WRITE_GBPS, START_AND_IMPORT_S, \
    STORE_BARRIER_S

RECOVERY_MODES = ("storage", "snapshot", "in-process", "replicas")
DEFAULT_RECOVERY = "snapshot"
IN_SMELT = {"storage": True, "snapshot": True, "in-process": False, "replicas": False}
NOT_IN_SMELT = "smelt's agent does it on one node; cluster launches still restart through torchrun"
NOT_IN_SMELT_REPLICAS = ("smelt runs replica groups on one host, on CPU and gloo; smelt launch slurm|kubernetes does "
                         "not start them yet")
GAPS = {"in-process": NOT_IN_SMELT, "replicas": NOT_IN_SMELT_REPLICAS}
# the sourced parts of today's flat relaunch, at their defaults; the rest of restart_minutes is unsourced
_SOURCED_RELAUNCH_S = DETECTION_S.value + START_AND_IMPORT_S.value + MODEL_BUILD_S.value + PROCESS_GROUP_INIT_S.value


def describe(mode: str) -> str:
    """The mode's name as every output prints it: in-process always carries its warning."""
    return mode if IN_SMELT[mode] else f"{mode} ({GAPS[mode]})"


@dataclass(frozen=True)
class Part:
    """Seconds one failure costs for one reason, and where the figure comes from."""

    name: str
    seconds: float
    source: str


@dataclass(frozen=True)
class SnapshotCost:
    bytes_per_rank: float  # the rank's model and optimizer shard
    interval_s: float  # training between two snapshots
    copy_s: float  # device → host → the node store (/dev/shm), hashed on the way, in a background thread
    replicate_s: float  # to the peer node, checksum verified there
    blocking_s: float  # δ: what the step waits (the copy running past the next optimizer step, or the snapshot
    #                    still replicating when the next one is due)
    commit_s: float  # W: snapshot start → acknowledged by the peer (only then does it count)
    restore_s: float  # the slowest rank at restart: its shard from the peer node, verified, onto the device


def snapshot_cost(shard_bytes: float, gpu: GPU, interval_steps: int, step_s: float) -> SnapshotCost:
    """A snapshot every ``interval_steps``, as tasks/train/snapshot.py takes it: the trainer waits for the copy
    before the next optimizer step, and each snapshot for the previous one. The replica travels over a gloo (TCP)
    group, charged here at the GPU's own inter-node rate (an upper bound: not measured on a cluster); the thread's
    CPU and memory-bandwidth contention with the step is not modelled."""
    copy = shard_bytes * (1 / (gpu.host_copy_gbps * 1e9) + 1 / (SHM_WRITE_GBPS.value * 1e9)
                          + 1 / (CHECKSUM_GBPS.value * 1e9))
    replicate = shard_bytes * (1 / (gpu.internode_gbps * 1e9) + 1 / (CHECKSUM_GBPS.value * 1e9))
    interval = interval_steps * step_s
    blocking = max(0.0, copy - step_s, copy + replicate - interval)
    restore = shard_bytes * (1 / (gpu.internode_gbps * 1e9) + 1 / (CHECKSUM_GBPS.value * 1e9)
                             + 1 / (gpu.host_copy_gbps * 1e9))
    return SnapshotCost(bytes_per_rank=shard_bytes, interval_s=interval, copy_s=copy, replicate_s=replicate,
                        blocking_s=blocking, commit_s=copy + replicate, restore_s=restore)


def full_relaunch_s(restart_minutes: float, detection_s: float, process_group_init_s: float) -> float:
    """Seconds of a torchrun relaunch of every rank: ``restart_minutes`` as it was charged before, moved by any
    change of its sourced parts from their defaults (exactly ``restart_minutes`` at the defaults)."""
    return max(0.0, restart_minutes * 60 + (detection_s - DETECTION_S.value)
               + (process_group_init_s - PROCESS_GROUP_INIT_S.value))


def full_relaunch_parts(relaunch_s: float, detection_s: float, process_group_init_s: float) -> list[Part]:
    """The relaunch split into its sourced parts and the unsourced rest (one part when the sourced ones exceed it)."""
    sourced = [Part("detection", detection_s, DETECTION_S.source),
                Part("process start + imports", START_AND_IMPORT_S.value, START_AND_IMPORT_S.source),
                Part("model build", MODEL_BUILD_S.value, MODEL_BUILD_S.source),
                Part("process-group (NCCL) init", process_group_init_s, PROCESS_GROUP_INIT_S.source)]
    rest = relaunch_s - sum(p.seconds for p in sourced)
    if rest < 0:
        return [Part("full relaunch (--restart-minutes)", relaunch_s, FULL_RELAUNCH_S.source)]
    return sourced + [Part("relaunch rest, unsourced", rest,
                           f"{FULL_RELAUNCH_S.source}; what its sourced parts leave: node replacement, CUDA init, "
                           "sharding and materialising, the first step's warm-up")]


def in_process_parts(detection_s: float, process_group_init_s: float, step_s: float, restore_s: float,
                     no_spare_p: float, relaunch_s: float) -> list[Part]:
    """Keep the healthy ranks: detect, abort, drain, re-rendezvous with a waiting spare, rebuild the group and
    (as smelt's agent does, tasks/train/agent.py) the trainer, restore. Without a free spare node (probability ``no_spare_p``) the job falls back to a full relaunch."""
    parts = [Part("detection", detection_s, DETECTION_S.source),
             Part("abort process group", ABORT_S.value, ABORT_S.source),
             Part("drain pending kernels", DRAIN_STEPS.value * step_s, DRAIN_STEPS.source),
             Part("wait for other faults", LAST_CALL_WAIT_S.value, LAST_CALL_WAIT_S.source),
             Part("rank assignment + barrier", RANK_ASSIGNMENT_S.value + STORE_BARRIER_S.value,
                  f"{RANK_ASSIGNMENT_S.source}; {STORE_BARRIER_S.source}"),
             Part("process-group (NCCL) init", process_group_init_s, PROCESS_GROUP_INIT_S.source),
             Part("model rebuild (smelt's agent rebuilds the trainer in process)", MODEL_BUILD_S.value,
                  MODEL_BUILD_S.source),
             Part("restore from peer memory", restore_s, "the rank's shard over the inter-node link, checksummed")]
    quick = sum(p.seconds for p in parts)
    fallback = no_spare_p * max(0.0, relaunch_s + restore_s - quick)
    return parts + [Part("no free spare: full relaunch", fallback,
                         f"P = {no_spare_p:.3f} that every spare node is in repair (Poisson, as the spares)")]


def disaster_probability(window_s: float, gpus_per_node: int, mtbf_gpu_hours: float) -> float:
    """P(the node holding a lost node's replica fails too before the state is replicated again), with each
    node failing independently at ``gpus_per_node / mtbf_gpu_hours``. Correlated losses (a switch or power
    domain taking out both) are not modelled: place replicas in another rack."""
    node_rate_per_s = gpus_per_node / (mtbf_gpu_hours * 3600)
    return -math.expm1(-node_rate_per_s * window_s)


def spare_shortage_probability(gpus: int, mtbf_gpu_hours: float, repair_hours: float, spare_nodes: int) -> float:
    """P(Poisson(nodes in repair) ≥ ``spare_nodes``): a failure finds every spare node already in use."""
    mean = gpus / mtbf_gpu_hours * repair_hours
    term = math.exp(-mean)
    below = 0.0
    for k in range(spare_nodes):
        below += term
        term *= mean / (k + 1)
    return max(0.0, 1.0 - below)
