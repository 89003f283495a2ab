"""Fault injection: the spec syntax, firing once per run, and what each hook does (no process is harmed here;
tests/tasks/train/test_fault_tolerance.py kills and stops real ranks)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from tasks.train.config import FaultConfig
from tasks.train.faults import Fault, FaultInjector, fired_faults, parse_faults


def test_a_spec_lists_faults_separated_by_semicolons():
    faults = parse_faults("kill:rank=1,step=7; stop:rank=0,step=5;slow:rank=1,factor=3;nan:step=6;"
                          "crash_in_save:step=10;kill:rank=0,step=6,at=save")
    assert faults == [Fault("kill", 1, 7), Fault("stop", 0, 5), Fault("slow", 1, None, 3.0), Fault("nan", None, 6),
                      Fault("crash_in_save", None, 10), Fault("kill", 0, 6, at="save")]
    assert parse_faults("") == [] and parse_faults(" ; ") == []


@pytest.mark.parametrize("spec, message", [
    ("explode:step=1", "unknown kind 'explode'"),
    ("kill:step=3", "needs rank"),
    ("nan:step=x", "must be integers"),
    ("slow:rank=0,factor=0.5", "factor must be >= 1"),
    ("nan:step=2,at=save", "at= is only for kill"),
    ("kill:rank=0,step=2,when=now", "must be one of at, factor, rank, replica, step"),
])
def test_a_malformed_spec_is_refused_naming_the_entry(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_faults(spec)


def test_config_and_environment_faults_are_both_armed(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_FAULTS", "nan:step=4")
    injector = FaultInjector.from_config(FaultConfig(inject="slow:rank=0,factor=2"), str(tmp_path), rank=0)
    assert [f.kind for f in injector.faults] == ["slow", "nan"]


def test_faults_of_other_ranks_are_not_armed(tmp_path):
    injector = FaultInjector(parse_faults("kill:rank=1,step=2;nan:step=3;slow:rank=1,factor=2"), str(tmp_path), rank=0)
    assert injector.faults == [Fault("nan", None, 3)]


def test_a_nan_fault_poisons_loss_and_gradients_once_per_run(tmp_path):
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    injector = FaultInjector(parse_faults("nan:step=2"), str(tmp_path), rank=0)
    assert injector.on_loss(1, torch.tensor(1.0), [param]).item() == 1.0
    assert math.isnan(injector.on_loss(2, torch.tensor(1.0), [param]).item())
    assert torch.isnan(param.grad).all()
    record = json.loads((tmp_path / "faults" / "fired-nan-0-2").read_text())
    assert (record["kind"], record["step"], record["pid"]) == ("nan", 2, os.getpid())

    restarted = FaultInjector(parse_faults("nan:step=2"), str(tmp_path), rank=0)  # the marker is in the run dir
    assert restarted.faults == []
    assert restarted.on_loss(2, torch.tensor(1.0), [param]).item() == 1.0
    assert [r["kind"] for r in fired_faults(str(tmp_path))] == ["nan"]


def test_a_slow_rank_sleeps_factor_minus_one_times_its_compute(tmp_path):
    injector = FaultInjector(parse_faults("slow:rank=0,factor=3,step=2"), str(tmp_path), rank=0)
    started = time.perf_counter()
    injector.on_step_end(1, 0.05)  # before its first step: no delay
    assert time.perf_counter() - started < 0.05
    injector.on_step_end(2, 0.05)
    assert time.perf_counter() - started >= 0.1
    restarted = FaultInjector(parse_faults("slow:rank=0,factor=3"), str(tmp_path), rank=0)
    assert restarted.faults  # a condition, not an event: never marked as fired


CRASH_IN_SAVE = """
import sys
from tasks.train.faults import FaultInjector, parse_faults
injector = FaultInjector(parse_faults("crash_in_save:step=4"), sys.argv[1], rank=1)
for step in (2, 4):
    injector.on_save_start(step)
    injector.on_checkpoint_written(step)  # what the checkpointer calls once the step's files are on storage
    print("survived", step, flush=True)
"""


def test_crash_in_save_exits_after_its_steps_files_only(tmp_path):
    result = subprocess.run([sys.executable, "-c", CRASH_IN_SAVE, str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and result.stdout.split("\n")[:-1] == ["survived 2"], result.stderr
    assert "crash_in_save on rank 1" in result.stderr
    assert (tmp_path / "faults" / "fired-crash_in_save-1-4").exists()
