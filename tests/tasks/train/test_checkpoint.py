"""Checkpoints: round trips, async blocking, the staging race, the commit protocol, retention, resharding."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from tasks import contract, eval_holds
from tasks.checkpoint_reader import list_committed, step_url, verify_checkpoint
from tasks.train import checkpoint_writer as checkpoint_module
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState, RNGState
from tasks.train.config import CheckpointConfig

REPO = Path(__file__).resolve().parents[3]
# DCP warns on every single-process save/load and on rewriting a step; both are intended here.
pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")]


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.hidden = nn.Linear(16, 16)
        self.out = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(tokens))))


class Progress:
    """The trainer's TrainState in miniature: plain ints go through DCP as objects."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step, self.tokens = int(state_dict["step"]), int(state_dict["tokens"])


class Blob:
    """Plain tensors to checkpoint, sized for timing tests."""

    def __init__(self, count: int, numel: int) -> None:
        self.tensors = [torch.full((numel,), float(i)) for i in range(count)]

    def state_dict(self) -> dict:
        return {f"t{i}": t for i, t in enumerate(self.tensors)}

    def load_state_dict(self, state_dict: dict) -> None:
        for i, t in enumerate(self.tensors):
            t.copy_(state_dict[f"t{i}"])


def manager(run_dir, mode="off", fingerprint="fp", **cfg) -> CheckpointManager:
    return CheckpointManager(str(run_dir), CheckpointConfig(async_mode=mode, **cfg), rank=0, world_size=1,
                             config_fingerprint=fingerprint)


