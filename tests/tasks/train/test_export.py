"""Export: a checkpoint becomes one safetensors file + config JSON, loadable without pickle or a process group."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

from tasks import datasets
from tasks.train.checkpoint import CheckpointManager, ModelOptimState, RNGState, step_url
from tasks.train.config import CheckpointConfig
from tasks.train.export import export_checkpoint, load_consolidated, load_exported, main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MODEL_CONFIG = {"dim": 16, "n_layers": 1, "vocab_size": 32}


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.hidden = nn.Linear(16, 16)
        self.out = nn.Linear(16, 32, bias=False)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(tokens)))) * self.scale


def saved_model(run_dir, steps=(3,), meta=None) -> TinyNet:
    """A trained TinyNet checkpointed (with its AdamW state and RNG) at each of ``steps``."""
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mgr = CheckpointManager(str(run_dir), CheckpointConfig(async_mode="off"), rank=0, world_size=1,
                            config_fingerprint="fp")
    for step in steps:
        model(torch.randint(0, 32, (2, 5))).sum().backward()
        opt.step()
        opt.zero_grad()
        mgr.maybe_save(step, {"model_optim": ModelOptimState(model, opt), "rng": RNGState(0, seed=0)},
                       {"model": MODEL_CONFIG, "tokens": step * 10} if meta is None else meta, force=True)
    mgr.close()
    return model


def test_export_writes_safetensors_equal_to_the_models_full_state_dict(tmp_path):
    model = saved_model(tmp_path / "run")
    manifest = export_checkpoint(step_url(str(tmp_path / "run"), 3), str(tmp_path / "export"))

    weights = safetensors.torch.load_file(tmp_path / "export" / "model.safetensors")
    expected = model.state_dict()
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["model"] == MODEL_CONFIG and config["step"] == 3 and config["tokens"] == 30
    assert config["params"] == sum(p.numel() for p in model.parameters()) + 1  # + the buffer
    assert manifest.kind == "model" and datasets.verify(manifest) == []
    assert manifest.meta["checkpoint"] == step_url(str(tmp_path / "run"), 3)


def test_loading_an_export_never_unpickles(tmp_path, monkeypatch):
    model = saved_model(tmp_path / "run")
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))

    def refuse(*args, **kwargs):
        raise AssertionError("loading an export unpickled something")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    weights, config = load_exported(str(tmp_path / "export"))
    assert torch.equal(weights["hidden.weight"], model.hidden.weight.detach())
    assert config["format"] == "smelt-safetensors-1"


def test_export_of_a_run_folder_takes_its_newest_good_checkpoint(tmp_path):
    saved_model(tmp_path / "run", steps=(1, 2))
    shard = Path(step_url(str(tmp_path / "run"), 2).removeprefix("file://")) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1])
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))
    assert json.loads((tmp_path / "export" / "config.json").read_text())["step"] == 1


def test_export_casts_floating_weights_on_request(tmp_path):
    saved_model(tmp_path / "run")
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"), dtype="bfloat16")
    weights, config = load_exported(str(tmp_path / "export"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16} and config["dtype"] == "bfloat16"


def test_load_consolidated_returns_only_the_model_and_the_manifest_meta(tmp_path):
    model = saved_model(tmp_path / "run")
    weights, meta = load_consolidated(step_url(str(tmp_path / "run"), 3))
    assert sorted(weights) == sorted(model.state_dict())  # no optimizer moments, no RNG
    assert meta["model"] == MODEL_CONFIG and meta["step"] == 3


def test_corrupt_export_is_refused(tmp_path):
    saved_model(tmp_path / "run")
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))
    path = tmp_path / "export" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(datasets.DatasetError, match="model.safetensors"):
        load_exported(str(tmp_path / "export"))


def test_export_without_a_model_config_is_a_clear_error(tmp_path):
    saved_model(tmp_path / "run", meta={"tokens": 1})
    with pytest.raises(datasets.DatasetError, match="no model config"):
        export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))


def test_cli_reports_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nothing"), "--output", str(tmp_path / "export")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
