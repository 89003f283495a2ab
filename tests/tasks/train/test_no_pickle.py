"""Nothing unpickles: a payload planted in any serialized part of a checkpoint never runs.

Each test starts from a real committed checkpoint, plants a pickle payload (one that would create
a file when unpickled) where the checkpoint holds serialized objects, rewrites the manifest's sizes
and checksums to match (as anyone who can write the folder could), and shows that resume
(``CheckpointManager.load``), eval's loader and export all refuse it with a clear error, and that
the payload's file never appears.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tasks import checkpoint_reader, contract, storage
from tasks.checksums import file_checksum
from tasks.checkpoint_reader import UnsafeCheckpointError, step_url
from tasks.eval.evaluate import load_model
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState, storage_writer
from tasks.train.config import CheckpointConfig
from tasks.train.export import export_checkpoint

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")]

MODEL = preset("tiny", vocab_size=32, n_layers=1)


class Payload:
    """Unpickling this creates ``path``: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class Progress:
    def __init__(self) -> None:
        self.step, self.tokens = 0, 0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step, self.tokens = int(state_dict["step"]), int(state_dict["tokens"])


def app_state() -> dict:
    torch.manual_seed(0)
    model = Transformer(MODEL)
    model.init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 32, (1, 8))).sum().backward()
    opt.step()
    return {"model_optim": ModelOptimState(model, opt), "train": Progress()}


def manager(run_dir: Path) -> CheckpointManager:
    return CheckpointManager(str(run_dir), CheckpointConfig(async_mode="off"), rank=0, world_size=1,
                             config_fingerprint="fp")


def saved(run_dir: Path) -> Path:
    """A committed checkpoint of the tiny model at step 1; returns its folder."""
    mgr = manager(run_dir)
    mgr.maybe_save(1, app_state(), {"model": dataclasses.asdict(MODEL), "tokens": 8}, force=True)
    mgr.close()
    return Path(step_url(str(run_dir), 1).removeprefix("file://"))


def rewrite_manifest(folder: Path) -> None:
    """What a forger does: make every listed file's size and checksum match what is now on disk."""
    path = folder / contract.MANIFEST
    manifest = json.loads(path.read_text())
    fs, _ = storage.filesystem(str(folder))
    for shard in manifest["shards"]:
        file = str(folder / shard["name"])
        shard["bytes"] = fs.size(file)
        shard["checksum"] = file_checksum(fs, file, shard["checksum"])
    path.write_text(json.dumps(manifest))
    assert not checkpoint_reader.verify_checkpoint(str(folder)), "the forged checkpoint must pass verification"


def assert_every_loader_refuses(run_dir: Path, folder: Path, marker: Path, match: str, *,
                                weights_read: bool = True) -> None:
    with pytest.raises(UnsafeCheckpointError, match=match):
        manager(run_dir).load(app_state(), step=1)
    assert not marker.exists()
    if weights_read:  # eval and export read only the model's tensors (and the metadata)
        with pytest.raises(UnsafeCheckpointError, match=match):
            load_model(str(folder))
        assert not marker.exists()
        with pytest.raises(UnsafeCheckpointError, match=match):
            export_checkpoint(str(folder), str(run_dir.parent / "export"))
    assert not marker.exists()


def test_the_payload_runs_under_plain_pickle(tmp_path):
    """The control: the same bytes do create the marker when unpickled the way DCP would."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


def test_a_payload_as_metadata_is_refused(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    folder = saved(run_dir)
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    rewrite_manifest(folder)
    assert_every_loader_refuses(run_dir, folder, marker, r"builtins\.io\.open|io\.open|builtins\.open")


def test_metadata_smuggling_a_payload_inside_real_metadata_is_refused(tmp_path):
    """DCP's real Metadata object, with a payload hidden in one of its fields."""
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    folder = saved(run_dir)
    with open(folder / ".metadata", "rb") as f:
        metadata = checkpoint_reader.read_dcp_metadata(f, "test")
    metadata.planner_data = {"x": Payload(marker)}
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    rewrite_manifest(folder)
    assert_every_loader_refuses(run_dir, folder, marker, "not part of DCP's metadata")


def test_a_payload_in_a_non_tensor_item_is_refused(tmp_path):
    """A checkpoint written by stock DCP (torch.save for non-tensor values) with a payload as the step counter."""
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    folder = saved(run_dir)
    state = {"model_optim": app_state()["model_optim"].state_dict(), "train": {"step": Payload(marker), "tokens": 8}}
    dcp.save(state, storage_writer=storage_writer(str(folder)), no_dist=True)  # the default planner
    assert not marker.exists()  # pickling it did not run it
    rewrite_manifest(folder)
    assert_every_loader_refuses(run_dir, folder, marker, "is not smelt's JSON", weights_read=False)
    # eval and export never read the non-tensor items: the weights load, the payload stays inert.
    model, _ = load_model(str(folder))
    assert isinstance(model, Transformer) and not marker.exists()


def test_a_payload_in_a_tensor_item_is_refused(tmp_path):
    """One model tensor's bytes in the .distcp file replaced by a pickle payload (metadata updated to point at it)."""
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    folder = saved(run_dir)
    with open(folder / ".metadata", "rb") as f:
        metadata = checkpoint_reader.read_dcp_metadata(f, "test")
    index = next(i for i in metadata.storage_data if i.fqn.startswith("model_optim.model."))
    info = metadata.storage_data[index]
    data_file = folder / info.relative_path
    original = data_file.read_bytes()
    payload = io.BytesIO()
    pickle.dump(Payload(marker), payload, protocol=2)
    data_file.write_bytes(original + payload.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=len(original), length=len(payload.getvalue()))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    rewrite_manifest(folder)
    assert_every_loader_refuses(run_dir, folder, marker, "a tensor file holds more than tensors")


def test_non_tensor_state_round_trips_as_json(tmp_path):
    """What the JSON codec keeps: tuples (Adam's betas), None, booleans, floats, nested dicts."""
    run_dir = tmp_path / "run"
    folder = saved(run_dir)
    blob = (folder / "__0_0.distcp").read_bytes()
    assert b"smelt-json-1" in blob and b"__tuple__" in blob
    state = app_state()
    state["train"].step = 99
    meta = manager(run_dir).load(state, step=1)
    opt = state["model_optim"].optimizers[0]
    assert opt.param_groups[0]["betas"] == (0.9, 0.999) and opt.param_groups[0]["foreach"] is None
    assert state["train"].step == 0 and meta["tokens"] == 8


def test_a_non_json_value_is_refused_at_save_naming_it(tmp_path):
    class Odd:
        def state_dict(self):
            return {"when": object()}

        def load_state_dict(self, sd):
            pass

    with pytest.raises(TypeError, match="'odd.when' holds a object"):
        manager(tmp_path / "run").maybe_save(1, {"odd": Odd()}, {}, force=True)
