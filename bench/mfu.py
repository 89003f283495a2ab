"""Model FLOPs utilisation of smelt's trainer on GPUs: a 1B-class preset in bf16 with torch.compile.

    python bench/mfu.py                                   # one GPU
    python bench/mfu.py --preset 3b                       # Llama 3.2 3B shapes
    torchrun --nproc-per-node 8 bench/mfu.py              # FSDP over 8 GPUs (dp_shard = world)
    python bench/mfu.py --float8 tensorwise               # the blocks' matmuls in FP8 (torchao)
    python bench/mfu.py --allow-cpu --preset tiny --seq-len 128 --batch 4 --no-compile   # smoke test

Trains on random tokens (the data does not change the arithmetic) for warm-up steps (compile,
allocator) and then measured steps; MFU = tokens/s × (6·N + 12·L·H·Q·T) / (GPUs × dense bf16 peak
from the catalogue in tasks/train/metrics.py), from the median measured step.

Prints one JSON line: gpu, model, layout, tokens_per_s, mfu (goal >= 0.45 on one H100/H200),
plus step_time_s, peak_mem_gib, params, seq_len, global_batch.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import sys
import tempfile

import numpy as np
import torch

from tasks import contract
from tasks.config import from_dict
from tasks.train.config import FLOAT8_RECIPES, TrainConfig
from tasks.train.metrics import mfu
from tasks.train.trainer import Trainer


def write_random_tokens(url: str, tokens: int, vocab: int) -> str:
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    stream = np.random.default_rng(0).integers(1, vocab, tokens).astype(np.dtype(dtype).newbyteorder("<"))
    index = io.BytesIO()
    np.save(index, np.array([0], dtype=np.int64))
    shards = [
        contract.write_shard(url, "train-00000.bin", lambda f: f.write(stream.tobytes()) and len(stream),
                             split="train", tokens=len(stream), docs=1, dtype=dtype),
        contract.write_shard(url, "train-00000.idx", lambda f: f.write(index.getvalue()) and 1,
                             split="train", tokens=0, docs=1, dtype="int64"),
    ]
    meta = {"dtype": dtype, "vocab_size": vocab, "eos_id": 0, "bos_id": None, "pad_id": None}
    contract.commit(url, "tokens", "bench-mfu", shards, {"tokens": len(stream)}, meta=meta)
    return url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="1b", help="model preset (default 1b: Llama 3.2 1B shapes; 3b: Llama 3.2 3B)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=0, help="global batch in sequences (default 4 per GPU)")
    parser.add_argument("--warmup", type=int, default=5, help="steps not measured (compile, allocator)")
    parser.add_argument("--steps", type=int, default=15, help="measured steps")
    parser.add_argument("--ac", default="none", choices=["none", "full", "selective"], help="activation checkpointing")
    parser.add_argument("--float8", default="none", choices=FLOAT8_RECIPES,
                        help="the blocks' linear layers in FP8 (parallel.float8; MFU stays against the bf16 peak)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a smoke test of this script)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench/mfu.py needs a CUDA GPU (use --allow-cpu with a small --preset for a smoke test)", file=sys.stderr)
        return 2
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.WARNING)

    total = args.warmup + args.steps
    batch = args.batch or 4 * world
    cfg = from_dict(TrainConfig, {
        "model_preset": args.preset,
        "steps": total,
        "data": {"seq_len": args.seq_len, "global_batch": batch},
        "parallel": {"compile": not args.no_compile, "activation_checkpoint": args.ac, "float8": args.float8},
        "checkpoint": {"interval_steps": 0},
    })
    vocab = cfg.model_config(vocab_size=32000).vocab_size
    with tempfile.TemporaryDirectory(prefix="smelt-mfu-") as tmp:  # per rank: no shared disk needed
        url = write_random_tokens(os.path.join(tmp, "tokens"), (total + 1) * batch * args.seq_len + 1, vocab)
        with Trainer(cfg, {"bench": url}, os.path.join(tmp, "run")) as trainer:
            result = measure(trainer, args, batch)
    if rank == 0:
        print(json.dumps(result, ensure_ascii=False))
    return 0


def measure(trainer: Trainer, args: argparse.Namespace, batch: int) -> dict:
    times = []
    for step in range(1, args.warmup + args.steps + 1):
        record = trainer.train_step(step)  # ends with .item() on the loss: the GPU is synchronised
        if step > args.warmup:
            times.append(record["step_time_s"])
    step_time = statistics.median(times)
    tokens_per_s = trainer.batch.tokens_per_step / step_time
    return {
        "gpu": trainer.device_name,
        "model": args.preset,
        "layout": trainer.dims.describe(),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(mfu(tokens_per_s, trainer.flops_per_token, trainer.world_size, trainer.peak_flops), 4),
        "step_time_s": round(step_time, 4),
        "peak_mem_gib": round(record["peak_mem_gib"], 2),
        "params": trainer.model_cfg.num_params(),
        "seq_len": args.seq_len,
        "global_batch": batch,
        "compile": not args.no_compile,
        "dtype": str(trainer.compute_dtype).removeprefix("torch."),
        "float8": args.float8,
    }


if __name__ == "__main__":
    sys.exit(main())
