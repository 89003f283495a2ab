"""A fix never restarts the run (issue 40, item 6): the run folder is named by the run's identity (model
shape, data, batch contract, seeds: tasks/train/identity.py), so a finished run asked for more steps, or a
failed one retried after a change to the code under tasks/train/, continues in the same folder from its
last step, and its events say what changed. Real torchrun launches of a tiny model on one rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import contract, storage
from tasks.checkpoint_reader import list_committed
from tasks.train import goodput
from tasks.train.node_launch import code_version
from tests.tasks.train.token_corpus import make_corpus

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY = {"model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
        "data": {"seq_len": 16, "global_batch": 8}, "checkpoint": {"interval_steps": 2, "keep_last": 10}}
LAUNCH = {"nproc": 1, "max_restarts": 0, "task_retries": 0, "timeout_minutes": 10}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return make_corpus(str(tmp_path_factory.mktemp("corpus") / "tokens"), tokens=8_000)


def steps_by_launch(run_dir: str) -> list[list[int]]:
    """The steps of metrics.jsonl, one list per process group (one per launch here: no restarts)."""
    groups: dict[int, list[int]] = {}
    for record in goodput.read_jsonl(run_dir, goodput.METRICS):
        groups.setdefault(record["group"], []).append(record["step"])
    return [groups[g] for g in sorted(groups)]


def events_named(run_dir: str, name: str) -> list[dict]:
    return [e for e in goodput.read_jsonl(run_dir, goodput.EVENTS) if e["event"] == name]


def test_a_finished_run_continued_with_more_steps_resumes_at_its_last_step_in_the_same_run_folder(
        prefect_harness, corpus, tmp_path):
    from flows.train import train_flow

    root = str(tmp_path / "root")
    first = train_flow(data=[corpus], root=root, config={**TINY, "steps": 4}, launch=LAUNCH)
    run_dir = first["url"]
    assert first["summary"]["steps"] == 4 and contract.read_manifest(run_dir).meta["step"] == 4

    longer = train_flow(data=[corpus], root=root, config={**TINY, "steps": 8}, launch=LAUNCH)
    assert longer["url"] == run_dir and not longer["reused"]
    assert (longer["summary"]["resumed_from"], longer["summary"]["first_step"]) == (4, 5)
    assert steps_by_launch(run_dir) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    (changed,) = events_named(run_dir, "config_changed")
    assert changed["changes"] == {"steps": [4, 8]} and changed["checkpoint_step"] == 4
    assert changed["code_version"] == changed["previous_code_version"] == code_version()
    assert json.loads(Path(storage.filesystem(run_dir)[1], "train_config.1.json").read_text())["steps"] == 4
    (resumed,) = events_named(run_dir, "continue")
    assert (resumed["finished_step"], resumed["steps"]) == (4, 8)

    # The run's manifest now names the step-8 checkpoint; the trainer's checkpoints carry the identity that
    # names the folder; goodput leaves the idle time between the two launches out of the run's wall time.
    manifest = contract.read_manifest(run_dir)
    assert manifest.meta["step"] == 8 and longer["checkpoint"].endswith("checkpoints/step-00000008")
    assert manifest.fingerprint == run_dir.rsplit("/", 1)[1]
    assert {c["config_fingerprint"] for c in list_committed(run_dir)} == {manifest.fingerprint}
    split = longer["summary"]["goodput"]
    assert split["idle_s"] > 0 and split["steps_kept"] == 8 and split["process_groups"] == 2
    assert sum(split[k] for k in ("productive_s", "checkpoint_s", "init_s", "restart_s", "lost_s",
                                  "other_s")) == pytest.approx(split["wall_s"], abs=1e-3)

    again = train_flow(data=[corpus], root=root, config={**TINY, "steps": 8}, launch=LAUNCH)
    assert again["reused"] and again["url"] == run_dir


def copy_with_a_code_change(where: Path) -> Path:
    """The project's code, copied, with one line added to a file under tasks/train/: what a one-line fix
    does to the code version (tasks.contract.code_version hashes the files), without touching the repo."""
    for package in ("flows", "tasks", "infra", "configs"):
        shutil.copytree(REPO / package, where / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(where / "tasks" / "train" / "optim.py", "a") as f:
        f.write("# a one-line fix\n")
    return where


def smelt_train(cwd: Path, corpus: str, root: str, *overrides: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    sets = [a for o in ["train.steps=8", "train.data.seq_len=16", "train.data.global_batch=8",
                        "train.checkpoint.interval_steps=2", "train.checkpoint.keep_last=10", "train.log_every=1",
                        "launch.nproc=1", "launch.max_restarts=0", "launch.task_retries=0", *overrides]
            for a in ("--set", o)]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop("PYTHONPATH", None)  # the code of `cwd`, not of this checkout
    return subprocess.run([sys.executable, "-m", "flows.cli", "train", "--data", corpus, "--root", root, *sets,
                           *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_failed_run_retried_after_a_code_change_under_tasks_train_resumes_at_its_last_step_in_the_same_run_folder(
        prefect_harness, corpus, tmp_path):
    """`smelt train` killed at the start of step 7 (the step-6 checkpoint committed), then the same command
    from a copy of the project whose tasks/train/ holds a one-line change: the same run folder, step 7 next."""
    root = str(tmp_path / "root")
    fault = "train.faults.inject=kill:rank=0,step=7"  # fires once per run (a marker in the run folder)
    failed = smelt_train(REPO, corpus, root, fault)
    assert failed.returncode != 0, failed.stdout + failed.stderr
    (run_path,) = Path(storage.filesystem(root)[1], "train").iterdir()
    run_dir = storage.normalize_url(str(run_path))
    assert [c["step"] for c in list_committed(run_dir)] == [2, 4, 6] and contract.read_manifest(run_dir) is None

    fixed = copy_with_a_code_change(tmp_path / "fixed")
    retried = smelt_train(fixed, corpus, root, fault)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    result = json.loads(retried.stdout)
    assert result["url"] == run_dir and not result["reused"]
    assert (result["summary"]["resumed_from"], result["summary"]["first_step"], result["summary"]["steps"]) == (6, 7, 8)
    assert steps_by_launch(run_dir) == [[1, 2, 3, 4, 5, 6], [7, 8]]
    (changed,) = events_named(run_dir, "config_changed")
    assert changed["changes"] == {} and changed["checkpoint_step"] == 6  # only the code changed
    assert changed["previous_code_version"] == code_version() != changed["code_version"]
    launches = events_named(run_dir, "launch")
    assert [e["code_version"] for e in launches] == [code_version(), changed["code_version"]]
    assert events_named(run_dir, "continue") == []  # the run had not finished


def test_smelt_train_resume_from_an_older_checkpoint_with_skipped_steps_branches_the_run_and_skips_those_samples(
        prefect_harness, corpus, tmp_path):
    """The user's path for a spike: `smelt train ... --resume-from 4 --skip-steps 5:6` on a finished 8-step run
    (the command line, the Prefect flow, torchrun): steps 6 and 8 move to a superseded branch, the run trains on
    from step 4 past the samples of steps 5 and 6, and the ledger says exactly that."""
    from tasks.trace.ledger import ledger
    from tasks.trace.run import open_run

    root = str(tmp_path / "root")
    first = smelt_train(REPO, corpus, root)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = json.loads(first.stdout)["url"]
    resumed = smelt_train(REPO, corpus, root, args=("--resume-from", "4", "--skip-steps", "5:6"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["url"] == run_dir and result["summary"]["resumed_from"] == 4
    assert [c["step"] for c in list_committed(run_dir)] == [2, 4, 6, 8]
    answer = ledger(open_run(run_dir))
    assert answer["exactly_once"] and answer["superseded_steps"] == [5, 6, 7, 8]
    assert [(b["branch"], b["from_step"], b["checkpoints"]) for b in answer["branches"]] == [(1, 4, [6, 8])]
    assert answer["skipped"] == [{"start": 32, "end": 48, "step": 5, "rolled_back_to": 4,
                                  "reason": "resume.skip_steps"}]
    assert answer["branches"][0]["skip_samples"] == [32, 48] and answer["trained_in_skipped_windows"] == []
