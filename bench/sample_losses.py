"""What recording per-sample losses costs a training step (issue 42, item 1): on against off, in one run.

One process, smelt's trainer on the ``125m`` preset (or ``--preset``) over random tokens. Steps alternate between
recording on (the per-token losses kept from the loss's own softmax, one vector per step) and off (the plain
token-summed loss), so other load on the machine hits both alike; each side's figure is its median step. The
recorder's parts are written at checkpoints, off the step: their cost is measured separately (a flush of
``--flush-every`` steps' rows) and spread over those steps.

Whole steps are noisy on a shared machine, so the loss itself is also timed alone, in the same run: forward and
backward of the step's loss on logits of the step's shape, recording on and off alternately (``--loss-reps`` each);
``loss_overhead_share_of_step`` is the difference of their medians over the median step without recording.

Prints one JSON line: preset, params, seq_len, global_batch, steps (per side), step_s_off, step_s_on,
step_time_ratio (on / off; goal <= 1.01), loss_s_off, loss_s_on, loss_overhead_share_of_step, flush_s (one part of
--flush-every steps), flush_share_of_step (flush_s / flush-every / step_s_off), device, threads, loadavg (1, 5, 15 min,
at the end).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config import from_dict  # noqa: E402
from tasks.train.config import TrainConfig  # noqa: E402
from tasks.train.trainer import Trainer  # noqa: E402
from train_cpu import write_random_tokens  # noqa: E402 - bench/, this script's folder, is on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side (after 2 warm-up steps)")
    parser.add_argument("--flush-every", type=int, default=100, help="steps per recorded part (a checkpoint interval)")
    parser.add_argument("--loss-reps", type=int, default=20, help="timed loss passes per side")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)

    warmup = 2
    total = warmup + 2 * args.steps
    cfg = from_dict(TrainConfig, {
        "steps": total, "model_preset": args.preset,
        "data": {"seq_len": args.seq_len, "global_batch": args.batch},
        "checkpoint": {"interval_steps": 0},
    })
    with tempfile.TemporaryDirectory() as tmp:
        url = write_random_tokens(os.path.join(tmp, "tokens"), (total + 1) * args.batch * args.seq_len + 1, 32000)
        trainer = Trainer(cfg, {"bench": url}, os.path.join(tmp, "run"))
        try:
            times: dict[bool, list[float]] = {True: [], False: []}
            for step in range(1, total + 1):
                on = step % 2 == 0
                trainer.sample_losses.enabled = on
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                trainer.train_step(step)  # ends in the loss's .item(): the step is done on the device
                if step > warmup:
                    times[on].append(time.perf_counter() - started)
            # the loss alone, on and off alternately: logits of one micro-batch, forward and backward
            mb = trainer.batch.micro_batch
            logits = torch.randn(mb, args.seq_len, trainer.model_cfg.vocab_size, device=trainer.device,
                                 dtype=trainer.compute_dtype)
            targets = torch.randint(0, trainer.model_cfg.vocab_size, (mb, args.seq_len), device=trainer.device)
            recorder = trainer.sample_losses
            recorder.begin_step(total + 1, 0)
            recorder.micro_batch(targets, 0)
            loss_times: dict[bool, list[float]] = {True: [], False: []}
            for rep in range(2 * args.loss_reps + 2):
                on = rep % 2 == 0
                recorder.enabled = on
                x = logits.detach().requires_grad_()
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                trainer._loss(x, targets).backward()
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                if rep >= 2:
                    loss_times[on].append(time.perf_counter() - started)
            # a part of --flush-every steps' rows: the recorded steps' rows, repeated to that many steps
            import pyarrow.parquet  # noqa: F401 - imported before the clock starts, as a running trainer has it

            held = list(recorder._pending)
            recorder._pending = [(s + k * total, first, losses) for k in range(-(-args.flush_every // len(held)))
                                 for s, first, losses in held][: args.flush_every]
            recorder._steps = {p[0] for p in recorder._pending}
            started = time.perf_counter()
            recorder.flush()
            flush_s = time.perf_counter() - started
        finally:
            trainer.close()
    off, on = statistics.median(times[False]), statistics.median(times[True])
    loss_off, loss_on = statistics.median(loss_times[False]), statistics.median(loss_times[True])
    steps_per_loss = trainer.batch.grad_accum  # the step computes its loss once per micro-batch
    loss_off, loss_on = loss_off * steps_per_loss, loss_on * steps_per_loss
    print(json.dumps({
        "preset": args.preset, "params": trainer.model_cfg.num_params(), "seq_len": args.seq_len,
        "global_batch": args.batch, "steps": args.steps,
        "step_s_off": round(off, 4), "step_s_on": round(on, 4), "step_time_ratio": round(on / off, 4),
        "loss_s_off": round(loss_off, 5), "loss_s_on": round(loss_on, 5),
        "loss_overhead_share_of_step": round((loss_on - loss_off) / off, 6),
        "flush_s": round(flush_s, 4), "flush_share_of_step": round(flush_s / args.flush_every / off, 6),
        "device": trainer.device_name, "threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
