"""bench/fp8_linears.py as a user runs it, on the CPU (its smoke-test mode): one JSON line with each linear of the
case, measured and predicted; bad cases are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/fp8_linears.py", "--allow-cpu", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_each_linear_of_a_rank_is_timed_in_bf16_and_fp8_beside_the_planners_prediction():
    done = _bench("--only", "tiny:2", "--tokens", "64", "--no-compile", "--warmup", "0", "--iters", "1")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    linears = out["linears"]
    assert [(r["linear"], r["inputs"], r["outputs"]) for r in linears] == [
        ("q", 64, 32), ("k", 64, 16), ("v", 64, 16), ("w1", 64, 96), ("w3", 64, 96), ("wo", 32, 64), ("w2", 96, 64)]
    for r in linears:
        assert r["bf16_ms"] > 0 and r["fp8_ms"] > 0 and r["gain"] == pytest.approx(r["bf16_ms"] / r["fp8_ms"], rel=0.02, abs=0.002)
        assert r["predicted_gain"] < 1  # every tiny linear is below torchao's bound: FP8 only adds casts
    assert out["gain_error_worst"] == max((r["gain_error"] for r in linears), key=abs) != 0
    assert done.stderr.count("FP8 gain") == 7  # progress, one line a linear


def test_a_case_the_model_cannot_split_is_a_one_line_error():
    done = _bench("--only", "tiny:3")
    assert done.returncode == 2 and "do not split over tp=3" in done.stderr and "Traceback" not in done.stderr
