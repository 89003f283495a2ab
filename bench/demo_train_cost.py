"""What the demo's training costs in CPU seconds, per variant of its config: the real launcher (smelt's node agent,
as the demo starts it, or torchrun), two FSDP2 ranks on gloo with the ranks' allocator settings, on the token
datasets of a finished demo root.

``bench/demo_sweep.py`` answers "does a config learn enough"; this one answers "what does a step cost, and
what does the rest of a launch cost", which the sweep's whole-command figures mix together. Each variant
is a list of ``--set`` overrides on ``configs/demo.toml``'s ``[train]``; every run gets a fresh run folder
(no resume). Variants run in rounds (A B C, A B C, …) so that other people's load hits each alike. CPU
seconds are user + system of the launcher and its ranks (``RUSAGE_CHILDREN``): on a shared machine they hold
where wall time does not. A variant's per-step cost is the slope between its ``--steps`` run and a
``--short``-step run of the same variant (what is left is the launch: interpreters, torch import, the
model's build, rendezvous, the final checkpoint).

Prints one JSON line per run, then one summary line: per variant the median CPU seconds per step, the
fixed launch cost, minor page faults per step, the ratio to the first variant's per-step cost, the last
loss (the same seed and data: a variant that only changes bookkeeping must leave it bit-identical), and
the load average before and after.

    python bench/demo_train_cost.py --root smelt-data                 # after a `make demo`
    python bench/demo_train_cost.py --root R --only demo no-snapshots --steps 80 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tasks.train.node_launch import run_agent, run_torchrun  # noqa: E402

VARIANTS: dict[str, list[str]] = {
    "demo": [],
    # the in-memory snapshot (snapshot.py) of every step, written to /dev/shm: the demo shows storage checkpoints
    "no-snapshots": ["snapshot.enabled=off"],
    "snapshots-every-50": ["snapshot.interval_steps=50"],
    "zero2": ["parallel.zero2=true"],
    "tied": ["model.tie_embeddings=true"],
    "zero2-no-snapshots": ["parallel.zero2=true", "snapshot.enabled=off"],
    # one FSDP2 group for the whole model: 3 collectives a step instead of 3 per block
    "one-fsdp-group": ["parallel.fsdp_per_block=false"],
    # half the batch: what a step costs beside the tokens it trains on
    "batch-16": ["data.global_batch=16"],
    "layers-2": ["model.n_layers=2"],  # half the blocks: what the blocks cost beside the output layer
}


def token_datasets(root: str) -> list[str]:
    """``name=URL`` of each token dataset the newest training run under ``root`` (a finished demo) read."""
    newest = max(Path(root, "train").glob("*/lineage.json"), key=lambda p: p.stat().st_mtime)
    return [f"{name}={url}" for name, url in sorted(json.loads(newest.read_text())["datasets"].items())]


def mixture(config: str) -> list[str]:
    """The run config's ``[mixture]`` as train overrides (the flow copies it into ``train.data.mixture``)."""
    with open(config, "rb") as f:
        weights = tomllib.load(f).get("mixture", {})
    return [f"--set=data.mixture.{name}={weight}" for name, weight in weights.items()]


def run(name: str, overrides: list[str], steps: int, data: list[str], work: Path, config: str, launcher: str) -> dict:
    run_dir = work / f"{name}-{steps}-{time.monotonic_ns()}"
    args = ["--config", config, "--run-dir", str(run_dir), "--set", f"steps={steps}", "--set", "log_every=1000",
            "--set", f"checkpoint.interval_steps={max(steps, 1)}", *mixture(config)]
    for d in data:
        args += ["--data", d]
    for o in overrides:
        args += ["--set", o]
    lines: list[str] = []
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    if launcher == "agent":  # the demo's (launch.restart = in-process): two ranks and a warm spare
        rc = run_agent(2, args, 1, timeout_s=1200, log_line=lines.append)
    else:
        rc = run_torchrun(2, args, str(run_dir), timeout_s=1200, log_line=lines.append)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        return {"name": name, "steps": steps, "failed": rc, "log": lines[-20:]}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"name": name, "steps": steps, "overrides": overrides,
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "user_s": round(after.ru_utime - before.ru_utime, 2), "sys_s": round(after.ru_stime - before.ru_stime, 2),
            "minflt": after.ru_minflt - before.ru_minflt, "wall_s": round(wall, 2),
            "median_step_s": round(statistics.median(r["step_time_s"] for r in records), 4),
            "last_loss": records[-1]["loss"], "loadavg": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="a finished demo root (its tokenize/ datasets are trained on)")
    parser.add_argument("--only", nargs="*", help=f"variants (default: all of {', '.join(VARIANTS)})")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--short", type=int, default=5, help="steps of the run that measures the launch's own cost")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--launcher", choices=("agent", "torchrun"), default="agent",
                        help="agent: smelt's node agent, as the demo launches (launch.restart = in-process)")
    parser.add_argument("--config", default=str(REPO / "configs" / "demo.toml"))
    args = parser.parse_args()
    names = args.only or list(VARIANTS)
    data = token_datasets(args.root)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="smelt-train-cost-") as tmp:
        for _ in range(args.rounds):
            for name in names:
                for steps in (args.short, args.steps):
                    result = run(name, VARIANTS[name], steps, data, Path(tmp), args.config, args.launcher)
                    print(json.dumps(result), flush=True)
                    results[name].append(result)
    summary = {}
    for name, rs in results.items():
        short = [r for r in rs if r["steps"] == args.short and "cpu_s" in r]
        long = [r for r in rs if r["steps"] == args.steps and "cpu_s" in r]
        if not short or not long:
            continue
        per_step = statistics.median(r["cpu_s"] for r in long) - statistics.median(r["cpu_s"] for r in short)
        per_step /= args.steps - args.short
        summary[name] = {"cpu_ms_per_step": round(1e3 * per_step, 1),
                         "launch_cpu_s": round(statistics.median(r["cpu_s"] for r in short) - args.short * per_step, 1),
                         "minflt_per_step": round((statistics.median(r["minflt"] for r in long)
                                                   - statistics.median(r["minflt"] for r in short))
                                                  / (args.steps - args.short)),
                         "last_loss": long[-1]["last_loss"]}
    first = summary.get(names[0])
    for figures in summary.values():
        if first:
            figures["per_step_ratio"] = round(figures["cpu_ms_per_step"] / first["cpu_ms_per_step"], 3)
    print(json.dumps({"summary": summary, "launcher": args.launcher, "steps": args.steps, "short": args.short,
                      "rounds": args.rounds,
                      "loadavg_before": [round(x, 2) for x in load_before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
