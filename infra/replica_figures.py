"""The numbers behind replica-group recovery (infra/replica_recovery.py), each with where it comes from.

Why a module of its own: the replica mode's failure cost is a sum of torchft's own timeouts, smelt's settings of
them, a few seconds measured here and one assumption; keeping them apart from infra/recovery_figures.py (whose
``Figure`` they reuse) keeps each list short. ``verified=False`` marks what was not read or measured at the
scale the planner uses it; ``ASSUMED`` names the figures that have no source at all: each is a planner
parameter (``FailureAssumptions``, a ``smelt plan`` option) so that a measured value can replace it.

torchft 0.2.0 is the version smelt pins (tasks/train/replicas.py); its defaults were read in pytorch/torchft at
73dafea (2025-10-21): src/lighthouse.rs ``LighthouseOpt``, torchft/manager.py ``Manager.__init__``.
"""

from __future__ import annotations

from infra.recovery_figures import Figure

# smelt's [train.ft] defaults (tasks/train/config.py ReplicaConfig; tests/infra/test_replica_recovery.py holds the
# two in step): how soon the survivors give up on a lost group.
CROSS_GROUP_TIMEOUT_S = Figure(30.0, "s", "smelt: tasks/train/config.py ReplicaConfig.timeout_s (torchft Manager "
                                          "timeout for the cross-group all-reduce, commit vote and healing; torchft's "
                                          "own default is 60 s, torchft/manager.py)")
HEARTBEAT_TIMEOUT_S = Figure(1.0, "s", "smelt: ReplicaConfig.heartbeat_timeout_ms = 1000, passed to the Lighthouse's "
                                       "--heartbeat_timeout_ms (torchft's default 5000, src/lighthouse.rs): a group "
                                       "silent this long leaves the quorum")
JOIN_TIMEOUT_S = Figure(1.0, "s", "smelt: ReplicaConfig.join_timeout_ms = 1000, the Lighthouse's --join_timeout_ms "
                                  "(torchft's default 60000, src/lighthouse.rs quorum_compute: a valid quorum waits "
                                  "this long for heartbeating groups that have not joined, e.g. a hung one)")

# Per step, measured here: bench/replica_overhead.py (two one-rank groups on 127.0.0.1, torchft 0.2.0, smelt's
# Manager settings; medians over the steps after 10 of warm-up, three runs of 40, 60 and 60 steps at load average 6.7-7.4 on 2 cores).
QUORUM_S = Figure(0.0019, "s", "measured here: `python bench/replica_overhead.py` quorum_s 2.06, 1.84, 1.71 ms (a "
                               "synchronous quorum, as tasks/train/replica_group.py asks for it: use_async_quorum="
                               "False); one rank per group on loopback: a group of thousands of ranks, each asking its "
                               "group's manager server, over a data-centre network, was not measured", verified=False)
COMMIT_S = Figure(0.00065, "s", "measured here: `python bench/replica_overhead.py` commit_s 0.73, 0.60, 0.61 ms "
                                "(Manager.should_commit, the commit vote); same caveat as the quorum", verified=False)
# What each rank all-reduces across groups, per parameter of its shard: replica_group.ReplicaGroup._allreduce
# concatenates every gradient and the loss into one flat float32 tensor after the backward pass (not overlapped).
ALLREDUCE_BYTES_PER_PARAM = Figure(4.0, "B", "smelt: tasks/train/replica_group.py ReplicaGroup._allreduce (one flat "
                                             "float32 all-reduce through torchft's Manager after backward)")

# No source: assumptions, each a planner parameter.
RECONFIGURE_S = Figure(10.0, "s", "ASSUMPTION, no source: torchft's Manager rebuilding the cross-group process group "
                                  "for a new quorum (a communicator of one rank per group, every rank of a group at "
                                  "once; on 127.0.0.1 with gloo it is part of the chaos harness's pause, not "
                                  "measured apart); --replica-reconfigure-seconds", verified=False)
ALLREDUCE_LINK = ("ASSUMPTION: the cross-group all-reduce runs at the GPU's inter-node rate (infra/catalogue.py "
                  "internode_gbps), as torchft's ProcessGroupNCCL over InfiniBand would; smelt's replica groups use "
                  "ProcessGroupGloo on CPU today (tasks/train/replica_group.py), 0.8-1.0 GB/s on loopback here "
                  "(bench/replica_overhead.py allreduce_gbps); --replica-allreduce-gbps")

# Published end-to-end figures the model is compared with, not summed into it.
CLOCKWORK_TORCHFT_MIN = Figure(930.0, "min", "Clockwork, 'Keeping Distributed Training Running Through Failures' "
                                             "(clockwork.io blog): TorchTitan Llama-4 Scout (109B) on 64 H200s, 3,000 "
                                             "steps with a failure every 2,700-4,500 s: TorchFT 930 min, checkpoint "
                                             "restart 818, TorchPass 405; torchft 'lost almost no time due to the "
                                             "failures' but was slower per step (its gloo all-reduce, per Clockwork's "
                                             "'A Comparison Between TorchFT and TorchPass'); and its lost group's "
                                             "samples were skipped, which smelt's groups take over instead")
TORCHFT_CRUSOE_FAILURES = Figure(1200.0, "failures", "PyTorch blog 'Fault Tolerant Llama training' (2025-06, torchft + "
                                                     "torchtitan on Crusoe L40S): training loss across 1,200 failures "
                                                     "with no checkpoints; no seconds per failure are given")

USED = {"cross_group_timeout_s": CROSS_GROUP_TIMEOUT_S, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "join_timeout_s": JOIN_TIMEOUT_S, "quorum_s": QUORUM_S, "commit_s": COMMIT_S,
        "allreduce_bytes_per_param": ALLREDUCE_BYTES_PER_PARAM, "reconfigure_s": RECONFIGURE_S}
ASSUMED = {"reconfigure_s": RECONFIGURE_S}
COMPARED = {"clockwork_torchft_min": CLOCKWORK_TORCHFT_MIN, "torchft_crusoe_failures": TORCHFT_CRUSOE_FAILURES}
