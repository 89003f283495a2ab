"""The command line: --help everywhere, and user mistakes as one sentence with exit code 2."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flows import cli

COMMANDS = [[], ["sample"], ["run"], ["ingest"], ["ingest-code"], ["dedup"], ["tokenize"], ["tokenizer", "train"],
            ["train"], ["eval"], ["export"], ["plan"], ["simulate"], ["quality-classifier", "train"],
            ["server", "start"], ["server", "stop"], ["report"]]


@pytest.fixture(scope="module")
def runner():
    cli._register_planner()
    return CliRunner()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "smelt")
def test_every_command_has_help(runner, command):
    result = runner.invoke(cli.app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def smelt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120)


def test_missing_input_is_one_clear_sentence_not_a_traceback(tmp_path):
    result = smelt("ingest", "--input", str(tmp_path / "nowhere" / "*.warc.gz"), "--root", str(tmp_path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "nowhere" in result.stderr and result.stderr.strip().count("\n") <= 2


def test_unknown_config_key_names_the_key(tmp_path):
    result = smelt("dedup", "--input", str(tmp_path), "--set", "dedup.thresold=0.7")
    assert result.returncode == 2 and "thresold" in result.stderr and "Traceback" not in result.stderr


def test_incomplete_dataset_input_is_refused(tmp_path):
    (tmp_path / "docs").mkdir()
    result = smelt("tokenize", "--input", str(tmp_path / "docs"))
    assert result.returncode == 2 and "incomplete" in result.stderr


def test_train_dry_run_prints_layout_without_training(tmp_path):
    import json

    from tests.tasks.train.token_corpus import make_corpus

    url = make_corpus(f"file://{tmp_path}/tokens")
    result = smelt("train", "--data", url, "--nproc", "2", "--dry-run", "--json", "--set", "train.parallel.tp=2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["world_size"] == 2 and "tp=2" in report["layout"]
    assert not (tmp_path / "smelt-data").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fails_fast(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    import time

    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **(env or {})})
    assert time.monotonic() - start < 10, f"took {time.monotonic() - start:.1f} s"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") <= 2, result.stderr
    return result


def test_a_refused_dask_address_is_one_sentence_within_10_s(tmp_path):
    address = f"tcp://127.0.0.1:{_closed_port()}"
    result = _fails_fast(["run", "--dask-address", address, "--root", str(tmp_path)])
    assert "Dask scheduler" in result.stderr and "refused" in result.stderr
    assert not (tmp_path / "sample").exists()


def test_an_unreachable_prefect_api_url_is_one_sentence_within_10_s(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/api"
    result = _fails_fast(["eval", "--checkpoint", str(tmp_path)], env={"PREFECT_API_URL": url})
    assert "PREFECT_API_URL" in result.stderr and url in result.stderr.replace("\n", "")


def test_smelt_launch_takes_every_job_default_from_jobspec_and_passes_each_option_on():
    """One home for a cluster job's defaults: every JobSpec field with a default is a `smelt launch` option whose
    default is read from JobSpec (a literal here would be a second copy to drift), and every option reaches it."""
    import ast
    import inspect
    import textwrap

    from infra.launch.job import JOB_DEFAULTS

    source = ast.parse(textwrap.dedent(inspect.getsource(cli.launch)))
    arguments = source.body[0].args
    defaults = dict(zip([a.arg for a in arguments.args][-len(arguments.defaults):], arguments.defaults))
    written = {name: ast.unparse(defaults[name]) for name in JOB_DEFAULTS if name in defaults}
    assert written == {name: f"JOB_DEFAULTS['{name}']" for name in JOB_DEFAULTS}
    body = ast.unparse(source)
    assert "locals().items() if name in JOB_DEFAULTS" in body and "**options" in body