def train(run_dir, *, steps: int, mode: str, stop_at: int | None = None, resume: bool = False) -> TinyNet:
    """A tiny run whose batches draw on Python, NumPy and torch RNGs, checkpointing every 2 steps."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=4)
    progress = Progress()
    app = {"model_optim": ModelOptimState(model, opt), "sched": sched, "train": progress, "rng": RNGState(0, seed=0)}
    mgr = manager(run_dir, mode, interval_steps=2, keep_last=3)
    if resume:
        mgr.load(app)
    while progress.step < steps:
        tokens = (torch.randint(0, 32, (4, 6)) + int(np.random.randint(0, 2)) + random.randint(0, 1)) % 32
        loss = nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        mgr.wait_for_staging()
        opt.step()
        opt.zero_grad()
        sched.step()
        progress.step += 1
        progress.tokens += tokens.numel()
        mgr.maybe_save(progress.step, app, {"loss": loss.item(), "tokens": progress.tokens})
        if progress.step == stop_at:
            break
    mgr.close()
    return model


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Unsharded model and optimizer tensors under stable names (identical for FSDP and plain modules)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=True)
    out = {f"model.{k}": v for k, v in get_model_state_dict(model, options=options).items()}
    out.update({f"optim.{k}": v for k, v in get_optimizer_state_dict(model, opt, options=options).items()
                if isinstance(v, torch.Tensor)})
    return out


def assert_bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


# --------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("mode", ["off", "thread"])
def test_resumed_run_ends_bitwise_equal_to_uninterrupted_run(tmp_path, mode):
    reference = train(tmp_path / "straight", steps=4, mode=mode)
    train(tmp_path / "interrupted", steps=4, mode=mode, stop_at=2)
    resumed = train(tmp_path / "interrupted", steps=4, mode=mode, resume=True)
    assert_bitwise_equal(resumed.state_dict(), reference.state_dict())


def test_round_trip_restores_model_optimizer_progress_and_rng(tmp_path):
    torch.manual_seed(1)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 32, (2, 5))).sum().backward()
    opt.step()
    progress = Progress()
    progress.step, progress.tokens = 7, 700
    app = {"model_optim": ModelOptimState(model, opt), "train": progress, "rng": RNGState(0, seed=3)}
    mgr = manager(tmp_path)
    assert mgr.maybe_save(7, app, {"tokens": 700, "loss": 2.5, "layout": {"dp_shard": 1}}, force=True)
    mgr.close()
    expected_draws = (random.random(), float(np.random.rand()), torch.rand(3))

    fresh, fresh_progress = TinyNet(), Progress()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    meta = manager(tmp_path).load({"model_optim": ModelOptimState(fresh, fresh_opt), "train": fresh_progress,
                                   "rng": RNGState(0, seed=3)})

    assert_bitwise_equal(full_state(fresh, fresh_opt), full_state(model, opt))
    assert (fresh_progress.step, fresh_progress.tokens) == (7, 700)
    assert random.random() == expected_draws[0]
    assert float(np.random.rand()) == expected_draws[1]
    assert torch.equal(torch.rand(3), expected_draws[2])
    assert meta["step"] == 7 and meta["tokens"] == 700 and meta["loss"] == 2.5
    assert meta["layout"] == {"dp_shard": 1} and meta["world_size"] == 1
    assert meta["model_prefix"] == "model_optim.model."


def test_memory_url_run_dir_round_trips_through_fsspec(tmp_path):
    run_dir = f"memory://ckpt-{time.monotonic_ns()}"
    blob = Blob(2, 10)
    mgr = manager(run_dir, "thread")
    mgr.maybe_save(5, {"blob": blob}, {"tokens": 1}, force=True)
    mgr.close()
    loaded = Blob(2, 10)
    for t in loaded.tensors:
        t.zero_()
    assert manager(run_dir).load({"blob": loaded})["step"] == 5
    assert_bitwise_equal(loaded.state_dict(), blob.state_dict())
    assert [c["step"] for c in list_committed(run_dir)] == [5]


# --------------------------------------------------------------------------------------------
# Async saving


def test_async_save_blocks_training_less_than_a_sync_save(tmp_path):
    blob = Blob(4, 1 << 20)  # 16 MB
    sync = manager(tmp_path / "sync", "off")
    started = time.monotonic()
    sync.maybe_save(1, {"blob": blob}, {}, force=True)
    sync_s = time.monotonic() - started
    sync.close()

    background = manager(tmp_path / "async", "thread")
    started = time.monotonic()
    background.maybe_save(1, {"blob": blob}, {}, force=True)
    background.wait_for_staging()
    async_blocking_s = time.monotonic() - started
    background.close()

    assert async_blocking_s < sync_s
    assert verify_checkpoint(step_url(str(tmp_path / "async"), 1)) == []


@pytest.mark.parametrize("wait", [False, True], ids=["mutate_during_staging", "wait_for_staging_first"])
def test_changing_state_during_staging_corrupts_the_save_and_waiting_prevents_it(tmp_path, wait):
    blob = Blob(8, 1 << 10)
    snapshot = [t.clone() for t in blob.tensors]
    mgr = manager(tmp_path, "thread")
    # The race is controlled, not timed: the stager's single worker thread is held until the test
    # releases it, so staging runs strictly after (or, with waiting, strictly before) the step.
    gate = threading.Event()
    mgr._stager._staging_executor.submit(gate.wait, 60)
    mgr.maybe_save(1, {"blob": blob}, {}, force=True)
    if wait:
        gate.set()
        mgr.wait_for_staging()
    for t in blob.tensors:  # an optimizer step
        t.add_(1.0)
    gate.set()
    mgr.close()

    loaded = Blob(8, 1 << 10)
    manager(tmp_path).load({"blob": loaded})
    corrupted = sum(not torch.equal(got, want) for got, want in zip(loaded.tensors, snapshot))
    # Without waiting, the checkpoint holds parameters from after the step it claims.
    assert corrupted == (0 if wait else len(snapshot))


def test_saves_every_interval_steps_and_when_forced(tmp_path):
    mgr = manager(tmp_path, interval_steps=3)
    saved = [step for step in range(1, 8) if mgr.maybe_save(step, {"p": Progress()}, {}, force=step == 7)]
    mgr.close()
    assert saved == [3, 6, 7]


class FakeClock:
    """``time`` for the checkpoint module, with a ``monotonic`` that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_saves_when_interval_minutes_elapsed(tmp_path, monkeypatch):
    """The interval runs from the manager's start, then from each save's end, on a clock the test holds: a slow
    save or a loaded machine cannot move it."""
    clock = FakeClock()
    monkeypatch.setattr(checkpoint_module, "time", clock)
    mgr = manager(tmp_path, interval_steps=0, interval_minutes=1)
    clock.now += 59
    assert not mgr.maybe_save(1, {"p": Progress()}, {})
    clock.now += 1
    assert mgr.maybe_save(2, {"p": Progress()}, {})
    clock.now += 59
    assert not mgr.maybe_save(3, {"p": Progress()}, {})
    clock.now += 1
    assert mgr.maybe_save(4, {"p": Progress()}, {})
    mgr.close()
    assert [c["step"] for c in list_committed(str(tmp_path))] == [2, 4]


