"""The run's derived TensorBoard scalars, beside the trainer's per-step ones (tasks/train/metrics.py).

Under ``<run_dir>/tensorboard/run/``, rewritten whole from the run's record each time (one file, so a
rewrite never duplicates a point): ``goodput/<part>_s`` and ``goodput/fraction`` at the last step,
``faults/restarts`` (the count so far), ``faults/steps_lost`` and ``faults/recovery_s`` at the step
each restart or rollback resumed from, and ``eval/<split>/loss`` and ``eval/<split>/bits_per_byte``
(``total`` too) at each evaluated checkpoint's step.
"""

from __future__ import annotations

from tasks import storage
from tasks.report.timeline import faults, final_trajectory
from tasks.tb_events import EventWriter

RUN = "run"
FILE = "events.out.tfevents.0000000000.smelt-run"
GOODPUT_KEYS = ("productive_s", "checkpoint_s", "init_s", "restart_s", "lost_s", "other_s", "wall_s")


def derived_scalars(data: dict) -> list[tuple[str, float, int, float]]:
    """``(tag, value, step, wall time)`` of every derived scalar, in step order per tag."""
    out = []
    trajectory = final_trajectory(data["metrics"])
    last_step = trajectory[-1]["step"] if trajectory else 0
    last_time = trajectory[-1]["time"] if trajectory else data["generated_at"]
    if data["goodput"]:
        out += [(f"goodput/{k}", float(data["goodput"][k]), last_step, last_time) for k in GOODPUT_KEYS
                if k in data["goodput"]]
        out.append(("goodput/fraction", float(data["goodput"]["goodput"]), last_step, last_time))
    for i, fault in enumerate(faults(data["events"], data["metrics"]), 1):
        step = fault["resumed_from"]
        out += [("faults/restarts", float(i), step, fault["time"]),
                ("faults/steps_lost", float(fault["steps_lost"]), step, fault["time"])]
        if fault["recovery_s"] is not None:
            out.append(("faults/recovery_s", float(fault["recovery_s"]), step, fault["time"]))
    for ev in data["evaluations"]:
        for split, figures in [*sorted(ev["splits"].items()), ("total", ev["total"])]:
            out += [(f"eval/{split}/loss", float(figures["val_loss"]), ev["step"], last_time),
                    (f"eval/{split}/bits_per_byte", float(figures["bits_per_byte"]), ev["step"], last_time)]
    return out


def write_scalars(data: dict) -> str:
    """Rewrite ``<run_dir>/tensorboard/run/``; returns its URL."""
    url = storage.join(data["run_dir"], "tensorboard", RUN)
    writer = EventWriter(url, name=FILE)
    for tag, value, step, wall_time in derived_scalars(data):
        writer.scalar(tag, value, step, wall_time)
    writer.close()
    return url
