"""The demo's training shape, chosen by measurement: ``smelt run`` on the bundled sample per candidate.

Each candidate is a list of ``--set`` overrides on ``configs/demo.toml`` (``demo`` is the config as
committed, ``old-demo`` the 60-step tiny model it replaced), run as the real command a newcomer runs:
``smelt run --root ROOT --json``, two FSDP2 ranks, checkpoints, the eval at the end. All candidates
share one root, so the sample and the data stages are computed once, by the first candidate (its
``data_s`` is their cost; the others reuse them); the ``train/`` and ``eval/`` folders are removed
before each candidate, so every one trains from scratch even where only ``train.steps`` differs
(which would otherwise continue the same run folder).

The baseline every figure is compared with is measured in the same run, on the same bytes: the eval's
xz -9e (and zstd -19, zlib -9) bits per byte of exactly the held-out text the model scored.

Prints one JSON line per candidate: name, overrides, params, steps, tokens, wall_s (the whole command),
cpu_s (user and system seconds of the command and everything it started: on a shared machine the wall
time is mostly other people's load, the CPU seconds are this command's own), data_s, train_s, eval_s, per split {bits_per_byte, xz, zstd, zlib, below_xz}, the train loss every 50 steps,
loadavg before and after; then one summary line: the candidates ranked by their smaller margin over
the bar (web 35% and code 15% below xz -9e), each with its wall time.

    python bench/demo_sweep.py                       # every candidate (4 to 13 minutes each on a busy 2-core box)
    python bench/demo_sweep.py --only demo old-demo  # some of them
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BAR = {"web": 0.35, "code": 0.15}  # how far below xz -9e each split must be (issue 44)


def shape(dim: int, layers: int, heads: int = 4, kv_heads: int = 2, ffn: int | None = None) -> list[str]:
    return [f"train.model.dim={dim}", f"train.model.n_layers={layers}", f"train.model.n_heads={heads}",
            f"train.model.n_kv_heads={kv_heads}", f"train.model.ffn_hidden={ffn or 3 * dim}"]


def batch(seq_len: int, sequences: int) -> list[str]:
    return [f"train.data.seq_len={seq_len}", f"train.data.global_batch={sequences}"]


def schedule(steps: int, lr: float, warmup: int, checkpoint_every: int, min_lr_ratio: float = 0.1) -> list[str]:
    return [f"train.steps={steps}", f"train.optim.lr={lr}", f"train.optim.warmup_steps={warmup}",
            f"train.checkpoint.interval_steps={checkpoint_every}", f"train.optim.min_lr_ratio={min_lr_ratio}"]


def mixture(web: float, code: float) -> list[str]:
    return [f"mixture.web={web}", f"mixture.code={code}"]


# Names read l<layers>d<width>-s<seq_len>-<steps>; lr 3e-3 and a 0.5 / 0.5 web / code mixture unless the name
# says otherwise (-lr…, -mix<web><code> in tenths). Every one trains 4,096 tokens per step.
CANDIDATES: dict[str, list[str]] = {
    "demo": [],  # configs/demo.toml as committed: l4d64-s128-500 at lr 4e-3, mixture 0.4 / 0.6
    # what the demo was before issue 44: 0.62M parameters, 60 steps of 2,048 tokens
    "old-demo": ["train.model_preset=tiny", "train.model.dim=64", "train.model.n_layers=2", "train.model.n_heads=4",
                 "train.model.n_kv_heads=2", "train.model.ffn_hidden=192", *batch(128, 16),
                 *schedule(60, 3e-3, 5, 20), *mixture(0.8, 0.2)],
    # the starting point: 4 x 128, 300 steps of 4,096 tokens, the old mixture
    "l4d128-s256-300-mix82": [*shape(128, 4), *batch(256, 16), *schedule(300, 3e-3, 20, 100), *mixture(0.8, 0.2)],
    "l4d128-s256-300": [*shape(128, 4), *batch(256, 16), *schedule(300, 3e-3, 20, 100), *mixture(0.5, 0.5)],
    "l4d128-s512-300-lr1e2-mix64": [*shape(128, 4), *batch(512, 8), *schedule(300, 1e-2, 20, 100), *mixture(0.6, 0.4)],
    "l4d128-s512-300-mix64": [*shape(128, 4), *batch(512, 8), *schedule(300, 3e-3, 20, 100), *mixture(0.6, 0.4)],
    "l4d96-s256-450": [*shape(96, 4), *batch(256, 16), *schedule(450, 3e-3, 20, 150), *mixture(0.5, 0.5)],
    # smaller and longer won at about the same compute: the output layer (width x 4,096) is most of the cost
    "l4d64-s256-800": [*shape(64, 4), *batch(256, 16), *schedule(800, 3e-3, 30, 200), *mixture(0.5, 0.5)],
    # the demo with 100 more steps: 0.6 points better on each split, 100 steps (about a sixth) slower
    "l4d64-s256-700-mix4555": [*shape(64, 4), *batch(256, 16), *schedule(700, 3e-3, 30, 200), *mixture(0.45, 0.55)],
    # fewer steps at a higher learning rate; shorter sequences (attention is a quarter of a step at 256)
    "l4d64-s256-400-lr6e3-mix4555": [*shape(64, 4), *batch(256, 16), *schedule(400, 6e-3, 20, 200), *mixture(0.45, 0.55)],
    "l4d64-s128-450-lr5e3-mix4555": [*shape(64, 4), *batch(128, 32), *schedule(450, 5e-3, 20, 150), *mixture(0.45, 0.55)],
    # cheaper steps at the demo's schedule: half the vocabulary (the output layer and its softmax are half a
    # step), or half the sequence (attention)
    "l4d64-s256-600-v2048-mix4555": ["tokenizer.vocab_size=2048", *shape(64, 4), *batch(256, 16),
                                     *schedule(600, 3e-3, 30, 200), *mixture(0.45, 0.55)],
    "l4d64-s128-600-mix4555": [*shape(64, 4), *batch(128, 32), *schedule(600, 3e-3, 30, 200), *mixture(0.45, 0.55)],
    "l4d64-s128-500-lr4e3-mix4555": [*shape(64, 4), *batch(128, 32), *schedule(500, 4e-3, 25, 250),
                                     *mixture(0.45, 0.55)],
    # cheaper still: shorter sequences again, or narrower (the output layer's cost is its width)
    "l4d64-s64-500-lr4e3-mix4555": [*shape(64, 4), *batch(64, 64), *schedule(500, 4e-3, 25, 250), *mixture(0.45, 0.55)],
    "l4d48-s128-500-lr4e3-mix4555": [*shape(48, 4), *batch(128, 32), *schedule(500, 4e-3, 25, 250),
                                     *mixture(0.45, 0.55)],
    # the demo with more code in the mixture: code is the split nearer its bar
    "l4d64-s128-500-lr4e3-mix46": [*shape(64, 4), *batch(128, 32), *schedule(500, 4e-3, 25, 250), *mixture(0.4, 0.6)],
    # the demo with ZeRO-2 (parameters stay gathered between forward and backward): the same numbers, fewer collectives
    "demo-zero2": ["train.parallel.zero2=true"],
    # a fifth less CPU (fewer tokens; a step's bookkeeping is not where the time goes: bench/demo_train_cost.py),
    # paid for by the schedule: cosine to 0 instead of lr x 0.1 (-minlr0), more code, a smaller batch
    "l4d64-s128-400-lr4e3-mix46-minlr0": [*shape(64, 4), *batch(128, 32), *schedule(400, 4e-3, 25, 200, 0.0),
                                          *mixture(0.4, 0.6)],
    "l4d64-s128-400-lr4e3-mix3565-minlr0": [*shape(64, 4), *batch(128, 32), *schedule(400, 4e-3, 25, 200, 0.0),
                                            *mixture(0.35, 0.65)],
    "l4d64-s128b24-500-lr4e3-mix46-minlr0": [*shape(64, 4), *batch(128, 24), *schedule(500, 4e-3, 25, 250, 0.0),
                                             *mixture(0.4, 0.6)],
    "l4d64-s128-400-lr5e3-w40-mix46-minlr0": [*shape(64, 4), *batch(128, 32), *schedule(400, 5e-3, 40, 200, 0.0),
                                              *mixture(0.4, 0.6)],
    # cheaper steps at the demo's 500 (bench/demo_train_cost.py's layers-2 and tied; one rank's step: 3 layers 0.82,
    # tied embeddings 0.92, ffn 128 0.91 of the demo's): the steps cannot go, so the step has to get cheaper
    "l4d64f128-s128-500-lr4e3-mix46-tied": [*shape(64, 4, ffn=128), "train.model.tie_embeddings=true",
                                            *batch(128, 32), *schedule(500, 4e-3, 25, 250), *mixture(0.4, 0.6)],
    "l3d64-s128-500-lr4e3-mix46": [*shape(64, 3), *batch(128, 32), *schedule(500, 4e-3, 25, 250), *mixture(0.4, 0.6)],
    # the demo as it was before its snapshots every 50 steps and its one FSDP2 group (the same numbers, more CPU)
    "demo-snapshot-every-step-fsdp-per-block": ["train.snapshot.interval_steps=1", "train.parallel.fsdp_per_block=true"],
    # three layers, paid back by the schedule: cosine to 0, and a higher peak
    "l3d64-s128-500-lr4e3-mix46-minlr0": [*shape(64, 3), *batch(128, 32), *schedule(500, 4e-3, 25, 250, 0.0),
                                          *mixture(0.4, 0.6)],
    "l3d64-s128-500-lr5e3-mix46-minlr0": [*shape(64, 3), *batch(128, 32), *schedule(500, 5e-3, 25, 250, 0.0),
                                          *mixture(0.4, 0.6)],
}


def run_candidate(name: str, overrides: list[str], root: Path, config: str) -> dict:
    for folder in ("train", "eval"):
        shutil.rmtree(root / folder, ignore_errors=True)
    command = [str(REPO / ".venv" / "bin" / "smelt"), "run", "--root", str(root), "--config", config, "--json"]
    for override in overrides:
        command += ["--set", override]
    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = {"user": round(cpu.ru_utime - cpu_before.ru_utime, 1), "system": round(cpu.ru_stime - cpu_before.ru_stime, 1)}
    if done.returncode != 0:
        return {"name": name, "overrides": overrides, "failed": done.returncode, "stderr": done.stderr[-2000:]}
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    stages = {s["stage"]: s for s in summary["stages"]}
    train, evaluation = stages["train"], stages["eval"]
    splits = {}
    for split, figures in sorted(evaluation["splits"].items()):
        base = figures["baselines"]
        splits[split] = {"bits_per_byte": round(figures["bits_per_byte"], 4),
                         **{k: round(v, 4) for k, v in base.items()},
                         "below_xz": round(1 - figures["bits_per_byte"] / base["xz"], 4)}
    return {
        "name": name, "overrides": overrides,
        "params": train["summary"]["model"]["params"], "steps": train["summary"]["steps"],
        "tokens": train["summary"]["tokens"], "tokens_per_s": round(train["summary"]["tokens_per_s"]),
        "skipped_by_loss_guard": len(train["summary"]["skipped"]),
        "wall_s": round(wall, 1), "cpu_s": cpu_s,
        "data_s": round(sum(s["seconds"] for s in summary["stages"] if s["stage"] not in ("train", "eval")
                            and not s["reused"]), 1),
        "train_s": round(train["seconds"], 1), "eval_s": round(evaluation["seconds"], 1),
        "loss_every_50_steps": [round(loss, 3) for loss in train["summary"]["losses"][::50]]
                               + [round(train["summary"]["last_loss"], 3)],
        "splits": splits,
        "meets_bar": all(splits[s]["below_xz"] >= bar for s, bar in BAR.items() if s in splits),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help=f"candidates to run (default: all of {', '.join(CANDIDATES)})")
    parser.add_argument("--root", help="a root to reuse (its data stages); default: a new temporary folder")
    parser.add_argument("--config", default=str(REPO / "configs" / "demo.toml"))
    args = parser.parse_args()
    names = args.only or list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        sys.exit(f"unknown candidate {', '.join(unknown)}; choose from {', '.join(CANDIDATES)}")
    with tempfile.TemporaryDirectory(prefix="smelt-demo-sweep-") as tmp:
        root = Path(args.root) if args.root else Path(tmp)
        results = []
        for name in names:
            result = run_candidate(name, CANDIDATES[name], root, args.config)
            print(json.dumps(result), flush=True)
            results.append(result)
    ranked = sorted((r for r in results if "splits" in r),
                    key=lambda r: -min(r["splits"][s]["below_xz"] - bar for s, bar in BAR.items() if s in r["splits"]))
    print(json.dumps({"summary": [{"name": r["name"], "wall_s": r["wall_s"], "train_s": r["train_s"],
                                   **{s: r["splits"][s]["below_xz"] for s in r["splits"]}, "meets_bar": r["meets_bar"]}
                                  for r in ranked],
                      "bar_below_xz": BAR, "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
