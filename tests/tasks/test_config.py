"""Typed config loading: unknown keys are errors, overrides coerce to the field's type."""

import dataclasses

import pytest

from tasks.config import ConfigError, from_dict, load, merge_overrides
from tasks.train.config import TrainConfig


def test_unknown_key_is_an_error_naming_it():
    with pytest.raises(ConfigError, match="train.stpes|'stpes'"):
        from_dict(TrainConfig, {"stpes": 10})


def test_nested_unknown_key_names_its_section():
    with pytest.raises(ConfigError, match="optim.lrr"):
        from_dict(TrainConfig, {"optim": {"lrr": 1.0}})


def test_override_sets_nested_value_with_the_fields_type(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 5\n[optim]\nlr = 0.1\n")
    cfg = load(TrainConfig, path, ["optim.lr=3e-4", "parallel.tp=2", "parallel.compile=true"])
    assert cfg.steps == 5 and cfg.optim.lr == pytest.approx(3e-4) and cfg.parallel.tp == 2
    assert cfg.parallel.compile is True


def test_bad_value_type_is_a_config_error():
    with pytest.raises(ConfigError, match="must be a number"):
        from_dict(TrainConfig, {"steps": "many"})


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(TrainConfig, tmp_path / "nope.toml")


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="section.key=value"):
        merge_overrides({}, ["train.lr"])


def test_defaults_fill_what_the_file_leaves_out():
    assert from_dict(TrainConfig, {}) == TrainConfig()
    assert dataclasses.asdict(from_dict(TrainConfig, {"data": {"seq_len": 64}}))["data"]["seq_len"] == 64
