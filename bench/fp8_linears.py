"""FP8 against bf16 one linear layer at a time: torchao's tensorwise Float8Linear on each GEMM a tensor-parallel
rank runs in the validation table's torchtitan FP8 rows, beside what the planner's terms predict for it.

    python bench/fp8_linears.py                                   # one GPU: Llama 3.1 8B at tp 1 and 8, 70B at tp 8
    python bench/fp8_linears.py --only 8b:8 --tokens 98304        # one model and degree, another micro-batch
    python bench/fp8_linears.py --allow-cpu --only tiny:1 --tokens 256 --no-compile --iters 2   # smoke test

The planner's largest miss (torchtitan's 8B at TP8 in FP8, infra/README.md) is an FP8 gain it predicts at
1.29× where the run shows 1.16×; which linears the model is too optimistic for is what a per-shape profile
says. Each linear runs forward and backward (input and weight gradients) on ``tokens`` rows, compiled, in bf16
and as Float8Linear (dynamic tensorwise scales, casts included); the median of ``iters`` timed runs after
``warmup`` is kept. The prediction is ``infra.timing.linear_seconds`` with the torchtitan-2506 stack's
assumptions on ``--gpu`` (the catalogue entry the table scores that hardware with).

Prints one JSON line: each linear's measured and predicted ms and FP8 gains and the gain's error, and their
mean and worst; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

import torch
from torch import nn

from infra.catalogue import gpu as lookup_gpu
from infra.layout import ModelShape
from infra.timing import linear_seconds, rank_linears
from infra.stacks import STACKS, stack_assumptions
from tasks.model_config import PRESETS

# (preset, tp, tokens per GEMM): the micro-batches of the torchtitan FP8 rows (infra/published_runs.py) at 8,192
# tokens a sequence: the 8B at tp 1 (mb 2), the 8B at tp 8 (mb 12, June 2025), the 70B at tp 8 (mb 16)
CASES = (("8b", 1, 2 * 8192), ("8b", 8, 12 * 8192), ("70b", 8, 16 * 8192))
MICRO_BATCH_TOKENS = {(preset, tp): tokens for preset, tp, tokens in CASES}


def _timed_ms(linear: nn.Module, x: torch.Tensor, grad: torch.Tensor, warmup: int, iters: int) -> float:
    """Median milliseconds of one forward and backward."""
    def run() -> None:
        x.grad = None
        linear.weight.grad = None
        linear(x).backward(grad)

    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def measure(inputs: int, outputs: int, tokens: int, device: str, compile: bool, warmup: int,
            iters: int) -> tuple[float, float]:
    """Measured ms of one linear (``inputs`` → ``outputs`` on ``tokens`` rows) in bf16 and in FP8."""
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    x = torch.randn(tokens, inputs, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, outputs, device=device, dtype=torch.bfloat16)
    times = []
    for fp8 in (False, True):
        linear = nn.Linear(inputs, outputs, bias=False, device=device, dtype=torch.bfloat16)
        if fp8:
            linear = convert_to_float8_training(nn.Sequential(linear))[0]
        times.append(_timed_ms(torch.compile(linear) if compile else linear, x, grad, warmup, iters))
        del linear
        torch._dynamo.reset()
    return times[0], times[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="PRESET:TP",
                        help="a model preset and tensor-parallel degree (repeatable; default the table's cases)")
    parser.add_argument("--tokens", type=int, default=0,
                        help="rows per GEMM (default the case's micro-batch, else one 8,192-token sequence)")
    parser.add_argument("--gpu", default="h100", help="catalogue entry the prediction uses (infra/catalogue.py)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (compile, autotuning)")
    parser.add_argument("--iters", type=int, default=10, help="timed runs; the median is kept")
    parser.add_argument("--no-compile", action="store_true", help="eager (torchao's casts are slow unfused)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a smoke test of this script)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench/fp8_linears.py needs a CUDA GPU (use --allow-cpu with a small case for a smoke test)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA kernels cannot load; not needed here
    try:
        cases = [(preset, int(tp), args.tokens or MICRO_BATCH_TOKENS.get((preset, int(tp)), 8192))
                 for preset, tp in (c.split(":") for c in args.only)]
        gpu = lookup_gpu(args.gpu)
        for preset, tp, _ in cases:
            if preset not in PRESETS:
                raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
            cfg = PRESETS[preset]
            if tp < 1 or any(size % tp for size in (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden)):
                raise ValueError(f"{preset}'s heads ({cfg.n_heads}, {cfg.n_kv_heads} K/V) and ffn_hidden "
                                 f"({cfg.ffn_hidden}) do not split over tp={tp}")
    except ValueError as e:
        print(f"bench/fp8_linears.py: {e} (--only takes PRESET:TP, e.g. 8b:8)", file=sys.stderr)
        return 2
    if not cases:
        cases = [(preset, tp, args.tokens or tokens) for preset, tp, tokens in CASES]
    timing, _ = stack_assumptions(STACKS["torchtitan-2506"], gpu)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for preset, tp, tokens in cases:
        for name, inputs, outputs in rank_linears(ModelShape(PRESETS[preset], 8192), tp):
            bf16_ms, fp8_ms = measure(inputs, outputs, tokens, device, not args.no_compile, args.warmup, args.iters)
            predicted = [linear_seconds(inputs, outputs, tokens, gpu, fp8, timing) * 1e3 for fp8 in (False, True)]
            gain, predicted_gain = bf16_ms / fp8_ms, predicted[0] / predicted[1]
            rows.append({"model": preset, "tp": tp, "linear": name, "tokens": tokens, "inputs": inputs,
                         "outputs": outputs, "bf16_ms": round(bf16_ms, 4), "fp8_ms": round(fp8_ms, 4),
                         "gain": round(gain, 3), "predicted_bf16_ms": round(predicted[0], 4),
                         "predicted_fp8_ms": round(predicted[1], 4), "predicted_gain": round(predicted_gain, 3),
                         "gain_error": round(predicted_gain / gain - 1, 4)})
            print(f"{preset} tp{tp} {name} ({inputs} → {outputs}, {tokens} rows): FP8 gain {gain:.2f}×, "
                  f"predicted {predicted_gain:.2f}×", file=sys.stderr, flush=True)
    errors = [row["gain_error"] for row in rows]
    print(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                      "predicted_for": gpu.name, "compile": not args.no_compile,
                      "gain_error_mean_abs": round(statistics.fmean(abs(e) for e in errors), 4),
                      "gain_error_worst": max(errors, key=abs), "linears": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
