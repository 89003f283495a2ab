"""Typed config loading: unknown keys are errors, overrides coerce to the field's type."""

import dataclasses
import re

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


# Bad values of the data stages' configs: each one sentence at load time, naming the key.
DATA_STAGE_BAD_VALUES = [
    ("ingest", "reader.format=html", "reader.format must be one of"),
    ("ingest", "reader.warc_engine=warcio", "reader.warc_engine must be one of"),
    ("ingest", "reader.max_payload_bytes=0", "must be positive"),
    ("ingest", "reader.read_timeout_s=0", "read_timeout_s must be positive"),
    ("ingest", "reader.connect_timeout_s=-1", "connect_timeout_s"),
    ("ingest", "reader.max_replacement_frac=2", "fraction between 0 and 1"),
    ("ingest", "reader.format=[1]", "must be a string"),
    ("ingest", "lang.min_score=1.5", "lang.min_score must be a fraction"),
    ("ingest", "lang.batch_size=0", "lang.batch_size must be at least 1"),
    ("ingest", "gopher_quality.min_words=-1", "gopher_quality.min_words must be at least 0"),
    ("ingest", "gopher_quality.min_words=500000", "minimums must not exceed their maximums"),
    ("ingest", "c4.min_sentences=-3", "c4.min_sentences must be at least 0"),
    ("ingest", "fineweb.short_line_length=-1", "fineweb.short_line_length must be at least 0"),
    ("ingest", "classifier.dim=0", "classifier.dim must be at least 1"),
    ("ingest", "classifier.lr=0", "classifier.lr must be positive"),
    ("ingest", "output.rows_per_row_group=0", "rows_per_row_group must be at least 1"),
    ("ingest", "extract.timeout_s=nan", "must be a finite number"),
    ("dedup", "threshold=0", "dedup.threshold must be in"),
    ("dedup", "num_perm=true", "must be a number"),
    ("dedup", "bands=4", "set both dedup.bands and dedup.rows"),
    ("dedup", "text_batch=0", "dedup.text_batch must be at least 1"),
    ("tokenizer", "vocab_size=100", "must be at least 259"),
    ("tokenize", "val_fraction=1", "val_fraction (1.0) must be in [0, 1)"),
    ("tokenize", "batch_docs=2.5", "must be an integer"),
    ("eval", "max_tokens=-5", "eval.max_tokens must be at least 1"),
    ("eval", "batch_size=0", "eval.batch_size must be at least 1"),
    ("eval", "seq_len=-1", "eval.seq_len must be at least 0"),
    ("eval", "split=", "eval.split must name a split"),
]


@pytest.mark.parametrize(("section", "override", "message"), DATA_STAGE_BAD_VALUES)
def test_a_bad_data_stage_value_is_one_sentence_at_load(section, override, message):
    from tasks.dedup.config import DedupConfig
    from tasks.eval.config import EvalConfig
    from tasks.ingest.config import IngestConfig
    from tasks.tokenize.config import TokenizeConfig, TokenizerConfig

    cls = {"ingest": IngestConfig, "dedup": DedupConfig, "tokenizer": TokenizerConfig,
           "tokenize": TokenizeConfig, "eval": EvalConfig}[section]
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        load(cls, overrides=[override])
    assert "\n" not in str(error.value)
    load(cls)  # the defaults load
