"""Replica-group recovery (``--recovery replicas``): what a failure and a step cost when ``dp_replicate`` groups
step together through torchft (tasks/train/replicas.py, tasks/train/replica_group.py).

Why its own model: with G groups a failure stops one group, not the job. The other groups stall only until they
have given the lost group up, then keep stepping at the same global batch, each taking over part of the lost
group's micro-batches, so a step takes ``slowdown`` times as long until the group is back (G/(G−1) when the
micro-batches divide evenly). In return every step pays torchft's protocol: a quorum, a cross-group all-reduce
done by the Manager after the backward pass (not fused with FSDP's reduce-scatter) and a commit vote.

One failure, seen from the cluster (figures and sources in infra/replica_figures.py):

- **before it**: the step it interrupts is discarded by the commit vote; on average half a step of work was done;
- **stall** (no group makes progress): the rest of that step, until the survivors reach the cross-group
  all-reduce (half a step on average), + detection there (the Manager's timeout, or the dead-peer timeout if
  sooner; a hung group keeps heartbeating, so its quorum also waits the Lighthouse's join timeout) + the
  cross-group process group rebuilt for the new quorum (an assumption);
- **away** (the survivors step at 1/slowdown of the rate): the failed group's own detection, relaunch (the full
  relaunch of recovery.py, charged whole though only one group restarts) and heal (its model + optimizer shard
  from a live peer over the inter-node link, an upper-bound rate as for snapshots), then one survivors' step until
  the next quorum takes it in. Of the away time after the stall, ``1 − 1/slowdown`` is lost.

So a failure costs ``step/2 + stall + max(0, away − stall)·(1 − 1/slowdown)`` seconds of the whole cluster, and
with cluster MTBF M the failures leave ``1 − lost/M`` of the wall time. Every group lost at once (each of the
other G−1 fails before the first is back, probability ``(1 − e^{−away/(G·M)})^{G−1}`` per failure) is a disaster:
a relaunch from the newest storage checkpoint (smelt's replica groups keep one; the in-memory snapshots are not
wired to replica groups), handled as recovery.py's disasters are (infra/reliability.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.recovery import Part
from infra.recovery_figures import DEAD_PEER_DETECTION_S, DETECTION_S, HANG_SHARE
from infra.replica_figures import ALLREDUCE_BYTES_PER_PARAM, ALLREDUCE_LINK, COMMIT_S, CROSS_GROUP_TIMEOUT_S, \
    HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S, QUORUM_S, RECONFIGURE_S

REPLICA_GROUP_COUNTS = (2, 4, 8, 16, 32, 64)  # the group counts the planner's search tries (dp_replicate)


@dataclass(frozen=True)
class StepOverhead:
    """Seconds torchft's protocol adds to every step, none of it hidden behind compute in smelt's groups."""

    quorum_s: float
    allreduce_s: float
    commit_s: float

    @property
    def total(self) -> float:
        return self.quorum_s + self.allreduce_s + self.commit_s

    def parts(self, link_gbps: float) -> list[Part]:
        return [Part("quorum", self.quorum_s, QUORUM_S.source),
                Part("cross-group all-reduce", self.allreduce_s,
                     f"{ALLREDUCE_BYTES_PER_PARAM.source}; ring 2(G−1)/G of the gradient shard at {link_gbps:g} GB/s: "
                     f"{ALLREDUCE_LINK}"),
                Part("commit vote", self.commit_s, COMMIT_S.source)]


def step_overhead(grad_params_per_rank: float, groups: int, link_gbps: float) -> StepOverhead:
    """The protocol's seconds per step for a rank whose gradient shard has ``grad_params_per_rank`` elements."""
    if groups < 2 or link_gbps <= 0:
        raise ValueError("replica groups need at least 2 groups and a positive all-reduce rate")
    ring = 2 * (groups - 1) / groups
    allreduce = ALLREDUCE_BYTES_PER_PARAM.value * grad_params_per_rank * ring / (link_gbps * 1e9)
    return StepOverhead(quorum_s=QUORUM_S.value, allreduce_s=allreduce, commit_s=COMMIT_S.value)


def slowdown(groups: int, microbatches: int) -> float:
    """A step's length with one group away over its length without: the global batch is ``groups × microbatches``
    micro-batches (per rank position), and the busiest of the ``groups − 1`` survivors takes the ceiling of their
    even share (tasks/train/replica_group.py batch_shares deals them out contiguously)."""
    if groups < 2 or microbatches < 1:
        raise ValueError("slowdown needs at least 2 groups and 1 micro-batch per rank")
    return math.ceil(groups * microbatches / (groups - 1)) / microbatches


