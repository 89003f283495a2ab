"""Calibration runs: Llama 3 405B's published MFU and failure figures."""

import pytest

from infra.calibration import llama3_405b_failures, llama3_405b_mfu, llama3_70b_gpu_hours


def test_llama3_405b_mfu_fit_and_prediction_and_the_published_layout_fits():
    fit, prediction = llama3_405b_mfu()
    assert fit["fitted"] and fit["predicted_mfu"] == pytest.approx(0.435, abs=0.002)  # 430 TFLOP/s, fitted here
    assert not prediction["fitted"] and prediction["predicted_mfu"] == pytest.approx(0.405, abs=0.01)  # 400: predicted
    assert fit["fits_our_memory_model"] and fit["memory_gb"] < 80  # TP8 PP16 without recomputation on 80 GB


def test_llama3_405b_snapshot_has_466_interruptions_and_over_90_percent_effective_time():
    out = llama3_405b_failures(runs=60, seed=0)
    assert out["simulated_interruptions"]["mean"] == pytest.approx(466, rel=0.03)
    assert out["simulated_effective_training_time"]["mean"] > 0.90
    assert out["simulated_effective_training_time"]["mean"] == pytest.approx(out["closed_form_goodput"], rel=0.01)


def test_70b_plan_is_compared_with_metas_gpu_hours():
    out = llama3_70b_gpu_hours()
    assert out["published_gpu_hours"] == 6.4e6 and 4e6 < out["planned_gpu_hours"] < 6.4e6
