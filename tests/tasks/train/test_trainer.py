"""The trainer on one process: batch arithmetic, metrics and summary, exact resume, accumulation,
activation checkpointing, the dry-run description."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from tasks import checkpoint_reader, contract, storage
from tasks.checkpoint_reader import list_committed
from tasks.config import from_dict, merge_overrides
from tasks.eval.evaluate import load_model
from tasks.model_config import preset
from tasks.train.callbacks import Callback
from tasks.train.config import DataConfig, ParallelConfig, TrainConfig
from tasks.train.parallel_dims import ParallelDims
from tasks.train.trainer import Trainer, config_fingerprint, describe_layout, plan_batches

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tasks/train/conftest.py

BASE = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 1e-2, "warmup_steps": 1},
    "checkpoint": {"interval_steps": 2, "async_mode": "off"},
}


@pytest.fixture(scope="module")
def corpus(corpus) -> dict[str, str]:  # conftest.py's corpus, by name
    return {"corpus": corpus}


def config(*overrides: str) -> TrainConfig:
    return from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), list(overrides)))


def train(corpus, run_dir, *overrides: str, stop_after: int | None = None) -> dict:
    with Trainer(config(*overrides), corpus, str(run_dir)) as trainer:
        return trainer.train(stop_after=stop_after)


def dims(world: int, **degrees) -> ParallelDims:
    return ParallelDims.from_config(ParallelConfig(**degrees), world)


# -- batch arithmetic ---------------------------------------------------------------------------------


def test_accumulation_follows_from_the_data_parallel_size():
    plan = plan_batches(DataConfig(seq_len=32, global_batch=16, micro_batch=2), dims(8, tp=2), 0, 1)
    assert (plan.local_batch, plan.micro_batch, plan.grad_accum) == (4, 2, 2)
    assert plan.tokens_per_step == 512 and plan.tokens_per_rank_step == 128


def test_pipeline_microbatches_default_to_one_per_stage():
    plan = plan_batches(DataConfig(global_batch=8), dims(4, pp=2), 0, 2)
    assert (plan.local_batch, plan.grad_accum, plan.pp_microbatches) == (4, 1, 4)


def test_a_micro_batch_that_does_not_divide_the_rank_batch_is_refused():
    with pytest.raises(ValueError, match="data.micro_batch \\(4\\) must divide the per-rank batch \\(6"):
        plan_batches(DataConfig(global_batch=12, micro_batch=4), dims(2), 0, 1)


def test_a_micro_batch_that_does_not_divide_the_global_batch_is_refused_at_load():
    with pytest.raises(ValueError, match="data.micro_batch \\(3\\) must divide data.global_batch \\(8\\)"):
        DataConfig(global_batch=8, micro_batch=3)


def test_pipeline_microbatches_must_split_the_micro_batch():
    with pytest.raises(ValueError, match="must split into parallel.pp_microbatches \\(3\\)"):
        plan_batches(DataConfig(global_batch=8), dims(2, pp=2), 3, 1)


# -- runs -------------------------------------------------------------------------------------------------


def test_a_run_logs_every_step_and_ends_with_a_summary_and_a_checkpoint(corpus, tmp_path):
    summary = train(corpus, tmp_path, "steps=3")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_gib"):
        assert all(r[key] > 0 for r in records), key
    assert records[-1]["tokens"] == 3 * 8 * 16
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["steps"] == 3 and written["tokens"] == 384 and written["last_loss"] == records[-1]["loss"]
    assert [c["step"] for c in list_committed(str(tmp_path))] == [2, 3]  # interval 2, and the end


def test_a_stopped_run_resumes_to_the_same_losses(corpus, tmp_path):
    straight = train(corpus, tmp_path / "straight", "steps=5")
    first = train(corpus, tmp_path / "resumed", "steps=5", stop_after=3)
    second = train(corpus, tmp_path / "resumed", "steps=5")
    assert second["resumed_from"] == 3 and second["first_step"] == 4
    assert first["losses"] + second["losses"] == straight["losses"]


def test_a_resume_with_another_global_batch_is_refused(corpus, tmp_path):
    train(corpus, tmp_path, "steps=2")
    with pytest.raises(ValueError, match="global batch changed"):
        Trainer(config("steps=4", "data.global_batch=16"), corpus, str(tmp_path))


def test_gradient_accumulation_trains_like_one_big_batch(corpus, tmp_path):
    whole = train(corpus, tmp_path / "whole", "steps=3")
    accumulated = train(corpus, tmp_path / "accum", "steps=3", "data.micro_batch=2")
    torch.testing.assert_close(torch.tensor(accumulated["losses"]), torch.tensor(whole["losses"]), rtol=1e-5, atol=0)
    assert accumulated["batch"]["grad_accum"] == 4


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_leaves_the_losses_unchanged(corpus, tmp_path, mode):
    plain = train(corpus, tmp_path / "plain", "steps=2")
    checkpointed = train(corpus, tmp_path / mode, "steps=2", f"parallel.activation_checkpoint={mode}")
    assert checkpointed["losses"] == plain["losses"]


@pytest.mark.slow
def test_compiled_blocks_under_full_recomputation_train_as_eager_ones_do(corpus, tmp_path):
    """What `smelt plan --compile` plans: each checkpointed block compiled, so its recomputation is the
    partitioner's (tests/infra/test_selective_policy.py: it skips w2), with the eager run's losses."""
    eager = train(corpus, tmp_path / "eager", "steps=2", "parallel.activation_checkpoint=full")
    compiled = train(corpus, tmp_path / "compiled", "steps=2", "parallel.activation_checkpoint=full",
                     "parallel.compile=true")
    torch.testing.assert_close(torch.tensor(compiled["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)


# -- identity and dry run ---------------------------------------------------------------------------------


def test_config_fingerprint_ignores_the_layout_but_not_the_batch_contract():
    """The trainer's resume check is the run identity (tasks/train/identity.py; tests/tasks/train/test_identity.py)."""
    model = preset("tiny", vocab_size=64)
    base = config_fingerprint(model, DataConfig(global_batch=8, micro_batch=0), {"web": "fp1"}, seed=0)
    assert config_fingerprint(model, DataConfig(global_batch=8, micro_batch=2, prefetch=5), {"web": "fp1"}, seed=0) == base
    assert config_fingerprint(model, DataConfig(global_batch=16), {"web": "fp1"}, seed=0) != base
    assert config_fingerprint(model, DataConfig(global_batch=8), {"web": "fp2"}, seed=0) != base
    assert config_fingerprint(model, DataConfig(global_batch=8), {"web": "fp1"}, seed=1) != base


