"""Launching torchrun: the command line, a real two-rank run, and a timeout that leaves no rank behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tasks import contract, storage
from tasks.checkpoint_reader import list_committed
from tasks.errors import is_permanent
from tasks.train import goodput
from tasks.train.node_launch import (LaunchError, check_not_excluded, code_version, launch_training, prepare_run,
                                torchrun_command)
from tests.tasks.train.token_corpus import make_corpus

REPO = Path(__file__).resolve().parents[3]
TINY = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8},
    "parallel": {"dp_shard": 2},
}


def test_rendezvous_is_c10d_on_loopback_not_standalone():
    cmd = torchrun_command(2, ["--data", "x"], "run1", max_restarts=3, rdzv_port=29400)
    line = " ".join(cmd)
    assert "--standalone" not in cmd
    assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id run1 --max-restarts 3" in line
    assert line.endswith("-m tasks.train.main --data x")


@pytest.mark.slow
def test_two_ranks_train_and_commit_a_checkpoint(tmp_path):
    corpus = make_corpus(str(tmp_path / "corpus"))
    lines: list[str] = []
    result = launch_training(data={"main": corpus}, config={**TINY, "steps": 3}, run_dir=str(tmp_path / "run"),
                             nproc=2, timeout_s=300, log=lines.append)
    assert result["returncode"] == 0 and result["restarts"] == 0
    summary = result["summary"]
    assert summary["steps"] == 3 and summary["world_size"] == 2 and "dp_shard=2" in summary["layout"]
    assert [c["step"] for c in list_committed(str(tmp_path / "run"))] == [3]
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["steps"] == 3
    assert any("step 3/3" in line for line in lines)


def test_a_launch_into_a_run_folder_records_what_changed_and_keeps_the_previous_config(tmp_path):
    run, data, lines = str(tmp_path / "run"), {"main": "file:///tokens"}, []
    prepare_run(data, {"steps": 4}, run, log_line=lines.append)
    assert lines == [] and goodput.read_jsonl(run, goodput.EVENTS) == []  # a new run: nothing continues
    goodput.append_event(run, {"event": "launch", "time": 1.0, "code_version": "the-code-of-launch-1"})

    prepare_run(data, {"steps": 8, "optim": {"lr": 1e-3}}, run, log_line=lines.append)
    (changed,) = [e for e in goodput.read_jsonl(run, goodput.EVENTS) if e["event"] == "config_changed"]
    assert changed["changes"] == {"steps": [4, 8], "optim.lr": [3e-3, 1e-3]}
    assert (changed["previous_code_version"], changed["code_version"]) == ("the-code-of-launch-1", code_version())
    assert changed["previous_config"] == "train_config.1.json" and changed["checkpoint_step"] is None
    assert json.loads((tmp_path / "run" / "train_config.1.json").read_text()) == {"steps": 4}
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["steps"] == 8
    assert f"run {storage.normalize_url(run)} continues" in lines[-1] and "steps 4 → 8" in lines[-1]
    assert "code the-code-of-launch-1 → " in lines[-1]

    goodput.append_event(run, {"event": "launch", "time": 2.0, "code_version": code_version()})
    prepare_run(data, {"steps": 8, "optim": {"lr": 1e-3}}, run, log_line=lines.append)  # a retry: same config, code
    assert [e["event"] for e in goodput.read_jsonl(run, goodput.EVENTS)].count("config_changed") == 1
    assert "config and code unchanged" in lines[-1] and not (tmp_path / "run" / "train_config.2.json").exists()


def test_a_finished_run_asked_for_more_steps_is_no_longer_finished(tmp_path):
    run, data = str(tmp_path / "run"), {"main": "file:///tokens"}
    prepare_run(data, {"steps": 4}, run)
    contract.commit(run, kind="model", fp="run-id", shards=[], stats={},
                    meta={"checkpoint": "checkpoints/step-00000004", "step": 4})
    prepare_run(data, {"steps": 4, "checkpoint": {"keep_last": 3}}, run)  # `smelt launch` of the same budget
    assert contract.read_manifest(run) is not None
    prepare_run(data, {"steps": 10}, run)
    assert contract.read_manifest(run) is None  # the run is training again: nothing names a final checkpoint
    (event,) = [e for e in goodput.read_jsonl(run, goodput.EVENTS) if e["event"] == "continue"]
    assert (event["finished_step"], event["steps"]) == (4, 10)


def _ranks_of(run_dir: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(run_dir in part for part in proc.info["cmdline"] or []):
            out.append(proc)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["in-process", "torchrun"])
def test_an_interrupt_stops_the_launcher_and_every_rank(tmp_path, restart):
    corpus = make_corpus(str(tmp_path / "corpus"))
    run_dir = str(tmp_path / "endless")
    seen: list[int] = []

    def interrupt_once_training(line: str) -> None:  # Ctrl-C (or a cancelled flow): SIGINT to this process
        if "step 1/" in line and not seen:
            seen.extend(p.pid for p in _ranks_of(run_dir))
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own handler, whatever an earlier test in this process left: in one full-suite run SIGINT no longer
    # raised KeyboardInterrupt here, and the endless run trained on until the timeout
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch_training(data={"main": corpus}, config={**TINY, "steps": 1_000_000}, run_dir=run_dir, nproc=2,
                            timeout_s=120, restart=restart, log=interrupt_once_training)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(seen) >= (3 if restart == "torchrun" else 2)  # torchrun (or a spare) and two ranks were running
    assert _ranks_of(run_dir) == []


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["in-process", "torchrun"])
def test_a_timeout_is_an_error_and_leaves_no_process(tmp_path, restart):
    run_dir = str(tmp_path / "slow-start")
    corpus = make_corpus(str(tmp_path / "corpus"), tokens=4000)
    hangs = {**TINY, "steps": 1, "faults": {"inject": "stop:rank=0,step=1"}}  # can never finish: no race
    started = time.monotonic()
    with pytest.raises(LaunchError, match="ran past its 3 s timeout"):
        launch_training(data={"main": corpus}, config=hangs, run_dir=run_dir, nproc=2, timeout_s=3, restart=restart)
    assert time.monotonic() - started < 3 + 35
    assert _ranks_of(run_dir) == []


def test_an_elastic_agent_passes_its_node_range_and_rendezvous_settings():
    cmd = torchrun_command(1, [], "run1", max_restarts=2, rdzv_port=29400, nnodes="1:2",
                           rdzv_conf="last_call_timeout=10")
    line = " ".join(cmd)
    assert "--nnodes 1:2 --nproc-per-node 1" in line and "--rdzv-conf last_call_timeout=10" in line


def test_an_excluded_host_refuses_to_join_an_elastic_job_and_is_only_reported_otherwise(tmp_path):
    (tmp_path / "exclude_hosts.json").write_text(json.dumps({"hosts": [socket.gethostname()], "ranks": [1]}))
    with pytest.raises(LaunchError, match="exclude_hosts.json \\(a straggler\\); the elastic job continues"):
        check_not_excluded(str(tmp_path), "1:2")
    reported: list[str] = []
    check_not_excluded(str(tmp_path), "1", reported.append)
    assert "cannot run without its hosts" in reported[0]
    check_not_excluded(str(tmp_path / "no-list"), "1:2", reported.append)
    assert len(reported) == 1


# -- user mistakes: one sentence before torchrun starts ------------------------------------------------

BAD_LAUNCHES = {
    "unknown preset": ({"model_preset": "nope"}, 2, "train.model_preset is 'nope'; choose one of tiny"),
    "negative steps": ({"steps": -5}, 2, "train.steps must be at least 1, got -5"),
    "batch not divisible by the ranks": ({"data": {"seq_len": 16, "global_batch": 7}}, 2,
                                         "data.global_batch (7) must be divisible by the data-parallel size (2"),
    "tp the ranks cannot hold": ({"parallel": {"tp": 4}}, 2, "tp"),
    "vocabulary smaller than the data's": ({"model": {"vocab_size": 100}}, 2,
                                           "model's vocabulary (100, from train.model.vocab_size or preset 'tiny') "
                                           "is smaller than the data's tokenizer (256)"),
    "mixture names not the data's": ({"data": {"seq_len": 16, "global_batch": 8, "mixture": {"web": 1.0}}}, 2,
                                     "train.data.mixture names ['web'] but the data is ['main']"),
    "zero ranks": ({}, 0, "launch.nproc must be at least 1, got 0"),
    "malformed fault spec": ({"faults": {"inject": "kill:rank=1"}}, 2, "fault 'kill:rank=1' needs step"),
    "sequence longer than the model's": ({"data": {"seq_len": 1024, "global_batch": 8}}, 2,
                                         "data.seq_len (1024) exceeds model.max_seq_len (512)"),
}


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("corpus") / "tokens"), tokens=4000)


@pytest.mark.parametrize("name", BAD_LAUNCHES)
def test_a_bad_value_is_one_sentence_before_torchrun_starts(tmp_path, small_corpus, name):
    override, nproc, message = BAD_LAUNCHES[name]
    config = {**TINY, "steps": 3, **override}
    started = time.monotonic()
    with pytest.raises(ValueError) as raised:
        launch_training(data={"main": small_corpus}, config=config, run_dir=str(tmp_path / "run"), nproc=nproc,
                        timeout_s=60)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "run").exists()  # nothing was prepared, so nothing was launched
    assert time.monotonic() - started < 10


@pytest.mark.slow
@pytest.mark.parametrize("override, message", [
    ("launch.nproc=0", "launch.nproc must be at least 1"),
    ("train.model.vocab_size=100", "is smaller than the data's tokenizer (256)"),
])
def test_smelt_train_names_a_bad_value_in_one_sentence(tmp_path, small_corpus, override, message):
    result = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--data", small_corpus, "--root",
                             str(tmp_path), "--set", override], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 2, result.stderr
    error = " ".join(result.stderr.split())
    assert error.startswith("error: ") and message in error and "Traceback" not in result.stderr
    # (rich wraps the sentence at the terminal width; the test joins the lines)
    assert not (tmp_path / "train").exists()


@pytest.mark.slow
def test_a_second_launch_into_a_run_that_is_training_is_refused_naming_the_holder(tmp_path):
    """One writer per run folder: the second launcher, started once the first is training (a gate, not a
    sleep), refuses before writing anything; the run trains once, one record per step."""
    corpus = make_corpus(str(tmp_path / "corpus"), tokens=4000)
    run_dir = str(tmp_path / "run")
    training = threading.Event()
    release = threading.Event()

    def first_log(line: str) -> None:
        if "step 2/" in line:
            training.set()
            release.wait(timeout=120)  # hold the first run here (its log thread) until the second has tried

    first = threading.Thread(target=launch_training, kwargs=dict(
        data={"main": corpus}, config={**TINY, "steps": 6}, run_dir=run_dir, nproc=2, timeout_s=300, log=first_log))
    first.start()
    try:
        assert training.wait(timeout=120), "the first run never reached step 2"
        with pytest.raises(LaunchError) as refused:
            launch_training(data={"main": corpus}, config={**TINY, "steps": 6}, run_dir=run_dir, nproc=2,
                            timeout_s=300)
    finally:
        release.set()
        first.join(timeout=300)
    message = str(refused.value)
    assert "is leased" in message and socket.gethostname() in message and "\n" not in message
    assert is_permanent(refused.value)  # a flow does not retry a launch into a folder another launch holds
    events = goodput.read_jsonl(run_dir, goodput.EVENTS)
    assert [e["event"] for e in events].count("launch") == 1
    steps = [r["step"] for r in goodput.read_jsonl(run_dir, goodput.METRICS)]
    assert steps == list(range(1, 7))