def test_meta_that_is_not_json_is_a_clear_error(tmp_path):
    mgr = manager(tmp_path)
    with pytest.raises(ValueError, match="JSON-able"):
        mgr.maybe_save(1, {"p": Progress()}, {"loss": torch.tensor(1.0)}, force=True)
    mgr.close()


# --------------------------------------------------------------------------------------------
# Commit protocol


def save_steps(run_dir, steps, **cfg) -> None:
    mgr = manager(run_dir, **cfg)
    for step in steps:
        mgr.maybe_save(step, {"blob": Blob(2, 64)}, {"tokens": step * 10, "loss": 1.0 / step}, force=True)
    mgr.close()


def test_manifest_lists_every_dcp_file_with_size_and_checksum(tmp_path):
    save_steps(tmp_path, [2])
    url = step_url(str(tmp_path), 2)
    manifest = contract.read_manifest(url)
    files = sorted(p.name for p in Path(url.removeprefix("file://")).iterdir() if p.name != "manifest.json")
    assert manifest.kind == "checkpoint" and manifest.fingerprint == "fp"
    assert sorted(s.name for s in manifest.shards) == files == [".metadata", "__0_0.distcp"]
    assert contract.verify(manifest) == []
    assert manifest.meta["step"] == 2 and manifest.meta["tokens"] == 20
    assert manifest.stats["checkpoint.bytes"] == sum(s.bytes for s in manifest.shards)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "bytes, manifest says"),
    ("flip", "checksum differs"),
    ("delete", "missing"),
    ("no_manifest", "did not commit"),
    ("bad_manifest", "unreadable manifest.json"),
])
def test_damaged_checkpoint_is_detected_and_skipped_for_the_previous_one(tmp_path, caplog, damage, reason):
    save_steps(tmp_path, [2, 4])
    folder = Path(step_url(str(tmp_path), 4).removeprefix("file://"))
    shard = folder / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "flip":
        flip_byte(shard, shard.stat().st_size // 2)
    elif damage == "delete":
        shard.unlink()
    elif damage == "no_manifest":
        (folder / "manifest.json").unlink()
    else:
        (folder / "manifest.json").write_text((folder / "manifest.json").read_text()[:100])

    assert any(reason in p for p in verify_checkpoint(step_url(str(tmp_path), 4)))
    mgr = manager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tasks.train.checkpoint_writer"):
        assert mgr.latest_step() == 2
    assert "step-00000004 skipped" in caplog.text and reason in caplog.text
    blob = Blob(2, 64)
    assert mgr.load({"blob": blob})["step"] == 2
    assert [c["step"] for c in list_committed(str(tmp_path))] == [2]
    with pytest.raises(contract.DatasetError, match="missing or corrupt"):
        mgr.load({"blob": blob}, step=4)
    mgr.close()


def test_cheap_verification_checks_sizes_but_not_checksums(tmp_path):
    save_steps(tmp_path, [2, 4])
    flip_byte(Path(step_url(str(tmp_path), 4).removeprefix("file://")) / "__0_0.distcp", 0)
    shard = Path(step_url(str(tmp_path), 2).removeprefix("file://")) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes() + b"!")
    assert [c["step"] for c in list_committed(str(tmp_path), checksums=False)] == [4]
    assert list_committed(str(tmp_path)) == []


def test_list_committed_reports_step_url_tokens_and_loss_newest_last(tmp_path):
    save_steps(tmp_path, [1, 2])
    common = {"world_size": 1, "config_fingerprint": "fp"}
    assert list_committed(str(tmp_path)) == [
        {"step": 1, "url": step_url(str(tmp_path), 1), "tokens": 10, "loss": 1.0, **common},
        {"step": 2, "url": step_url(str(tmp_path), 2), "tokens": 20, "loss": 0.5, **common},
    ]


def test_no_checkpoint_is_a_clear_error(tmp_path):
    mgr = manager(tmp_path)
    assert mgr.latest_step() is None
    with pytest.raises(contract.DatasetError, match="no committed checkpoint"):
        mgr.load({"blob": Blob(1, 1)})
    mgr.close()


def test_loading_a_checkpoint_of_a_different_config_is_refused(tmp_path):
    save_steps(tmp_path, [1])
    mgr = manager(tmp_path, fingerprint="other")
    with pytest.raises(ValueError, match="config fingerprint fp, this run has other"):
        mgr.load({"blob": Blob(2, 64)})
    mgr.close()