def test_dry_run_describes_a_70b_layout_without_building_it():
    cfg = from_dict(TrainConfig, {"model_preset": "70b", "parallel": {"pp": 4, "tp": 8},
                                  "data": {"seq_len": 8192, "global_batch": 512, "micro_batch": 8}})
    report = describe_layout(cfg, world_size=512, vocab_size=128256)
    assert report["layout"] == "pp=4 × dp_replicate=1 × dp_shard=16 × tp=8"
    assert report["batch"]["local_batch"] == 32 and report["batch"]["grad_accum"] == 4
    assert report["batch"]["pp_microbatches"] == 4
    # 20 of 80 layers plus the output layer on the last stage, split 8 × 16 ways: ~142M per rank.
    assert report["per_rank"]["params"] == pytest.approx(70.55e9 / 4 / 128, rel=0.05)


def test_dry_run_refuses_heads_that_tensor_parallel_cannot_split():
    cfg = from_dict(TrainConfig, {"parallel": {"tp": 3}, "data": {"global_batch": 3, "seq_len": 12}})
    with pytest.raises(ValueError, match="model.n_heads \\(4\\) must be divisible by parallel.tp \\(3\\)"):
        describe_layout(cfg, world_size=3, vocab_size=99)


def test_the_corpus_fixture_is_a_complete_tokens_dataset(corpus):
    manifest = contract.open_dataset(corpus["corpus"], kind="tokens")
    assert manifest.meta["vocab_size"] == 256 and not contract.verify(manifest)


# -- a run folder is self-contained: moved, it resumes and evaluates; a bad final checkpoint is never the result --


def finish(run_dir) -> contract.Manifest:
    """What the train flow commits when a launch ends: the run's manifest naming its final checkpoint."""
    final = list_committed(str(run_dir))[-1]
    return contract.commit(str(run_dir), kind="model", fp="run-fp", shards=[], stats={},
                           meta={"checkpoint": checkpoint_reader.relative_step(final["step"]), "step": final["step"]})


def test_a_moved_run_folder_resumes_and_evaluates_where_it_now_is(corpus, tmp_path):
    first = train(corpus, tmp_path / "old", "steps=4", stop_after=2)
    finish(tmp_path / "old")
    shutil.move(tmp_path / "old", tmp_path / "new")

    step_url = checkpoint_reader.resolve(str(tmp_path / "new"))
    assert step_url == storage.normalize_url(str(tmp_path / "new" / "checkpoints" / "step-00000002"))
    model, meta = load_model(step_url)  # eval's loader
    assert meta["step"] == 2 and sum(p.numel() for p in model.parameters()) > 0

    resumed = train(corpus, tmp_path / "new", "steps=4")
    straight = train(corpus, tmp_path / "straight", "steps=4")
    assert resumed["resumed_from"] == 2 and first["losses"] + resumed["losses"] == straight["losses"]
    assert not (tmp_path / "old").exists()


def test_a_truncated_final_checkpoint_is_never_named_as_the_result(corpus, tmp_path):
    train(corpus, tmp_path, "steps=4")
    finish(tmp_path)
    data_file = next((tmp_path / "checkpoints" / "step-00000004").glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])

    assert checkpoint_reader.finished_run(str(tmp_path)) is None  # the flow trains again instead of reusing it
    with pytest.raises(contract.DatasetError, match="step-00000004 fails verification"):
        checkpoint_reader.resolve(str(tmp_path))  # eval and export resolve through this
    resumed = train(corpus, tmp_path, "steps=4")  # and the relaunch rewrites it from the newest good one
    assert resumed["resumed_from"] == 2 and not checkpoint_reader.verify_checkpoint(
        checkpoint_reader.step_url(str(tmp_path), 4))


class Recorder(Callback):
    """Records which hook ran at which step."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_step_start(self, step, checkpointer):
        self.calls.append(("step_start", step))

    def on_loss(self, step, loss, params):
        self.calls.append(("loss", step))
        return loss

    def on_step_end(self, step, compute_s):
        self.calls.append(("step_end", step))

    def on_save_start(self, step):
        self.calls.append(("save_start", step))

    def on_save_end(self, step, started, checkpointer):
        self.calls.append(("saved" if started else "not_saved", step))


def test_callbacks_see_every_step_in_order(corpus, tmp_path):
    recorder = Recorder()
    with Trainer(config("steps=2", "checkpoint.interval_steps=2"), corpus, str(tmp_path), callbacks=[recorder]) as t:
        t.train()
    per_step = ["step_start", "loss", "step_end", "save_start"]
    assert recorder.calls == [(c, 1) for c in per_step] + [("not_saved", 1)] + [(c, 2) for c in per_step] + [("saved", 2)]
