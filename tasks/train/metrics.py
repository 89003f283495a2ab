"""Training metrics: per-step JSONL and TensorBoard scalars, progress lines, MFU against a device peak,
and peak memory.

MFU = tokens/s × FLOPs per token / (world size × peak FLOP/s per device), with FLOPs per token
= 6·N + 12·L·H·Q·T (ModelConfig.flops_per_token). The peak comes from a catalogue of dense bf16
rates for accelerators and from a measured matmul rate on CPU.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from functools import cache

import torch

from tasks import storage
from tasks import jsonlog
from tasks.progress import StepProgress
from tasks.tb_events import EventWriter
from tasks.train.peaks import peak_bf16

METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"  # <run_dir>/tensorboard/: `tensorboard --logdir <run_dir>/tensorboard`
TRAIN_RUN = "train"  # the trainer's TensorBoard run; the flows write the run's derived scalars beside it
NOT_SCALARS = {"step", "time", "group", "lease_epoch"}  # bookkeeping, not curves

log = logging.getLogger(__name__)


@cache
def measured_cpu_flops(size: int = 512, seconds: float = 0.2) -> float:
    """fp32 matmul rate of this process on CPU (with its current thread count), FLOP/s.

    CPUs have no meaningful data-sheet peak for PyTorch; the best matmul rate measured here is the
    honest denominator for MFU on a laptop.
    """
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm up
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def gpu_peak_flops(name: str, dtype: torch.dtype = torch.bfloat16) -> float:
    """Peak dense FLOP/s of the GPU called ``name`` (as torch.cuda.get_device_name reports it).

    Unknown GPUs fall back to the H100 figure with a warning. For fp32 the figure is the TF32 tensor-core
    rate, half the bf16 one; nothing in smelt enables TF32 (torch's default keeps fp32 matmuls in full
    fp32, several times slower), so it is an upper bound and an fp32 run's MFU reads low.
    """
    peak = peak_bf16(name)
    if peak is None:
        peak = peak_bf16("H100")
        log.warning("no peak FLOP/s known for GPU %r; assuming %.0f TFLOP/s for MFU", name, peak / 1e12)
    return peak if dtype in (torch.bfloat16, torch.float16) else peak / 2


def device_peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[str, float]:
    """(device name, peak FLOP/s per device): the catalogue on GPUs, a measurement on CPU."""
    if device.type == "cpu":
        return "cpu", measured_cpu_flops()
    name = torch.cuda.get_device_name(device)
    return name, gpu_peak_flops(name, dtype)


def mfu(tokens_per_s: float, flops_per_token: float, world_size: int, peak_flops: float) -> float:
    return tokens_per_s * flops_per_token / (world_size * peak_flops)


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated accelerator memory, or peak resident memory of this process on CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


class MetricsLogger:
    """Writes one JSON object per step to the run's ``metrics.jsonl`` log and its numbers as TensorBoard
    scalars (``train/<key>`` under ``<run_dir>/tensorboard/train/``), and logs rate-limited progress
    (step/s, tokens/s, ETA: tasks/progress.py); only the writing rank opens them.

    The log is appended to on local disk and written as rolled segments on object stores
    (tasks/jsonlog.py, tasks/tb_events.py); ``goodput.read_jsonl`` and the eval report read either.
    Each process group starts a new event file with a restart mark at its first step, so TensorBoard drops
    the earlier groups' points from that step on, as the run's final trajectory does.
    """

    def __init__(self, run_dir: str, *, enabled: bool) -> None:
        self.enabled = enabled
        self.url = storage.join(storage.normalize_url(run_dir), METRICS)
        self._log = None
        self._tb = None
        self._progress = None
        self._started = False
        if not enabled:
            return
        self._log = jsonlog.Segment(run_dir, METRICS)
        self._tb = EventWriter(storage.join(storage.normalize_url(run_dir), TENSORBOARD, TRAIN_RUN))
        steps = _configured_steps(run_dir)
        if steps:
            self._progress = StepProgress(steps, log.info)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self._log.write(record)
        if "step" not in record:
            return
        if not self._started:  # this process group's first step: TensorBoard drops what it supersedes
            self._tb.session_start(record["step"], record.get("time"))
            self._started = True
        self._tb.scalars({f"train/{k}": v for k, v in record.items()
                          if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)},
                         record["step"], record.get("time"))
        self._tb.flush()
        if self._progress is not None and "rolled_back_to" not in record and "tokens" in record:
            self._progress.update(record["step"], record["tokens"])

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _configured_steps(run_dir: str) -> int | None:
    """``train.steps`` of the launch, from the run folder's ``train_config.json`` (the launcher writes it)."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(run_dir), "train_config.json"))
    try:
        return int(json.loads(fs.cat_file(path))["steps"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None
