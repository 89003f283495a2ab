"""``--resume-from STEP`` (tasks/branches.py): a run continued from an older retained checkpoint on another
world size retrains the original trajectory's losses step for step; the checkpoints after STEP are kept as
a superseded branch that no reader of the run mistakes for its own; ``--skip-steps A:B`` skips exactly the
samples of those steps, as the ledger shows (CPU, gloo, fp32, a dropout-free model).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from tasks import branches
from tasks.checkpoint_reader import list_branches, list_committed, step_dirs
from tasks.config import from_dict, merge_overrides
from tasks.trace.ledger import ledger
from tasks.trace.report import render
from tasks.trace.run import open_run
from tasks.train.config import TrainConfig
from tasks.train.trainer import Trainer
from tests.tasks.train.ranks import one_thread, run_ranks
from tests.tasks.train.token_corpus import RESUME_RUN

STEPS, FROM = 8, 4
GLOBAL_BATCH = RESUME_RUN["data"]["global_batch"]
BASE = {**RESUME_RUN, "steps": STEPS, "checkpoint": {"interval_steps": 2, "keep_last": 10, "async_mode": "thread"}}


def config(overrides: list[str]) -> TrainConfig:
    return from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), overrides))


def _rank_train(rank: int, overrides: list[str], corpus: str, run_dir: str, branch: dict, out: str) -> None:
    branch = dict(branch)
    stop_after = branch.pop("stop_after", None)
    trainer = Trainer(config(overrides), {"corpus": corpus}, run_dir, **branch)
    try:
        summary = trainer.train(stop_after=stop_after)
    finally:
        trainer.close()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(summary, f)


def launch(world: int, overrides: list[str], corpus: str, run_dir: str, **branch) -> dict:
    """One launch on ``world`` gloo ranks (world 1: in this process); rank 0's summary."""
    out = os.path.join(run_dir, f"summary-{world}-{branch.get('resume_from')}")
    if world == 1:
        with one_thread():
            _rank_train(0, overrides, corpus, run_dir, branch, out)
    else:
        run_ranks(world, _rank_train, overrides, corpus, run_dir, branch, out)
    with open(f"{out}.rank0.json") as f:
        return json.load(f)


@pytest.mark.slow
def test_resume_from_an_older_checkpoint_on_another_world_size_retrains_the_same_losses_and_keeps_the_branch(
        corpus, tmp_path):
    run_dir = str(tmp_path / "run")
    original = launch(1, [], corpus, run_dir)
    assert original["steps"] == STEPS and len(original["losses"]) == STEPS
    original_ckpts = {c["step"]: c for c in list_committed(run_dir)}
    assert sorted(original_ckpts) == [2, 4, 6, 8]

    resumed = launch(2, ["parallel.dp_shard=2", f"snapshot.dir={tmp_path / 'shm'}"], corpus, run_dir,
                     resume_from=FROM)
    assert resumed["resumed_from"] == FROM and resumed["first_step"] == FROM + 1 and resumed["world_size"] == 2
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(original["losses"][FROM:]),
                               rtol=1e-4, atol=0)

    # The branch: steps 6 and 8 of the first trajectory, moved whole, still verified, listed as superseded.
    (branch,) = list_branches(run_dir)
    assert (branch["branch"], branch["from_step"], branch["steps"], branch["complete"]) == (1, FROM, [6, 8], True)
    assert [(c["step"], c["superseded"], c["world_size"]) for c in branch["checkpoints"]] == [(6, True, 1), (8, True, 1)]
    assert [c["loss"] for c in branch["checkpoints"]] == [original_ckpts[6]["loss"], original_ckpts[8]["loss"]]
    # The run's own checkpoints are one trajectory: 2 and 4 of the first launch, 6 and 8 of the second.
    own = list_committed(run_dir)
    assert [(c["step"], c["world_size"]) for c in own] == [(2, 1), (4, 1), (6, 2), (8, 2)]
    assert all("/branches/" not in c["url"] for c in own)

    # trace: the final trajectory is the resumed one, the first launch's steps 5..8 are branch 1's.
    run = open_run(run_dir)
    answer = ledger(run)
    assert answer["exactly_once"] and answer["samples"] == STEPS * GLOBAL_BATCH
    assert answer["superseded_steps"] == [5, 6, 7, 8]
    assert answer["branches"] == [{"branch": 1, "from_step": FROM, "steps": [5, 6, 7, 8], "checkpoints": [6, 8],
                                   "url": "branches/1", "skip_steps": None, "skip_samples": None}]
    assert {run.branch_of(r) for r in run.superseded} == {1}
    assert all(run.branch_of(r) is None for r in run.steps.values())
    assert "branch 1 (superseded, branches/1): left at step 4" in render(answer)


