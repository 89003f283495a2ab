"""Peak memory and time of the trainer's loss (tasks/train/cross_entropy.py) against aten's eager one.

Prints one JSON line. Each variant runs in a fresh process, which computes bf16 logits, the loss and its
backward, and reports its peak resident memory above what it held before the logits existed, per logit of
the micro-batch. The ratios are measured in the same run:
- ``eager``: ``F.cross_entropy(logits.float())``, what the trainer did before (its fp32 copy and log-softmax
  are saved for the backward);
- ``chunked``: ``token_sum_cross_entropy`` (chunks of ``CHUNK_LOGITS`` under activation checkpointing).
The planner's ``MemoryAssumptions.logits_bytes`` is this per-logit figure.

Usage: ``python bench/loss_memory.py [--tokens 8192] [--vocab 32768] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from tasks.train.cross_entropy import token_sum_cross_entropy


def one(variant: str, tokens: int, vocab: int) -> dict:
    """Run one variant twice in this process (a fresh one, so the peak is this variant's); time the second,
    so that first-touch page faults do not count."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, 256, generator=g).bfloat16()
    weight = (torch.randn(vocab, 256, generator=g) * 0.05).bfloat16().requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(2):
        logits = (hidden @ weight.t()).unsqueeze(0)  # (1, T, V) bf16, as the model hands them over
        start = time.perf_counter()
        if variant == "eager":
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        else:
            loss = token_sum_cross_entropy(logits, targets)
        del logits
        loss.backward()  # the loss's backward and the output projection's
        seconds = time.perf_counter() - start
        weight.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"bytes_per_logit": (peak - before) * 1024 / (tokens * vocab), "loss_s": seconds, "loss": loss.item()}


def run(variant: str, tokens: int, vocab: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", variant, "--tokens", str(tokens), "--vocab", str(vocab)],
                         check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens in the micro-batch")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant; the lowest peak and time count")
    parser.add_argument("--one", choices=("eager", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.tokens, args.vocab)))
        return
    runs = {v: [run(v, args.tokens, args.vocab) for _ in range(args.repeat)] for v in ("eager", "chunked")}
    best = {v: {k: min(r[k] for r in rs) for k in ("bytes_per_logit", "loss_s")} for v, rs in runs.items()}
    print(json.dumps({
        "tokens": args.tokens, "vocab": args.vocab,
        "eager_bytes_per_logit": round(best["eager"]["bytes_per_logit"], 2),
        "chunked_bytes_per_logit": round(best["chunked"]["bytes_per_logit"], 2),
        "memory_ratio": round(best["chunked"]["bytes_per_logit"] / best["eager"]["bytes_per_logit"], 3),
        "loss_time_ratio": round(best["chunked"]["loss_s"] / best["eager"]["loss_s"], 3),
        "same_loss": abs(runs["chunked"][0]["loss"] / runs["eager"][0]["loss"] - 1) < 1e-5,
        "load_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
