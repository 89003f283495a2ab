"""A run's identity is what makes its checkpoints meaningful and nothing else; what a continuing launch changed."""

from __future__ import annotations

import json

import pytest

from tasks import contract
from tasks.config import from_dict
from tasks.train.config import TrainConfig
from tasks.train.identity import config_changes, config_fingerprint, run_identity

TOKENS = {"web": contract.Manifest("tokens", "web-fp", [], {}, {}, {"vocab_size": 256}),
          "code": contract.Manifest("tokens", "code-fp", [], {}, {}, {"vocab_size": 256})}
BASE = {"steps": 60, "data": {"seq_len": 32, "global_batch": 8, "mixture": {"web": 0.8, "code": 0.2}}}


def identity(*overrides: tuple[str, object], manifests=TOKENS) -> str:
    config = json.loads(json.dumps(BASE))
    for key, value in overrides:
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return run_identity(from_dict(TrainConfig, config), manifests)


@pytest.mark.parametrize("override", [
    ("steps", 1000), ("log_every", 5),
    ("optim.lr", 1e-4), ("optim.warmup_steps", 50), ("optim.weight_decay", 0.0),
    ("parallel.dp_shard", 2), ("parallel.tp", 2), ("parallel.pp", 2), ("parallel.activation_checkpoint", "full"),
    ("parallel.compile", True), ("parallel.mixed_precision", "bf16"),
    ("data.micro_batch", 2), ("data.prefetch", 5),
    ("checkpoint.interval_steps", 1), ("checkpoint.keep_last", 5), ("checkpoint.async_mode", "off"),
    ("watchdog.hang_timeout_s", 5.0), ("loss_guard.enabled", False), ("stragglers.every_steps", 3),
    ("faults.inject", "kill:rank=0,step=6"),
])
def test_identity_ignores_the_step_budget_optimizer_layout_checkpoints_and_faults(override):
    assert identity(override) == identity()


def test_identity_ignores_the_code(monkeypatch):
    before = identity()
    monkeypatch.setattr(contract, "code_version", lambda *packages: "another-version")
    assert identity() == before


@pytest.mark.parametrize("override", [
    ("model_preset", "125m"), ("model.n_layers", 3), ("model.dim", 128), ("model.vocab_size", 512),
    ("data.seq_len", 64), ("data.global_batch", 16), ("data.seed", 7), ("data.mixture", {"web": 0.5, "code": 0.5}),
    ("seed", 1),
])
def test_identity_changes_with_the_model_shape_batch_contract_and_seeds(override):
    assert identity(override) != identity()


def test_identity_changes_with_the_data_and_its_tokenizer():
    other_data = {**TOKENS, "web": contract.Manifest("tokens", "web-fp2", [], {}, {}, {"vocab_size": 256})}
    assert identity(manifests=other_data) != identity()
    # The model takes its vocabulary from the tokenizer: a larger one is another model shape.
    other_tokenizer = {n: contract.Manifest("tokens", m.fingerprint, [], {}, {}, {"vocab_size": 300})
                       for n, m in TOKENS.items()}
    assert identity(manifests=other_tokenizer) != identity()


def test_identity_changes_with_the_folder_a_run_starts_from(tmp_path):
    """``init_from`` gives the initial weights (and the shape): a run started from another folder is another run."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 192, "vocab_size": 256}))
    a, b = identity(("init_from", str(tmp_path / "a"))), identity(("init_from", str(tmp_path / "b")))
    assert a != b and identity() not in (a, b)


def test_the_flow_and_the_trainer_compute_the_same_identity():
    cfg = from_dict(TrainConfig, {**BASE, "seed": 3})
    trainer = config_fingerprint(cfg.model_for_data(256), cfg.data, {"web": "web-fp", "code": "code-fp"},
                                 seed=3, init_from="")
    assert run_identity(cfg, TOKENS) == trainer


def test_config_changes_name_each_changed_value_with_defaults_filled_in():
    old = {"steps": 60, "optim": {"lr": 3e-3}}
    new = {"steps": 1000, "optim": {"lr": 3e-3, "warmup_steps": 5}, "parallel": {"tp": 2}, "data": {"mixture": {"web": 1}}}
    assert config_changes(old, new) == {"steps": [60, 1000], "parallel.tp": [1, 2], "data.mixture": [{}, {"web": 1}]}
    assert config_changes(new, new) == {}
    # A config this code no longer loads (a key it does not know) still compares, as given.
    assert config_changes({"steps": 60, "retired": 1}, {"steps": 60}) == {"retired": [1, None]}