# --------------------------------------------------------------------------------------------
# Retention


def step_folders(run_dir) -> list[int]:
    return sorted(int(p.name.removeprefix("step-")) for p in (Path(run_dir) / "checkpoints").iterdir())


def test_retention_keeps_the_last_k_and_every_nth(tmp_path):
    save_steps(tmp_path, range(1, 11), keep_last=2, keep_every=4)
    assert step_folders(tmp_path) == [4, 8, 9, 10]
    assert [c["step"] for c in list_committed(str(tmp_path))] == [4, 8, 9, 10]


def test_retention_keeps_a_checkpoint_held_for_its_eval_until_released_or_expired(tmp_path):
    """keep_last=1 with an eval hold on step 1 (published, its triggered eval not yet run): step 1 outlives
    steps 2 and 3; released, the next save's retention deletes it. An expired hold keeps nothing."""
    save_steps(tmp_path, [1], keep_last=1)
    eval_holds.hold(str(tmp_path), 1, minutes=30)
    eval_holds.hold(str(tmp_path), 2, minutes=30, now=time.time() - 3600)  # expired an hour ago
    save_steps(tmp_path, [2, 3], keep_last=1)
    assert step_folders(tmp_path) == [1, 3]
    eval_holds.release(str(tmp_path), 1)
    save_steps(tmp_path, [4], keep_last=1)
    assert step_folders(tmp_path) == [4]
    assert eval_holds.held_steps(str(tmp_path)) == set()


def test_retention_removes_crashed_saves_and_an_abandoned_future(tmp_path):
    save_steps(tmp_path, [20], keep_last=2)
    crashed = Path(tmp_path) / "checkpoints" / "step-00000003"
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"half")
    save_steps(tmp_path, [5], keep_last=2)  # e.g. a rollback to step 4 that saved step 5
    assert step_folders(tmp_path) == [5]


def test_rewriting_a_step_replaces_its_files_and_manifest(tmp_path):
    save_steps(tmp_path, [3])
    stale = Path(step_url(str(tmp_path), 3).removeprefix("file://")) / "__1_0.distcp"
    stale.write_bytes(b"from a run with more ranks")
    save_steps(tmp_path, [3])
    assert verify_checkpoint(step_url(str(tmp_path), 3)) == []
    assert not stale.exists()


# --------------------------------------------------------------------------------------------
# RNG


def test_reseed_is_deterministic_per_step_and_distinct_per_rank():
    def draws(rank: int, step: int) -> tuple:
        RNGState(rank, seed=5).reseed(step)
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    assert draws(0, 10) == draws(0, 10)
    assert draws(0, 10) != draws(1, 10)
    assert draws(0, 10) != draws(0, 11)


# --------------------------------------------------------------------------------------------
# Faults and multi-process (slow)

CRASH_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from tasks.train.checkpoint_writer import CheckpointManager
    from tasks.train.config import CheckpointConfig
    from tasks.train.faults import FaultInjector, parse_faults

    class Blob:
        def __init__(self): self.t = torch.arange(1000.0)
        def state_dict(self): return {"t": self.t}
        def load_state_dict(self, sd): self.t.copy_(sd["t"])

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    faults = FaultInjector(parse_faults("crash_in_save:step=4"), sys.argv[1], rank=0)  # as the trainer wires it
    mgr = CheckpointManager(sys.argv[1], CheckpointConfig(async_mode="process", keep_last=1), rank=0,
                            world_size=1, config_fingerprint="fp", on_written=faults.on_checkpoint_written)
    for step in (2, 4):
        faults.on_save_start(step)
        mgr.maybe_save(step, {"blob": Blob()}, {"tokens": step}, force=True)
    mgr.close()
    print("survived")
""")


@pytest.mark.slow
def test_crash_in_save_leaves_an_uncommitted_checkpoint_that_is_skipped_and_keeps_the_previous(tmp_path):
    """keep_last=1, yet step 2 survives: retention deletes only after a newer checkpoint committed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "survived" not in proc.stdout
    crashed = Path(step_url(str(tmp_path), 4).removeprefix("file://"))
    assert (crashed / "__0_0.distcp").exists() and (crashed / ".metadata").exists()
    assert not (crashed / "manifest.json").exists()
    url = step_url(str(tmp_path), 4)
    assert verify_checkpoint(url) == [f"{url}: no manifest.json (the save did not commit)"]
    mgr = manager(tmp_path)
    assert mgr.latest_step() == 2
    mgr.close()


