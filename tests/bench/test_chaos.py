"""bench/chaos.py as a user runs it, in its smoke-test mode (``--quick``): one fault of each kind on smelt's node
agent with in-memory snapshots and on today's restart from storage, each run against a fault-free one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = {"rank_kill", "node_kill", "hang", "kill_snapshot", "kill_replicate", "kill_save", "corrupt_snapshot"}
STORAGE_KINDS = {"rank_kill", "node_kill", "hang", "kill_save"}


@pytest.fixture(scope="module")
def quick() -> tuple[dict, str]:
    # The torchrun path runs the same job class as the storage path, one relaunch a fault: left out to save time.
    done = subprocess.run([sys.executable, "bench/chaos.py", "--quick", "--paths", "agent,storage"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0]), done.stderr


@pytest.mark.slow
def test_every_fault_kind_fires_once_and_recovers_bit_identical_losing_at_most_one_step(quick):
    out, _ = quick
    assert out["faults"] == len(KINDS) and set(out["kinds"]) == KINDS
    for kind, figures in out["kinds"].items():
        assert (figures["faults"], figures["unfired"], figures["unrecovered"]) == (1, 0, 0), (kind, figures)
        assert figures["bit_identical"] is True, kind
        assert 0 < figures["median_recovery_s"] <= figures["p95_recovery_s"], kind
        assert figures["sources"] == {"snapshot": 1}, (kind, figures)  # never storage, never from scratch
    assert out["bit_identical"] is True and out["max_steps_lost"] <= 1
    assert out["kinds"]["corrupt_snapshot"]["refused_copies"] == 1
    assert out["kinds"]["node_kill"]["peer_restores"] == 1  # the lost node's rank came back from the other's memory
    assert out["step_s"] > 0 and out["median_recovery_s"] <= out["p95_recovery_s"]
    assert set(out["load_avg"]) >= {"start", "end", "mean_1m"}


@pytest.mark.slow
def test_the_storage_path_is_measured_in_the_same_run_and_compared(quick):
    out, stderr = quick
    storage = out["storage"]
    assert storage["faults"] == len(STORAGE_KINDS) and set(storage["kinds"]) == STORAGE_KINDS
    assert storage["bit_identical"] is True
    assert all(f["sources"].keys() <= {"storage", "scratch"} for f in storage["kinds"].values()), storage["kinds"]
    assert out["recovery_ratio"] == pytest.approx(out["median_recovery_s_common_kinds"]["this"]
                                                  / out["median_recovery_s_common_kinds"]["storage"], rel=0.01)
    assert set(out["recovery_ratio_by_kind"]) == STORAGE_KINDS
    assert set(out["goals"]) == {"steps_lost_le_1", "bit_identical", "recovery_le_half_storage"}
    assert "reference:" in stderr and "agent run 1/1" in stderr and "storage run 1/1" in stderr  # progress


def test_help_names_the_options():
    done = subprocess.run([sys.executable, "bench/chaos.py", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0
    for option in ("--faults", "--quick", "--paths", "--interval", "--hang-timeout", "--storage-faults"):
        assert option in done.stdout


def test_a_schedule_that_cannot_fit_is_a_one_line_error():
    done = subprocess.run([sys.executable, "bench/chaos.py", "--steps", "20", "--gap", "10", "--per-run", "5"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "do not fit 20 steps" in done.stderr and "Traceback" not in done.stderr
