"""One CPU rank's training step of the demo model with glibc's default allocator settings and with the ones
every rank is started with (``tasks/train/node_launch.py``'s ``RANK_MALLOC_ENV``).

With glibc's defaults a block above the mmap threshold (32 MiB at most, and a demo rank's logits are 2,048 x
4,096 fp32 = 32 MiB) is unmapped when freed and page-faulted back in on the next step. Each variant runs in
fresh processes (the environment is read once, at start), alternating A B A B so that other people's load
hits both alike; a variant's figure is its median process. CPU seconds (user and system) are the process's
own, so they hold on a shared machine where wall time does not.

Prints one JSON line: per variant user_ms, sys_ms, wall_ms per step and minor page faults per step, the
ratios of the rank settings to the defaults, identical_losses (the allocator must not change a number),
and the load average before and after.

    python bench/rank_malloc.py [--steps 15] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from tasks.train.node_launch import RANK_MALLOC_ENV

DEFAULTS = {key: "" for key in RANK_MALLOC_ENV}  # unset: glibc's own (dynamic) thresholds


def child(steps: int) -> None:
    import torch

    from tasks.llama import Transformer
    from tasks.model_config import ModelConfig
    from tasks.train.cross_entropy import token_sum_cross_entropy

    torch.set_num_threads(1)  # as torchrun starts each rank
    cfg = ModelConfig(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=192, max_seq_len=512, vocab_size=4096)
    model = Transformer(cfg)
    model.init_weights(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 4096, (8, 256), generator=g), torch.randint(0, 4096, (8, 256), generator=g)  # a rank's 8 x 256

    def step() -> float:
        opt.zero_grad()
        loss = token_sum_cross_entropy(model(x), y) / y.numel()
        loss.backward()
        opt.step()
        return loss.item()

    losses = [step() for _ in range(3)]  # warm-up: the heap grows to a step's size
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    losses += [step() for _ in range(steps)]
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"user_ms": (after.ru_utime - before.ru_utime) / steps * 1e3,
                      "sys_ms": (after.ru_stime - before.ru_stime) / steps * 1e3,
                      "wall_ms": wall / steps * 1e3, "minflt": (after.ru_minflt - before.ru_minflt) / steps,
                      "losses": losses}))


def run(env: dict[str, str], steps: int) -> dict:
    full = {k: v for k, v in {**os.environ, **env}.items() if v != ""}
    done = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps)], env=full,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=15, help="measured steps per process (after 3 warm-up steps)")
    parser.add_argument("--repeat", type=int, default=2, help="processes per variant")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps)
        return
    load_before = os.getloadavg()
    variants = {"glibc_defaults": DEFAULTS, "rank_env": RANK_MALLOC_ENV}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, env in variants.items():
            runs[name].append(run(env, args.steps))
    out: dict = {"model": "llama dim=64 layers=4 vocab=4096, one rank's 8 x 256 tokens, 1 thread",
                 "settings": RANK_MALLOC_ENV, "steps": args.steps, "repeat": args.repeat}
    for name, results in runs.items():
        out[name] = {k: round(statistics.median(r[k] for r in results), 1)
                     for k in ("user_ms", "sys_ms", "wall_ms", "minflt")}
    base, new = out["glibc_defaults"], out["rank_env"]
    out["cpu_ratio"] = round((new["user_ms"] + new["sys_ms"]) / (base["user_ms"] + base["sys_ms"]), 3)
    out["sys_ratio"] = round(new["sys_ms"] / max(base["sys_ms"], 1e-9), 3)
    out["identical_losses"] = len({tuple(r["losses"]) for rs in runs.values() for r in rs}) == 1
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
