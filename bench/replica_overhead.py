"""What torchft's per-step protocol costs a replica group's step, measured on 127.0.0.1 (infra/replica_figures.py).

Two one-rank replica groups, each a process with torchft 0.2.0's Manager built as tasks/train/replica_group.py
builds it (ProcessGroupGloo, synchronous quorum, smelt's ``[train.ft]`` defaults), joined by torchft's
Lighthouse (tasks/train/replicas.Lighthouse). Each step, as ``ReplicaGroup.step`` does it: the quorum
(``start_quorum``), one flat float64 all-reduce of ``--numel`` elements through the Manager, the commit vote
(``should_commit``). No model: only the protocol's own seconds. Medians over the steps after ``--warmup``:

- ``quorum_s``: the quorum round trip (rank → its group's manager server → Lighthouse → back), the groups
  already in step; ``commit_s``: the commit vote; ``allreduce_s`` and its ``allreduce_gbps`` (bytes / s, gloo
  over loopback TCP: not a cluster's network).

Prints one JSON line. Usage: ``python bench/replica_overhead.py [--steps 60] [--numel 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.train.config import ReplicaConfig  # noqa: E402
from tasks.train.node_launch import free_port  # noqa: E402
from tasks.train.replicas import Lighthouse  # noqa: E402


def group(replica_id: int, lighthouse: str, steps: int, numel: int, out: "mp.Queue") -> None:
    """One replica group of one rank: ``steps`` protocol rounds; puts its per-step timings on ``out``."""
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port()), "TORCHFT_LIGHTHOUSE": lighthouse})
    import torch
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    from torchft import Manager, ProcessGroupGloo

    ft = ReplicaConfig(enabled=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=ft.timeout_s))
    state = {"w": torch.zeros(4)}
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=ft.timeout_s)),
                      load_state_dict=lambda s: state.update(s), state_dict=lambda: dict(state),
                      min_replica_size=2, use_async_quorum=False, replica_id=f"bench_{replica_id}",
                      timeout=timedelta(seconds=ft.timeout_s), quorum_timeout=timedelta(seconds=ft.quorum_timeout_s),
                      connect_timeout=timedelta(seconds=ft.timeout_s),
                      heartbeat_interval=timedelta(milliseconds=max(10, ft.heartbeat_timeout_ms // 5)),
                      init_sync=False, quorum_retries=ft.quorum_retries)
    flat = torch.ones(numel, dtype=torch.float64)
    rows = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            manager.start_quorum()
            t1 = time.perf_counter()
            manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            t2 = time.perf_counter()
            committed = manager.should_commit()
            t3 = time.perf_counter()
            rows.append({"quorum_s": t1 - t0, "allreduce_s": t2 - t1, "commit_s": t3 - t2, "committed": committed,
                         "participants": manager.num_participants()})
        out.put((replica_id, rows))
    finally:
        manager.shutdown(wait=False)
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--numel", type=int, default=1_000_000)
    args = parser.parse_args()
    lighthouse = Lighthouse(ReplicaConfig(enabled=True, min_replicas=2))
    lighthouse.start()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=group, args=(i, lighthouse.address, args.steps, args.numel, out)) for i in range(2)]
    try:
        for p in procs:
            p.start()
        results = dict(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        lighthouse.stop()
    rows = [r for i in sorted(results) for r in results[i][args.warmup:]]
    if not all(r["committed"] and r["participants"] == 2 for r in rows):
        raise SystemExit("a step was not committed by both groups; the timings would not be the steady state")
    med = {k: statistics.median(r[k] for r in rows) for k in ("quorum_s", "allreduce_s", "commit_s")}
    print(json.dumps({"groups": 2, "ranks_per_group": 1, "steps": args.steps, "warmup": args.warmup,
                      "numel": args.numel, "bytes": args.numel * 8,
                      **{k: round(v, 6) for k, v in med.items()},
                      "allreduce_gbps": round(args.numel * 8 / med["allreduce_s"] / 1e9, 3),
                      "quorum_p90_s": round(statistics.quantiles([r["quorum_s"] for r in rows], n=10)[-1], 6),
                      "load_avg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
