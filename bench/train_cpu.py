"""smelt's trainer step against a plain PyTorch training loop: same model, same weights, same batches.

One process on CPU. The plain loop is what anyone would write (forward, mean cross entropy,
backward, clip, AdamW step) over batches already in memory; smelt's step is ``Trainer.train_step``
plus its metrics line, reading batches through its own loader. The steps alternate between the two
so that load from other processes hits both alike; each side's time is the median step.

Both run with a constant learning rate and no weight decay, so their losses must agree: the JSON
line reports the largest difference, to show the two loops really train the same thing.

Prints one JSON line: model, params, tokens_per_s (smelt), plain_tokens_per_s,
step_time_ratio_vs_plain (goal <= 1.10), max_loss_diff, steps, threads.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from tasks import contract
from tasks.config import from_dict
from tasks.llama import Transformer
from tasks.train.config import TrainConfig
from tasks.train.trainer import Trainer


def write_random_tokens(url: str, tokens: int, vocab: int) -> str:
    stream = np.random.default_rng(0).integers(1, vocab, tokens).astype("<u2")
    index = io.BytesIO()
    np.save(index, np.array([0], dtype=np.int64))
    shards = [
        contract.write_shard(url, "train-00000.bin", lambda f: f.write(stream.tobytes()) and len(stream),
                             split="train", tokens=len(stream), docs=1, dtype="uint16"),
        contract.write_shard(url, "train-00000.idx", lambda f: f.write(index.getvalue()) and 1,
                             split="train", tokens=0, docs=1, dtype="int64"),
    ]
    meta = {"dtype": "uint16", "vocab_size": vocab, "eos_id": 0, "bos_id": None, "pad_id": None}
    contract.commit(url, "tokens", "bench-train-cpu", shards, {"tokens": len(stream)}, meta=meta)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per side (after 3 warm-up steps)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both sides")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)  # the trainer's per-step log line would dominate this tiny model's step

    warmup = 3
    total = warmup + args.steps
    cfg = from_dict(TrainConfig, {
        "steps": total,
        "model": {"dim": args.dim, "n_layers": args.layers, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 3 * args.dim},
        "data": {"seq_len": args.seq_len, "global_batch": args.batch},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "min_lr_ratio": 1.0, "weight_decay": 0.0},
        "checkpoint": {"interval_steps": 0},
    })
    with tempfile.TemporaryDirectory() as tmp:
        url = write_random_tokens(os.path.join(tmp, "tokens"), (total + 1) * args.batch * args.seq_len + 1, args.vocab)
        trainer = Trainer(cfg, {"bench": url}, os.path.join(tmp, "run"))
        try:
            # The plain loop: the same initial weights, the same batches (read up front), no smelt code.
            model = Transformer(trainer.model_cfg)
            model.init_weights(cfg.seed)
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                    eps=cfg.optim.eps, weight_decay=0.0, foreach=True)
            batches = [trainer.loader.batch_at(i * args.batch) for i in range(total)]

            def plain_step(x: torch.Tensor, y: torch.Tensor) -> float:
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip, foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.item()

            smelt_times, plain_times, loss_diffs = [], [], []
            for step in range(1, total + 1):
                started = time.perf_counter()
                record = trainer.train_step(step)
                trainer.metrics.log(record)
                smelt_s = time.perf_counter() - started
                started = time.perf_counter()
                plain_loss = plain_step(*batches[step - 1])
                plain_s = time.perf_counter() - started
                loss_diffs.append(abs(plain_loss - record["loss"]))
                if step > warmup:
                    smelt_times.append(smelt_s)
                    plain_times.append(plain_s)
        finally:
            trainer.close()

    tokens = args.batch * args.seq_len
    smelt, plain = statistics.median(smelt_times), statistics.median(plain_times)
    print(json.dumps({
        "model": f"llama dim={args.dim} layers={args.layers} vocab={args.vocab} seq={args.seq_len} batch={args.batch}",
        "params": trainer.model_cfg.num_params(),
        "tokens_per_s": round(tokens / smelt, 1),
        "plain_tokens_per_s": round(tokens / plain, 1),
        "step_time_ratio_vs_plain": round(smelt / plain, 4),
        "max_loss_diff": max(loss_diffs),
        "steps": args.steps,
        "threads": args.threads,
    }, ensure_ascii=False))


if __name__ == "__main__":
    main()
