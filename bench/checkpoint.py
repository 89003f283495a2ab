"""Async checkpoint blocking time against a synchronous save of the same state, in one run.

One process (a one-rank gloo group, as under torchrun), the ``125m`` preset of
``tasks/llama.py`` with its AdamW state (model + two moments ≈ 1.5 GB). Times:

- ``sync_save_s``: DCP writing the state with ``async_mode="off"`` (the manifest's
  ``checkpoint.write_s``: file writes and fsync, not smelt's checksums, so the baseline is not
  flattered);
- ``async_blocking_s``: what one training step is blocked by an async save (after a tiny save
  has started the writer process): the ``maybe_save`` call plus ``wait_for_staging`` before the
  optimizer step, with the step's forward/backward in between, as the trainer runs it.

Prints one JSON line: params, state_mb, sync_save_s, async_blocking_s, blocking_ratio (goal
<= 0.10), write_mb_per_s, plus the mode, the blocking if nothing overlapped the staging copy
(``staging_without_overlap_s``, the worst case) and the forward/backward time without and with a
save in flight (the overlap is not free on a CPU: staging and writing share its cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

from tasks import contract
from tasks.checkpoint_reader import step_url
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState
from tasks.train.config import CheckpointConfig


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, before_update=None) -> float:
    started = time.monotonic()
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    compute_s = time.monotonic() - started
    if before_update is not None:
        before_update()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return compute_s


def timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="125m", help="model preset (default 125m, ~125M params)")
    parser.add_argument("--mode", choices=["thread", "process"], default="process",
                        help="where the async write runs (default process)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence of the overlapped step")
    parser.add_argument("--dir", default=None, help="folder to write checkpoints in (default: a temp folder, removed)")
    args = parser.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # the async writer process joins a gloo group
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    work = args.dir or tempfile.mkdtemp(prefix="smelt-bench-ckpt-")
    try:
        torch.manual_seed(0)
        cfg = preset(args.preset)
        model = Transformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        tokens = torch.randint(0, cfg.vocab_size, (1, args.seq_len + 1))
        step_s = min(train_step(model, opt, tokens) for _ in range(2))  # the first also creates AdamW's moments
        app = {"model_optim": ModelOptimState(model, opt)}
        meta = {"model": dataclasses.asdict(cfg)}

        sync = CheckpointManager(f"{work}/sync", CheckpointConfig(async_mode="off"), rank=0, world_size=1,
                                 config_fingerprint="bench")
        sync.maybe_save(1, app, meta, force=True)
        sync.close()
        stats = contract.read_manifest(step_url(f"{work}/sync", 1)).stats
        sync_save_s, state_mb = stats["checkpoint.write_s"], stats["checkpoint.bytes"] / 1e6

        background = CheckpointManager(f"{work}/async", CheckpointConfig(async_mode=args.mode, keep_last=1),
                                       rank=0, world_size=1, config_fingerprint="bench")
        background.maybe_save(1, {"warmup": {"t": torch.zeros(1)}}, {}, force=True)  # starts the writer
        background.wait_for_commit()
        waits: list[float] = []
        call_s = timed(lambda: background.maybe_save(2, app, meta, force=True))
        step_during_save_s = train_step(model, opt, tokens, lambda: waits.append(timed(background.wait_for_staging)))
        async_blocking_s = call_s + waits[0]
        background.wait_for_commit()
        staging_s = timed(lambda: (background.maybe_save(3, app, meta, force=True), background.wait_for_staging()))
        background.close()
        step_s = min(step_s, train_step(model, opt, tokens))  # warm-up steps run slow on a cold allocator

        print(json.dumps({
            "params": sum(p.numel() for p in model.parameters()),
            "state_mb": round(state_mb, 1),
            "sync_save_s": round(sync_save_s, 3),
            "async_blocking_s": round(async_blocking_s, 3),
            "blocking_ratio": round(async_blocking_s / sync_save_s, 4),
            "write_mb_per_s": round(state_mb / sync_save_s, 1),
            "async_mode": args.mode,
            "staging_without_overlap_s": round(staging_s, 3),
            "step_compute_s": round(step_s, 3),
            "step_compute_during_save_s": round(step_during_save_s, 3),
        }))
    finally:
        dist.destroy_process_group()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