@pytest.mark.slow
def test_skip_steps_skips_exactly_their_samples_and_old_snapshots_never_restore(corpus, tmp_path):
    run_dir = str(tmp_path / "run")
    two = ["parallel.dp_shard=2", f"snapshot.dir={tmp_path / 'shm'}"]  # snapshots after every step, in memory
    # stopped at step 7, unfinished: its snapshots of steps 6 and 7 stay in the nodes' memory
    original = launch(2, two, corpus, run_dir, stop_after=STEPS - 1)
    assert original["steps"] == STEPS - 1 and list(step_dirs(run_dir)) == [2, 4, 6, 7]
    assert sorted(os.listdir(tmp_path / "shm" / os.listdir(tmp_path / "shm")[0]))[-1] == "step-00000007"
    resumed = launch(2, two, corpus, run_dir, resume_from=FROM, skip_steps=(6, 7))
    # the restore took step 4 from storage, not the newer snapshot of the abandoned step 7
    assert resumed["resumed_from"] == FROM and resumed["first_step"] == FROM + 1
    torch.testing.assert_close(torch.tensor(resumed["losses"][:1]), torch.tensor(original["losses"][FROM:FROM + 1]),
                               rtol=1e-4, atol=0)  # step 5 trains the same samples; 6.. then differ

    window = [(FROM + 1) * GLOBAL_BATCH, (FROM + 3) * GLOBAL_BATCH]  # what steps 6 and 7 would have trained on
    run = open_run(run_dir)
    assert [run.steps[s]["samples"] for s in range(FROM + 1, STEPS + 1)] == [
        [32, 40], [56, 64], [64, 72], [72, 80]]
    answer = ledger(run)
    assert answer["exactly_once"], answer
    assert answer["skipped"] == [{"start": window[0], "end": window[1], "step": 6, "rolled_back_to": FROM,
                                  "reason": branches.SKIP_REASON}]
    assert answer["counts"] == {"0": 2 * GLOBAL_BATCH, "1": STEPS * GLOBAL_BATCH}
    assert answer["trained_in_skipped_windows"] == [] and answer["never_trained"] == []
    assert answer["branches"][0]["skip_samples"] == window and answer["branches"][0]["skip_steps"] == [6, 7]


def test_a_step_that_is_not_a_retained_checkpoint_is_refused_in_one_sentence(corpus, tmp_path):
    run_dir = str(tmp_path / "run")
    launch(1, ["steps=4"], corpus, run_dir)
    with one_thread(), pytest.raises(ValueError, match=r"--resume-from 3: .* is not a committed, intact checkpoint "
                                                      r"\(step folders here: 2, 4\)"):
        Trainer(config(["steps=4"]), {"corpus": corpus}, run_dir, resume_from=3)
    assert branches.read(run_dir) == [] and sorted(step_dirs(run_dir)) == [2, 4]


def test_requests_are_checked_before_any_rank_starts():
    assert branches.parse_skip_steps("6:9") == (6, 9) and branches.parse_skip_steps("6") == (6, 6)
    for bad in ("9:6", "a:b", "0:3"):
        with pytest.raises(ValueError, match="is not A:B"):
            branches.parse_skip_steps(bad)
    with pytest.raises(ValueError, match="needs --resume-from"):
        branches.check_request(None, (6, 7))
    with pytest.raises(ValueError, match="must name steps after --resume-from 6"):
        branches.check_request(6, (5, 7))


def test_skip_window_counts_the_steps_before_it_and_the_windows_already_skipped():
    # at sample 32 after step 4: step 5 takes [32, 40), so steps 6..7 are [40, 56)
    assert branches.skip_window(32, 4, (6, 7), 8, []) == (40, 56)
    # a loss-guard window at [40, 48) moves step 6 past it first
    assert branches.skip_window(32, 4, (6, 7), 8, [(40, 48)]) == (48, 64)


def _commit(fs, path: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        fs.pipe_file(f"{path}/{name}", data)


def test_a_move_on_an_object_store_commits_the_copy_before_uncommitting_the_source_and_finishes_after_a_crash():
    import fsspec

    fs = fsspec.filesystem("memory")
    run = "memory://branch-move/run"
    root = "/branch-move/run/checkpoints"
    for step in (2, 4, 6, 8):
        _commit(fs, f"{root}/step-{step:08d}", {"__0_0.distcp": b"x" * step, ".metadata": b"m", "manifest.json": b"{}"})
    fs.pipe_file(f"{root}/step-00000010/__0_0.distcp", b"crashed save")  # uncommitted
    record = branches.declare(run, 4, {s: f"{run}/checkpoints/step-{s:08d}" for s in (6, 8, 10)}, {6, 8},
                              skip_steps=None, request="flow-run-1", epoch=None, group=1)
    assert record["steps"] == [6, 8] and record["complete"]
    assert sorted(fs.ls(root, detail=False)) == [f"{root}/step-00000002", f"{root}/step-00000004"]
    assert fs.cat_file("/branch-move/run/branches/1/checkpoints/step-00000008/__0_0.distcp") == b"x" * 8
    assert fs.exists("/branch-move/run/branches/1/checkpoints/step-00000008/manifest.json")
    # the same request again (a retried launch) is served; another request is not
    assert branches.served(branches.read(run), 4, None, request="flow-run-1", epoch=None, restarted=False) == record
    assert branches.served(branches.read(run), 4, None, request="flow-run-2", epoch=None, restarted=False) is None

    # a crash after step 6's copy committed and its source lost its manifest, before the rest: finish() completes
    _commit(fs, f"{root}/step-00000012", {"__0_0.distcp": b"y", "manifest.json": b"{}"})
    _commit(fs, "/branch-move/run/branches/2/checkpoints/step-00000012", {"__0_0.distcp": b"y", "manifest.json": b"{}"})
    fs.rm(f"{root}/step-00000012/manifest.json")
    _commit(fs, f"{root}/step-00000014", {"__0_0.distcp": b"z", "manifest.json": b"{}"})
    crashed = {**record, "branch": 2, "from_step": 4, "steps": [12, 14], "url": "branches/2", "complete": False}
    branches.write(run, [record, crashed])
    done = branches.finish(run, crashed)
    assert done["complete"] and branches.read(run)[1]["complete"]
    assert sorted(fs.ls(root, detail=False)) == [f"{root}/step-00000002", f"{root}/step-00000004"]
    assert fs.cat_file("/branch-move/run/branches/2/checkpoints/step-00000014/__0_0.distcp") == b"z"
    assert fs.exists("/branch-move/run/branches/2/checkpoints/step-00000012/manifest.json")