def _fsdp_worker(rank: int, run_dir: str, work: str) -> None:
    """Rank of a 2-process FSDP2 job: load the 1-rank checkpoint (1 → 2), check it, train a step, save."""
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{work}/store", rank=rank, world_size=2)
    try:
        torch.manual_seed(100)  # different init from the checkpoint: the load must overwrite it
        model = TinyNet()
        for layer in (model.embed, model.hidden, model.out):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        app = {"model_optim": ModelOptimState(model, opt), "rng": RNGState(rank, seed=0)}
        mgr = CheckpointManager(run_dir, CheckpointConfig(async_mode="thread"), rank=rank, world_size=2,
                                config_fingerprint="fp")
        assert mgr.load(app)["step"] == 1
        loaded = full_state(model, opt)
        if rank == 0:
            assert_bitwise_equal(loaded, torch.load(f"{work}/one_rank.pt"))
        tokens = torch.arange(12).reshape(2, 6) % 32
        model(tokens).sum().backward()
        mgr.wait_for_staging()
        opt.step()
        assert mgr.maybe_save(2, app, {"tokens": 2}, force=True)
        mgr.close()
        saved = full_state(model, opt)
        if rank == 0:
            torch.save(saved, f"{work}/two_ranks.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_checkpoint_reshards_from_one_rank_to_two_and_back(tmp_path):
    run_dir, work = str(tmp_path / "run"), str(tmp_path)
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.arange(10).reshape(2, 5)).sum().backward()
    opt.step()
    mgr = manager(run_dir)
    mgr.maybe_save(1, {"model_optim": ModelOptimState(model, opt), "rng": RNGState(0, seed=0)}, {}, force=True)
    mgr.close()
    torch.save(full_state(model, opt), f"{work}/one_rank.pt")

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fsdp_worker, args=(rank, run_dir, work)) for rank in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 150
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]

    manifest = contract.read_manifest(step_url(run_dir, 2))
    assert manifest.meta["world_size"] == 2
    assert {s.name for s in manifest.shards} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    fresh = TinyNet()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    rng = RNGState(0, seed=0)
    meta = manager(run_dir).load({"model_optim": ModelOptimState(fresh, fresh_opt), "rng": rng})
    assert meta["step"] == 2
    assert_bitwise_equal(full_state(fresh, fresh_opt), torch.load(f"{work}/two_ranks.pt"))
    after_reseed = random.random()
    rng.reseed(2)  # saved by 2 ranks, loaded by 1: the RNG was reseeded, not restored
    assert random.random() == after_reseed


def test_a_step_folder_names_its_run_folder_and_anything_else_is_refused():
    from tasks.checkpoint_reader import relative_step, run_dir_of, step_of

    assert run_dir_of("s3://bucket/runs/a/checkpoints/step-00000004/") == "s3://bucket/runs/a"
    assert step_of("s3://bucket/runs/a/checkpoints/step-00000004/") == 4
    assert step_of("s3://bucket/runs/a") is None and step_of("s3://bucket/runs/a/step-00000004") is None
    assert relative_step(4) == "checkpoints/step-00000004"
    with pytest.raises(contract.DatasetError, match="is not a checkpoint folder"):
        run_dir_of("s3://bucket/runs/a")


def test_loading_into_a_fresh_optimizer_with_gradients_pending_restores_its_moments(tmp_path):
    """torch's _init_optim_state leaves a fresh optimizer without state while any gradient is set, and the load
    then breaks or drops the saved moments; CheckpointManager.load discards pending gradients first."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    mgr = manager(tmp_path)
    mgr.maybe_save(1, {"model_optim": ModelOptimState(model, optim)}, {}, force=True)
    fresh = torch.nn.Linear(4, 4)
    fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    for p in fresh.parameters():
        p.grad = torch.ones_like(p)
    mgr.load({"model_optim": ModelOptimState(fresh, fresh_optim)}, step=1)
    mgr.close()
    for want, got in zip(optim.state_dict()["state"].values(), fresh_optim.state_dict()["state"].values()):
        assert set(got) == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(want[k], got[k]) for k in got)
    assert all(p.grad is None for p in fresh.parameters())
