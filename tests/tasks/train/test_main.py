"""The torchrun entry point: --data parsing, config loading, clear exits, the dry run."""

from __future__ import annotations

import json

import pytest

from tasks.config import load
from tasks.train.config import TrainConfig, parse_data
from tasks.train.main import main
from tests.tasks.train.token_corpus import make_corpus


def test_a_lone_url_is_the_main_dataset():
    assert parse_data(["/data/tokens"]) == {"main": "file:///data/tokens"}


def test_named_urls_make_a_mixture():
    assert parse_data(["web=s3://b/web", "code=file:///c"]) == {"web": "s3://b/web", "code": "file:///c"}


def test_several_unnamed_urls_are_refused():
    with pytest.raises(ValueError, match="needs a name when several datasets are given"):
        parse_data(["/a", "/b"])


def test_a_name_given_twice_is_refused():
    with pytest.raises(ValueError, match="names dataset 'web' twice"):
        parse_data(["web=/a", "web=/b"])


def test_a_run_config_contributes_its_train_section_and_overrides_apply(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[tokenize]\nvocab_size = 4096\n[train]\nsteps = 7\n[train.data]\nseq_len = 64\n')
    cfg = load(TrainConfig, str(path), ["optim.lr=0.5", "parallel.tp=2"], section="train")
    assert (cfg.steps, cfg.data.seq_len, cfg.optim.lr, cfg.parallel.tp) == (7, 64, 0.5, 2)


def test_a_json_train_config_loads(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"steps": 3, "parallel": {"dp_shard": 2}}))
    cfg = load(TrainConfig, f"file://{path}", [], section="train")
    assert (cfg.steps, cfg.parallel.dp_shard) == (3, 2)


def test_a_misspelt_key_exits_2_naming_it(tmp_path, caplog):
    path = tmp_path / "train.toml"
    path.write_text("stpes = 3\n")
    assert main(["--config", str(path), "--data", str(tmp_path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "unknown config key 'stpes'" in caplog.text


def test_a_missing_dataset_exits_2(tmp_path, caplog):
    assert main(["--data", str(tmp_path / "nothing"), "--run-dir", str(tmp_path / "run")]) == 2
    assert "no dataset at" in caplog.text


def test_dry_run_prints_the_layout_as_json(tmp_path, capsys):
    corpus = make_corpus(str(tmp_path / "corpus"), tokens=2000)
    code = main(["--data", corpus, "--dry-run", "--nproc", "4", "--set", "parallel.tp=2", "--set", "data.global_batch=8"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["layout"] == "pp=1 × dp_replicate=1 × dp_shard=2 × tp=2"
    assert report["batch"]["local_batch"] == 4


def test_dry_run_reports_fp8_and_refuses_widths_fp8_matmuls_cannot_take(tmp_path, capsys, caplog):
    corpus = make_corpus(str(tmp_path / "corpus"), tokens=2000)
    fp8 = ["--data", corpus, "--dry-run", "--nproc", "2", "--set", "parallel.float8=tensorwise",
           "--set", "parallel.tp=2", "--set", "model_preset=tiny"]
    assert main(fp8) == 0 and json.loads(capsys.readouterr().out)["float8"] == "tensorwise"
    assert main([*fp8, "--set", "model.ffn_hidden=200"]) == 2
    assert "model.ffn_hidden / parallel.tp = 100 is not a multiple of 16" in caplog.text + capsys.readouterr().err
