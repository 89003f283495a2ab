"""The numbers behind recovery: each a named figure with where it comes from.

Why a module of its own: the recovery modes (infra/recovery.py) are only as good as these figures, and a
figure nobody can trace is a guess. Each ``Figure`` says its source (document and figure/table/section, a file
in a public repository, or a command run on this repository's machine) and whether that source was read here
(``verified``). Unverified figures are flagged so that nobody takes them for measurements. The planner sums
two of them: ``FULL_RELAUNCH_S`` (the flat 10 minutes it charged before this module existed, kept so the
storage mode reproduces those plans) and ``HANG_SHARE`` (Llama 3's Table 5, read in reproductions).

Sizes and bandwidths that depend on the layout or the GPU (a rank's model+optimizer shard; the device→host
copy and the inter-node link, ``GPU.host_copy_gbps`` and ``GPU.internode_gbps`` = 50 GB/s, 400 Gb/s
InfiniBand per H100) come from infra/catalogue.py and infra/reliability.py, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str
    verified: bool = True  # False: read secondhand, or at another scale than the planner uses it


# Detection. A rank whose peer node vanished learns it from its InfiniBand queue pair: NCCL's defaults
# (NCCL_IB_TIMEOUT=20, NCCL_IB_RETRY_CNT=7) make one try 4.096 µs·2^20 = 4.3 s and give up after 1 + 7 tries.
NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT = 20, 7
DEAD_PEER_DETECTION_S = Figure(
    4.096e-6 * 2**NCCL_IB_TIMEOUT * (1 + NCCL_IB_RETRY_CNT), "s",
    "NVIDIA/nccl src/transport/net_ib.cc: NCCL_PARAM(IbTimeout, 20), NCCL_PARAM(IbRetryCnt, 7); one try lasts "
    "4.096 µs·2^timeout (the InfiniBand local ACK timeout, as NCCL's NCCL_IB_TIMEOUT documentation states)")
HANG_TIMEOUT_S = Figure(600.0, "s", "smelt: tasks/train/config.py WatchdogConfig.hang_timeout_s (a hang restarts "
                                    "after this long without a finished step)")
HANG_SHARE = Figure(7 / 419, "of failures",
                    "Llama 3 paper (2024), §3.3.4 Table 5: 7 of 419 unexpected interruptions were 'NCCL watchdog "
                    "timeouts' (read in its reproductions by glennklockwood.com and Tom's Hardware, not the PDF)",
                    verified=False)
DETECTION_S = Figure(
    (1 - HANG_SHARE.value) * DEAD_PEER_DETECTION_S.value + HANG_SHARE.value * HANG_TIMEOUT_S.value, "s",
    "mean: hangs wait for smelt's watchdog, every other failure for the dead-peer timeout (a crashed process is "
    "seen sooner: torchrun polls its workers every 0.1 s, torch/distributed/run.py --monitor-interval)")

# Full relaunch: every rank killed and started again by torchrun (what smelt's trainer does).
FULL_RELAUNCH_S = Figure(600.0, "s", "smelt's planner before recovery modes: 10 minutes to detect, swap in a spare "
                                    "node, relaunch and rendezvous; no source", verified=False)
START_AND_IMPORT_S = Figure(5.6, "s", "measured here (2-core AMD EPYC, local disk, warm cache), median of 3: "
                                      "`time .venv/bin/python -c 'import tasks.train.trainer'`; a cluster's shared "
                                      "file system at 4,096 processes is slower (not measured)")
MODEL_BUILD_S = Figure(1.9, "s", "measured here: the 70B preset built on the meta device, first build in the process "
                                 "(`with torch.device('meta'): Transformer(preset('70b'))`); sharding and "
                                 "materialising on 4,096 GPUs not measured")
PROCESS_GROUP_INIT_S = Figure(150.0, "s",
                              "NVIDIA/nccl issue #1156 (PyTorch, 2024-01-23): '2.5-minute init time at large scale "
                              "(above certain K GPUs)', at launch or restart; no figure at 4,096 GPUs was found")
TCPSTORE_INIT_96K_S = Figure(100.0, "s", "PyTorch tutorial 'Introduction to Libuv TCPStore Backend' (pytorch/tutorials "
                                         "intermediate_source/TCPStore_libuv_backend.rst): 96K ranks connect in 100 s; "
                                         "an upper bound at 4,096 ranks, not added to the sums")

# In-process restart (nvidia-resiliency-ext's Wrapper): the processes, CUDA contexts and model stay.
NVRX = "NVIDIA/nvidia-resiliency-ext docs/source/inprocess/usage_guide.rst, 'Restart latency' table"
ABORT_S = Figure(0.5, "s", f"{NVRX}: torch.distributed.destroy_process_group() ~0.5 s")
DRAIN_STEPS = Figure(1.0, "steps", f"{NVRX}: complete pending CUDA kernels ~ one training iteration")
LAST_CALL_WAIT_S = Figure(1.0, "s", "nvidia-resiliency-ext src/nvidia_resiliency_ext/inprocess/wrap.py: Wrapper "
                                    "default last_call_wait (waits for concurrent faults)")
RANK_ASSIGNMENT_S = Figure(0.5, "s", f"{NVRX}: rank_assignment ~0.5 s")
STORE_BARRIER_S = Figure(0.5, "s", f"{NVRX}: TCPStore-based barrier 0.5 s at 16K ranks")

# Snapshots (tasks/train/snapshot.py): a background thread writes each tensor into the node store (/dev/shm) while
# hashing it (xxh3_128), then sends the file to a peer node over a gloo group, which verifies and acknowledges it.
SHM_WRITE_GBPS = Figure(2.3, "GB/s", "measured here, one thread, 256 MiB into /dev/shm (2.25 and 2.31 in two warm "
                                     "runs, 0.62 cold): `python -c \"import os,time; b=os.urandom(256<<20); "
                                     "t=time.perf_counter(); open('/dev/shm/x','wb').write(b); "
                                     "print(len(b)/(time.perf_counter()-t)/1e9)\"`; a server's memory is faster")
CHECKSUM_GBPS = Figure(22.7, "GB/s", "measured here, one core, 256 MiB: `python -c \"import os,time,xxhash; "
                                     "b=os.urandom(256<<20); t=time.perf_counter(); xxhash.xxh3_128(b).digest(); "
                                     "print(len(b)/(time.perf_counter()-t)/1e9)\"` (22.9 and 22.6 in two runs)")

# Published end-to-end figures the model is compared with, not summed into it.
FLASHRECOVERY_S = Figure(150.0, "s", "FlashRecovery (arXiv 2509.03047), abstract: training restored on 4,800 devices in "
                                     "150 s, at most one step lost, recovery time nearly constant with scale")
MEGASCALE_INIT_S = Figure(30.0, "s", "MegaScale (NSDI'24): job initialisation under 30 s beyond 10,000 GPUs after its "
                                     "optimisations (1,047 s → under 5 s at 2,048 GPUs); read secondhand, not in the "
                                     "paper", verified=False)
GEMINI_SPEEDUP = Figure(13.0, "×", "Gemini (SOSP'23): in-memory checkpoints in local and remote CPU memory recover "
                                   "13× faster than from remote storage (read in micahlerner.com's summary)",
                        verified=False)
BYTEROBUST_ETTR = Figure(0.97, "of wall time", "ByteRobust (arXiv 2509.16293), abstract: 97% effective training time "
                                               "ratio over a three-month job on 9,600 GPUs")
META_RSC_MTTF_H = Figure(1.8, "h", "Kokolis et al., 'Revisiting Reliability in Large-Scale ML Research Clusters' "
                                   "(HPCA'25): projected job MTTF 7.9 h at 1,024 GPUs and 1.8 h at 16,384; from the "
                                   "brief, not read here", verified=False)

USED = {  # the figures the recovery modes sum, by name (README, plan --json)
    "detection_s": DETECTION_S, "dead_peer_detection_s": DEAD_PEER_DETECTION_S, "hang_timeout_s": HANG_TIMEOUT_S,
    "hang_share": HANG_SHARE, "full_relaunch_s": FULL_RELAUNCH_S, "start_and_import_s": START_AND_IMPORT_S,
    "model_build_s": MODEL_BUILD_S, "process_group_init_s": PROCESS_GROUP_INIT_S, "abort_s": ABORT_S,
    "drain_steps": DRAIN_STEPS, "last_call_wait_s": LAST_CALL_WAIT_S, "rank_assignment_s": RANK_ASSIGNMENT_S,
    "store_barrier_s": STORE_BARRIER_S, "checksum_gbps": CHECKSUM_GBPS, "shm_write_gbps": SHM_WRITE_GBPS,
}
COMPARED = {"flashrecovery_s": FLASHRECOVERY_S, "megascale_init_s": MEGASCALE_INIT_S, "gemini_speedup": GEMINI_SPEEDUP,
            "byterobust_ettr": BYTEROBUST_ETTR, "meta_rsc_mttf_h": META_RSC_MTTF_H,
            "tcpstore_init_96k_s": TCPSTORE_INIT_96K_S}
