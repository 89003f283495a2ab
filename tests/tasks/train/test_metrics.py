"""MFU, the device peak catalogue and the JSONL metrics log."""

from __future__ import annotations

import json

import fsspec
import pytest
import torch

from tasks.train.metrics import MetricsLogger, gpu_peak_flops, measured_cpu_flops, mfu


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA B200", 2250e12),
])
def test_gpu_peaks_come_from_the_dense_bf16_catalogue(name, peak):
    assert gpu_peak_flops(name) == peak


def test_fp32_runs_at_the_tf32_rate():
    assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == 156e12


def test_unknown_gpu_falls_back_to_h100_with_a_warning(caplog):
    assert gpu_peak_flops("Mystery GPU 9000") == 989e12
    assert "no peak FLOP/s known" in caplog.text


def test_mfu_is_achieved_over_peak_flops_of_the_whole_world():
    # 1000 tok/s × 6e9 FLOP/token = 6e12 FLOP/s over 4 devices of 3e12 → 0.5
    assert mfu(1000, 6e9, 4, 3e12) == pytest.approx(0.5)


def test_cpu_peak_is_a_measured_positive_rate():
    assert measured_cpu_flops() > 1e8


def test_rank_zero_appends_one_json_line_per_record():
    run_dir = "memory://metrics-test/run"
    logger = MetricsLogger(run_dir, enabled=True)
    logger.log({"step": 1, "loss": 2.5})
    logger.log({"step": 2, "loss": 2.0})
    logger.close()
    lines = fsspec.open(run_dir + "/metrics.jsonl", "r").open().read().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]


def test_other_ranks_write_nothing():
    logger = MetricsLogger("memory://metrics-test/silent", enabled=False)
    logger.log({"step": 1})
    logger.close()
    assert not fsspec.filesystem("memory").exists("/metrics-test/silent/metrics.jsonl")