def survivor_detection_s(timeout_s: float = CROSS_GROUP_TIMEOUT_S.value) -> float:
    """Mean seconds the survivors wait at the cross-group all-reduce before the next quorum leaves the lost group
    out: a dead group is seen at the dead-peer timeout or the Manager's timeout, whichever is first, and never
    before the Lighthouse stops counting its heartbeats; a hung group still heartbeats, so after the timeout the
    quorum waits the join timeout for it (HANG_SHARE of failures, as for every mode)."""
    dead = max(min(DEAD_PEER_DETECTION_S.value, timeout_s), HEARTBEAT_TIMEOUT_S.value)
    hung = timeout_s + JOIN_TIMEOUT_S.value
    return (1 - HANG_SHARE.value) * dead + HANG_SHARE.value * hung


@dataclass(frozen=True)
class ReplicaCost:
    """One layout's replica groups: the step overhead, and what a failure costs, by reason (seconds)."""

    groups: int
    microbatches: int
    step_s: float  # with the overhead
    overhead: StepOverhead
    slowdown: float
    before_s: float  # the interrupted step's work done before the failure
    stall: tuple[Part, ...]  # no group steps
    away: tuple[Part, ...]  # the failed group is away (from the failure on)
    all_lost_probability: float

    @property
    def stall_s(self) -> float:
        return sum(p.seconds for p in self.stall)

    @property
    def away_s(self) -> float:
        return sum(p.seconds for p in self.away)

    @property
    def away_loss_s(self) -> float:
        """The survivors' lost rate over the away time that follows the stall."""
        return max(0.0, self.away_s - self.stall_s) * (1 - 1 / self.slowdown)

    @property
    def lost_s(self) -> float:
        return self.before_s + self.stall_s + self.away_loss_s

    def parts(self) -> list[Part]:
        """What one failure costs the whole cluster, by reason."""
        away = ", ".join(f"{p.name} {p.seconds:,.1f} s" for p in self.away)
        return [Part("interrupted step, work before the failure", self.before_s,
                     "half a step on average; the commit vote discards the step (tasks/train/replica_group.py)"),
                *self.stall,
                Part(f"failed group away {self.away_s:,.0f} s: survivors at 1/{self.slowdown:.3g} speed",
                     self.away_loss_s, f"(away − stall)·(1 − 1/slowdown); away = {away}")]


def replica_cost(groups: int, microbatches: int, step_s: float, overhead: StepOverhead, state_bytes_per_rank: float,
                 gpu: GPU, relaunch_s: float, mtbf_s: float, detection_s: float = DETECTION_S.value,
                 reconfigure_s: float = RECONFIGURE_S.value,
                 timeout_s: float = CROSS_GROUP_TIMEOUT_S.value) -> ReplicaCost:
    """The cost model of the module docstring for one layout: ``step_s`` is the fault-free step with the
    protocol's ``overhead``, ``state_bytes_per_rank`` what healing moves to each rank, ``relaunch_s`` the failed
    group's relaunch, ``detection_s`` its own ranks' detection, ``mtbf_s`` the cluster's MTBF."""
    factor = slowdown(groups, microbatches)
    stall = (Part("survivors: rest of the interrupted step", step_s / 2,
                  "half a step on average until the cross-group all-reduce"),
             Part("survivors: lost group detected", survivor_detection_s(timeout_s),
                  f"{CROSS_GROUP_TIMEOUT_S.source}; {HEARTBEAT_TIMEOUT_S.source}; {JOIN_TIMEOUT_S.source} (hangs, "
                  f"{HANG_SHARE.value:.1%} of failures); the dead-peer timeout: {DEAD_PEER_DETECTION_S.source}"),
             Part("survivors: new quorum, cross-group group rebuilt", reconfigure_s + overhead.quorum_s,
                  RECONFIGURE_S.source))
    away = (Part("detection", detection_s, DETECTION_S.source),
            Part("relaunch", relaunch_s, "the full relaunch of infra/recovery.py, for one group"),
            Part("heal from a live peer", state_bytes_per_rank / (gpu.internode_gbps * 1e9),
                 "the rank's model + optimizer shard over the inter-node link (torchft's checkpoint transport; an "
                 "upper-bound rate, not measured on a cluster)"),
            Part("wait for the next quorum", step_s * factor, "one survivors' step"))
    away_s = sum(p.seconds for p in away)
    p_all = (-math.expm1(-away_s / (groups * mtbf_s))) ** (groups - 1)
    return ReplicaCost(groups=groups, microbatches=microbatches, step_s=step_s, overhead=overhead, slowdown=factor,
                       before_s=step_s / 2, stall=stall, away=away, all_lost_probability=p_all)
