"""What the model's RMSNorm (tasks/llama.py) keeps for the backward, and its time, against the same
arithmetic left to autograd.

Prints one JSON line. Both variants normalise a bf16 (tokens × dim) input in fp32 and scale it by a bf16
weight:
- ``autograd``: ``(x.float() * rsqrt(mean(x.float()²) + eps)).type_as(x) * w``, what the model ran before:
  autograd saves two fp32 copies of x and the bf16 normalised x;
- ``smelt``: ``tasks.llama.RMSNorm``, which saves x and one fp32 scale per row and recomputes the rest.
Saved bytes are counted with ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, the weight
excluded); times are the median forward + backward of ``--repeat`` runs on one thread.

Usage: ``python bench/norm_memory.py [--tokens 8192] [--dim 4096] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tasks.llama import RMSNorm


def autograd_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def measure(fn, x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor, repeat: int) -> tuple[int, float, torch.Tensor]:
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() != weight.untyped_storage().data_ptr():
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    times = []
    for _ in range(repeat):
        x.grad = weight.grad = None
        start = time.perf_counter()
        fn(x).backward(grad)
        times.append(time.perf_counter() - start)
    return sum(saved.values()), statistics.median(times), out.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, args.dim, generator=g).bfloat16().requires_grad_()
    grad = torch.randn(args.tokens, args.dim, generator=g).bfloat16()
    norm = RMSNorm(args.dim, 1e-5).to(torch.bfloat16)
    weight = norm.weight
    base_bytes, base_s, base_out = measure(lambda t: autograd_norm(t, weight, norm.eps), x, weight, grad, args.repeat)
    new_bytes, new_s, new_out = measure(norm, x, weight, grad, args.repeat)
    elements = args.tokens * args.dim
    print(json.dumps({
        "tokens": args.tokens, "dim": args.dim,
        "autograd_saved_bytes_per_element": round(base_bytes / elements, 3),
        "smelt_saved_bytes_per_element": round(new_bytes / elements, 3),
        "memory_ratio": round(new_bytes / base_bytes, 3),
        "time_ratio": round(new_s / base_s, 3), "autograd_s": round(base_s, 4), "smelt_s": round(new_s, 4),
        "same_output": bool(torch.equal(base_out, new_out)), "load_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
