"""`smelt plan` / `smelt simulate` through a tiny typer app, as flows/cli.py registers them."""

import json

import pytest
import typer
from typer.testing import CliRunner

from infra.commands import plan_command, simulate_command

app = typer.Typer()
app.command("plan")(plan_command)
app.command("simulate")(simulate_command)
runner = CliRunner()
SMALL = ["--model", "8b", "--gpus", "64", "--tokens", "2e11", "--days", "30", "--budget", "5e5"]


def test_plan_json_is_one_object_with_the_verdict_keys():
    result = runner.invoke(app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for key in ("feasible", "layout", "mfu", "days", "gpu_hours", "cost_usd", "checkpoint_interval_min", "goodput"):
        assert key in out
    assert out["inputs"]["gpus"] == 4096 and out["inputs"]["gpu"] == "h100" and len(out["sensitivity"]) == 11


def test_plan_prints_the_tables():
    result = runner.invoke(app, ["plan", *SMALL, "--price", "1.5", "--gpu-set", "memory_gb=96"])
    assert result.exit_code == 0, result.output
    for title in ("verdict:", "Layout:", "Runners-up", "Memory per GPU", "Step time", "Failures and checkpoints",
                  "Sensitivity"):
        assert title in result.stdout
    assert "$1.50/GPU-hour" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--gpu", "v100"], "unknown GPU 'v100'"),
    (["--gpus", "4097"], "multiple of 8"),
    (["--model", "huge"], "unknown model preset 'huge'"),
    (["--gpu-set", "colour=1"], "unknown GPU field 'colour'"),
    (["--pp-schedules", "GPipe"], "unknown pipeline schedule 'GPipe'"),
])
def test_bad_inputs_exit_2_with_one_clear_line(args, message):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2 and message in result.output


def test_simulate_json_reports_distributions_and_writes_the_plot(tmp_path):
    path = tmp_path / "runs.png"
    result = runner.invoke(app, ["simulate", *SMALL, "--runs", "30", "--seed", "1", "--distribution", "weibull",
                                 "--plot", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["days_dist"]["p10"] <= out["days_dist"]["p50"] <= out["days_dist"]["p90"]
    assert out["runs"] == 30 and out["distribution"] == "weibull" and 0 < out["goodput"] < 1
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_simulate_prints_a_table_and_rejects_unknown_distributions():
    result = runner.invoke(app, ["simulate", *SMALL, "--runs", "20"])
    assert result.exit_code == 0 and "Distribution over runs" in result.stdout
    bad = runner.invoke(app, ["simulate", "--distribution", "gamma"])
    assert bad.exit_code == 2 and "exponential, weibull" in bad.output
