"""Export: a checkpoint becomes a Hugging Face Llama folder, loadable without pickle or a process group.

Parity with transformers itself is in test_hf.py; these tests need no transformers.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from tasks import contract
from tasks.checkpoint_reader import load_consolidated, step_url
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState, RNGState
from tasks.train.config import CheckpointConfig
from tasks.train.export import export_checkpoint, load_exported, main, parse_size

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MODEL = ModelConfig(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=32, vocab_size=32, max_seq_len=16)
MODEL_CONFIG = dataclasses.asdict(MODEL)


class TinyNet(nn.Module):
    """Not a Llama: its checkpoint cannot become a Hugging Face Llama folder."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.out = nn.Linear(16, 32, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(tokens))


def saved_model(run_dir, steps=(3,), meta=None, net=None) -> nn.Module:
    """A trained tiny Transformer checkpointed (with its AdamW state and RNG) at each of ``steps``."""
    torch.manual_seed(0)
    model = net or Transformer(MODEL)
    if net is None:
        model.init_weights(0)
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


def test_export_holds_the_models_weights_and_smelts_metadata(tmp_path):
    model = saved_model(tmp_path / "run")
    manifest = export_checkpoint(step_url(str(tmp_path / "run"), 3), str(tmp_path / "export"))

    weights, meta = load_exported(str(tmp_path / "export"))
    expected = model.state_dict()
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
    assert meta["model"] == MODEL_CONFIG and meta["step"] == 3 and meta["tokens"] == 30
    assert meta["params"] == MODEL.num_params() and meta["dtype"] == "float32"
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 16 and config["vocab_size"] == 32
    assert manifest.kind == "model" and contract.verify(manifest) == []
    assert manifest.meta["checkpoint"] == step_url(str(tmp_path / "run"), 3)
    assert not (tmp_path / "export" / "tokenizer.json").exists()  # the checkpoint names no tokens dataset


def test_loading_an_export_never_unpickles(tmp_path, monkeypatch):
    model = saved_model(tmp_path / "run")
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))

    def refuse(*args, **kwargs):
        raise AssertionError("loading an export unpickled something")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    weights, meta = load_exported(str(tmp_path / "export"))
    assert torch.equal(weights["layers.0.attention.wq.weight"], model.layers["0"].attention.wq.weight.detach())
    assert meta["format"] == "smelt-hf-llama-1"


def test_export_of_a_run_folder_takes_its_newest_good_checkpoint(tmp_path):
    saved_model(tmp_path / "run", steps=(1, 2))
    shard = Path(step_url(str(tmp_path / "run"), 2).removeprefix("file://")) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1])
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))
    assert json.loads((tmp_path / "export" / "smelt_meta.json").read_text())["step"] == 1


def test_export_casts_floating_weights_on_request(tmp_path):
    saved_model(tmp_path / "run")
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"), dtype="bf16")
    weights, meta = load_exported(str(tmp_path / "export"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16} and meta["dtype"] == "bfloat16"
    assert json.loads((tmp_path / "export" / "config.json").read_text())["torch_dtype"] == "bfloat16"


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
    with pytest.raises(contract.DatasetError, match="model.safetensors"):
        load_exported(str(tmp_path / "export"))


def test_export_without_a_model_config_is_a_clear_error(tmp_path):
    saved_model(tmp_path / "run", meta={"tokens": 1})
    with pytest.raises(contract.DatasetError, match="no model config"):
        export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))


def test_a_checkpoint_of_another_model_is_refused_with_the_tensor_it_cannot_place(tmp_path):
    saved_model(tmp_path / "run", net=TinyNet())
    with pytest.raises(contract.DatasetError, match="not a smelt Llama model.*embed.weight"):
        export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))


def test_shard_sizes_parse_like_transformers():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MB") == 5 * 10**8 and parse_size("2KiB") == 2048
    assert parse_size("1234") == 1234
    with pytest.raises(ValueError, match="not a size"):
        parse_size("five")


def test_cli_reports_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nothing"), "--output", str(tmp_path / "export")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_streamed_safetensors_files_read_back_with_the_safetensors_library():
    import io

    import safetensors.torch

    from tasks.train.export import _write_safetensors

    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.randn(2, 2, 3).half(),
               "empty": torch.empty(0, 4), "permuted": torch.randn(4, 6).t()}
    buf = io.BytesIO()
    assert _write_safetensors(buf, tensors) == 5
    back = safetensors.torch.load(buf.getvalue())
    assert sorted(back) == sorted(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
