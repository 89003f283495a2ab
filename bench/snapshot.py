"""What in-memory snapshots (tasks/train/snapshot.py) cost a step: the same run with them off and on.

Two simulated nodes on 127.0.0.1 (smelt's node agent, one rank each, each its own snapshot store), FSDP
over both, the ``125m`` preset by default on random tokens. Each rank snapshots every step and trades a
replica with the other node. From each run's ``metrics.jsonl`` (rank 0), over the steps after the first
two (warm-up):

- ``step_s_off`` / ``step_s_on``: median step time without and with snapshots, and their ratio
  (``step_overhead``: CPU and memory bandwidth the background copy and replication take from the step
  on this 2-core machine count here);
- ``blocked_s``: median time a step waited for a snapshot (the copy not done before the next
  optimizer step, or the previous replication not done before the next snapshot), and its share of the
  step (``blocked_share``; the issue's goal is at most 2%);
- ``replicated_bytes_per_step``: bytes each rank sent its peer per step (its snapshot file), and
  ``host_bytes_per_rank``: what each node keeps per rank (``keep`` of its own and of the peer's replica).

Prints one JSON line. Usage: ``python bench/snapshot.py [--preset 125m] [--seq-len 128] [--steps 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.train.agent import NodeAgent  # noqa: E402
from tasks.train.goodput import read_jsonl  # noqa: E402
from tasks.train.node_launch import free_port, prepare_run  # noqa: E402
from train_cpu import write_random_tokens  # noqa: E402 - bench/, this script's folder, is on sys.path


def run(work: Path, data: str, cfg: dict, name: str) -> list[dict]:
    """One job on two simulated nodes; rank 0's metrics records."""
    run_dir = work / name
    args = prepare_run({"main": data}, cfg, str(run_dir))
    port = free_port()
    status: dict[int, int] = {}
    threads = []
    for node in (0, 1):
        env = {"PYTHONPATH": str(REPO), "SMELT_SNAPSHOT_DIR": str(work / f"store-{name}-{node}")}
        agent = NodeAgent(args, nnodes=2, node_rank=node, nproc=1, master_addr="127.0.0.1", master_port=port,
                          env=env, cwd=str(REPO), log_line=lambda line: print(line, file=sys.stderr))
        thread = threading.Thread(target=lambda a=agent, n=node: status.__setitem__(n, a.run()), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=3600)
    if status != {0: 0, 1: 0}:
        raise SystemExit(f"the {name} run failed: agent status {status}")
    return read_jsonl(str(run_dir), "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smelt-bench-snapshot-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        data = write_random_tokens(str(work / "tokens"), 200_000, 32000)
        base = {"model_preset": args.preset, "steps": args.steps, "data": {"seq_len": args.seq_len, "global_batch": 2},
                "parallel": {"dp_shard": 2}, "checkpoint": {"interval_steps": 0, "async_mode": "off"},
                "loss_guard": {"enabled": False}, "log_every": 1}
        started = time.time()
        off = run(work, data, {**base, "snapshot": {"enabled": "off"}}, "off")
        on = run(work, data, {**base, "snapshot": {"enabled": "on"}}, "on")
        steady_off, steady_on = off[2:], on[2:]
        step_off = statistics.median(r["step_time_s"] for r in steady_off)
        step_on = statistics.median(r["step_time_s"] for r in steady_on)
        blocked = statistics.median(r["snapshot_s"] for r in steady_on)
        totals = [r["snapshot_replicated_bytes"] for r in on]
        sent = [b - a for a, b in zip(totals, totals[1:]) if b > a]
        per_step = statistics.median(sent) if sent else 0
        keep = 2
        print(json.dumps({
            "preset": args.preset, "seq_len": args.seq_len, "steps": args.steps, "ranks": 2, "nodes": 2,
            "step_s_off": round(step_off, 4), "step_s_on": round(step_on, 4),
            "step_overhead": round(step_on / step_off - 1, 4),
            "blocked_s": round(blocked, 4), "blocked_share": round(blocked / step_on, 4),
            "replicated_bytes_per_step": int(per_step), "host_bytes_per_rank": int(2 * keep * per_step),
            "wall_s": round(time.time() - started, 1), "load_avg": [round(x, 2) for x in os.getloadavg()],
        }))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
