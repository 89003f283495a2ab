"""`smelt plan` / `smelt simulate` through a tiny typer app, as flows/cli.py registers them."""

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from infra.commands import plan_command, simulate_command
from infra.recovery import NOT_IN_SMELT
from infra.validation import summary, table

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
    # 14 rows before recovery modes, plus cluster MTBF at 2 h, 3 h and Llama 3's rate
    assert out["inputs"]["gpus"] == 4096 and out["inputs"]["gpu"] == "h100" and len(out["sensitivity"]) == 17
    errors = [row for row in out["sensitivity"] if row["factor"] == "planner error"]
    error = summary(table())["held_out_mean_abs_error"]  # the validation's held-out mean
    assert [row["setting"] for row in errors] == [f"step {-error:+.1%}", f"step {error:+.1%}"]


def test_plan_compile_plans_the_compiled_trainer_and_says_so_in_its_settings():
    """``--compile``: the trainer's blocks compiled, so full recomputation skips w2; the plan's settings turn it
    on, and its sensitivity row shows the same layout uncompiled."""
    plain, compiled = (json.loads(runner.invoke(app, ["plan", "--json", *flags]).stdout)
                       for flags in ([], ["--compile"]))
    assert plain["layout"] == compiled["layout"] and "ac-full" in plain["layout"]
    assert compiled["step_s"] < plain["step_s"] and compiled["cost_usd"] < plain["cost_usd"]
    assert compiled["trainer_overrides"]["parallel.compile"] is True and compiled["parallel"]["compile"] is True
    assert "parallel.compile" not in plain["trainer_overrides"] and plain["parallel"]["compile"] is False
    back = next(r for r in compiled["sensitivity"] if r["factor"] == "trainer compiled")
    assert back["setting"] == "parallel.compile=false" and back["days"] == pytest.approx(plain["days"], abs=0.01)
    text = runner.invoke(app, ["plan", "--compile"]).stdout
    assert "--set parallel.compile=True" in text


def test_plan_says_when_its_own_error_flips_the_verdict():
    # the default bf16 plan is 1.7% under budget; as much slower as the validation's mean error, it is not
    error = summary(table())["held_out_mean_abs_error"]
    assert error > 0.02
    result = runner.invoke(app, ["plan"])
    assert "verdict: FEASIBLE" in result.stdout and f"the verdict flips at step {error:+.1%}" in result.stdout
    roomy = runner.invoke(app, ["plan", "--budget", "20e6"])
    assert "verdict: FEASIBLE" in roomy.stdout and "flips" not in roomy.stdout


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


def test_plan_scores_a_given_layout_and_reports_per_gpu_figures():
    layout = "tp=8,pp=4,dp=128,cp=1,mb=1,ac=none,schedule=zbv"
    result = runner.invoke(app, ["plan", "--layout", layout, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["layout"] == "tp8·pp4zbv·fsdp128·zero1·mb1·ac-none" and out["layout_given"]
    assert out["tokens_per_s_per_gpu"] == pytest.approx(out["tokens_per_s"] / 4096, rel=1e-3)
    assert out["step_s"] > 0 and 0 < out["peak_memory_gb"] < 80 and "bf16 peak" in out["mfu_basis"]
    assert out["runners_up"] == [] and out["trainer_cannot_run"] == []


def test_fp8_and_context_parallel_layouts_are_scored_and_context_parallel_named_as_a_gap_of_the_trainer():
    args = ["plan", "--layout", "tp=8,cp=2,pp=4,mb=1,schedule=zbv", "--precision", "fp8", "--json"]
    out = json.loads(runner.invoke(app, args).stdout)
    bf16 = json.loads(runner.invoke(app, ["plan", "--layout", "tp=8,cp=2,pp=4,mb=1,schedule=zbv", "--json"]).stdout)
    assert out["layout"].endswith("·fp8") and "·cp2·" in out["layout"] and out["precision"] == "fp8"
    assert out["trainer_cannot_run"] == ["context parallel (cp=2)"]  # FP8 it runs (parallel.float8)
    assert out["tokens_per_s_per_gpu"] > 1.15 * bf16["tokens_per_s_per_gpu"]  # FP8 GEMMs, bf16 attention
    assert out["peak_memory_gb"] < bf16["peak_memory_gb"] + 1


def test_custom_shapes_from_model_set_and_from_a_hugging_face_config(tmp_path):
    sets = ["plan", "--model-set", "dim=4096,layers=32,heads=32,kv_heads=8,ffn=14336,vocab=128256", "--gpus", "64",
            "--json"]
    custom = json.loads(runner.invoke(app, sets).stdout)
    preset = json.loads(runner.invoke(app, ["plan", "--model", "8b", "--gpus", "64", "--json"]).stdout)
    assert custom["inputs"]["model_shape"] == preset["inputs"]["model_shape"] and custom["mfu"] == preset["mfu"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                                  "hidden_act": "silu", "tie_word_embeddings": False}))
    hf = json.loads(runner.invoke(app, ["plan", "--model-config", str(config), "--gpus", "64", "--json"]).stdout)
    assert hf["inputs"]["model_shape"] == preset["inputs"]["model_shape"]


@pytest.mark.parametrize("args, message", [
    (["--layout", "tp=8,pp=4,dp=3"], "GPUs, but --gpus is 4096"),
    (["--layout", "tp=8,colour=2"], "key one of"),
    (["--layout", "tp=8,ac=some"], "choose one of none"),
    (["--layout", "tp=8,zero=4"], "ZeRO stages are 0, 1, 2 and 3"),
    (["--precision", "fp4"], "--precision 'fp4'"),
    (["--model-set", "depth=3"], "key one of dim"),
    (["--model-set", "dim=4095,heads=32"], "divisible"),
    (["--stack", "deepspeed"], "unknown stack 'deepspeed'; choose smelt or one of meta, megatron"),
    (["--stack", "torchtitan", "--compile"], "--compile plans smelt's trainer"),
    (["--memory-headroom", "1"], "must be in [0, 1), got 1.0"),
    (["--stack", "megatron", "--precision", "fp8"], "stack megatron has no FP8 speed-up fitted"),
    (["--stack", "meta", "--layout", "tp=8,precision=fp8"], "stack meta has no FP8 speed-up fitted"),
    (["--stack", "megatron", "--pp-schedules", "ZBVZeroBubble"], "stack megatron has no ZBVZeroBubble schedule"),
])
def test_bad_layouts_and_shapes_exit_2_with_one_clear_line(args, message):
    result = runner.invoke(app, ["plan", *args])
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the error box
    assert result.exit_code == 2 and message in flat, result.output


def test_validate_prints_the_table_and_its_summary():
    result = runner.invoke(app, ["plan", "--validate", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["summary"]["held_out"] >= 15 and len(out["rows"]) == out["summary"]["rows"]
    text = runner.invoke(app, ["plan", "--validate"]).stdout
    assert "held-out rows" in text and "llama3-405b-8k" in text


@pytest.mark.parametrize("key, args", [
    ("titan-70b-256", ["--stack", "torchtitan", "--gpu", "h100-96gb-500w", "--model", "70b", "--gpus", "256",
                       "--global-batch-tokens", str(512 * 8192), "--precision", "fp8",
                       "--layout", "tp=8,mb=16,ac=full"]),
    ("llama3-405b-8k", ["--stack", "meta", "--model", "405b", "--gpus", "8192", "--layout",
                        "tp=8,pp=16,dp=64,mb=1,vp=8,zero=2,split=balanced,ac=none,schedule=interleaved"]),
])
def test_a_stack_scores_a_layout_as_the_validation_table_scores_that_systems_published_run(key, args):
    """``--stack``: the system's timing and memory model with the fitted constants, the same numbers the
    validation row shows; no smelt trainer settings, since smelt's trainer is not what runs it."""
    row = next(r for r in table() if r.run.key == key)
    out = json.loads(runner.invoke(app, ["plan", *args, "--memory-headroom", "0", "--json"]).stdout)
    assert out["stack"] == args[1] and out["layout"] == row.layout.name
    assert out["tokens_per_s_per_gpu"] == pytest.approx(row.tokens_per_gpu, rel=1e-3)
    assert out["peak_memory_gb"] == pytest.approx(row.memory_gb, abs=0.01)
    assert out["trainer_overrides"] is None and out["trainer_cannot_run"] == []
    assert "trainer compiled" not in [r["factor"] for r in out["sensitivity"]]
    system = "torchtitan" if args[1] == "torchtitan" else "meta"  # its planner error is its system's mean
    error = summary(table())["per_system_mean_abs_error"][system]
    assert [r["setting"] for r in out["sensitivity"] if r["factor"] == "planner error"] == \
        [f"step {-error:+.1%}", f"step {error:+.1%}"]
    text = runner.invoke(app, ["plan", *args, "--memory-headroom", "0"]).stdout
    assert "scored as" in text and "trainer:" not in text and "launch:" not in text


def test_a_stack_searches_the_layouts_its_system_offers_with_its_own_model():
    # Megatron-Core: its distributed optimizer (ZeRO-1 states), and sequence-sharded saves with Transformer Engine's
    # TP overlap, so no recomputation; smelt's eager trainer needs full recomputation on the seed question
    megatron = json.loads(runner.invoke(app, ["plan", "--stack", "megatron", "--json"]).stdout)
    smelt = json.loads(runner.invoke(app, ["plan", "--json"]).stdout)
    assert "·zero1·" in megatron["layout"] and "ac-none" in megatron["layout"] and "ac-full" in smelt["layout"]
    assert megatron["days"] < smelt["days"] and megatron["peak_memory_gb"] <= 72
    # it interleaves as deep as Megatron-Core's virtual pipeline allows, and so beats the usual hand layout
    assert int(re.search(r"·pp\d+v(\d+)·", megatron["layout"]).group(1)) > 2
    hand = json.loads(runner.invoke(app, ["plan", "--stack", "megatron", "--layout",
                                          "tp=8,pp=4,vp=5,zero=1,ac=none,mb=1", "--json"]).stdout)
    assert megatron["days"] < hand["days"]
    # LLM Foundry: FSDP alone, so 4,096 ranks need at least 4,096 sequences a step
    foundry = json.loads(runner.invoke(app, ["plan", "--stack", "llm-foundry", "--json"]).stdout)
    assert foundry["layout"] is None and "not divisible by dp=4096" in foundry["reasons"][0]
    foundry = json.loads(runner.invoke(app, ["plan", "--stack", "llm-foundry", "--global-batch-tokens",
                                             str(2**25), "--json"]).stdout)
    assert foundry["layout"].startswith("tp1·pp1·fsdp4096·zero")


SEED = ["plan", "--model", "70b", "--tokens", "15e12", "--gpus", "4096", "--gpu", "h100", "--days", "60",
        "--budget", "11e6", "--json"]


def test_plan_recovery_storage_reproduces_the_seed_plan_before_recovery_modes():
    """The figures `smelt plan ... --mtbf-gpu-hours 8192` printed before snapshots (issue 40's table)."""
    out = json.loads(runner.invoke(app, [*SEED, "--mtbf-gpu-hours", "8192", "--recovery", "storage"]).stdout)
    assert out["layout"] == "tp2·pp1·fsdp2048·zero3·mb1·ac-full" and out["recovery"] == "storage"
    assert (out["goodput"], out["days"], out["cost_usd"], out["feasible"]) == (0.8858, 59.27, 12472391, False)


def test_plan_names_its_recovery_mode_the_figures_that_decide_it_and_compares_the_others():
    out = json.loads(runner.invoke(app, [*SEED, "--mtbf-gpu-hours", "8192"]).stdout)
    model = out["recovery_model"]
    assert out["recovery"] == "snapshot" and model["in_smelt"] and len(model["deciding"]) == 3
    assert model["snapshot"]["blocking_share_of_step"] < 0.02 and model["figures"]["process_group_init_s"]["source"]
    assert sum(p["seconds"] for p in model["lost_per_failure_s"]) == pytest.approx(model["lost_per_failure_min"] * 60,
                                                                                   abs=1)
    modes = {m["mode"]: m for m in out["recovery_modes"]}
    assert modes["storage"]["goodput"] < modes["snapshot"]["goodput"] < modes["in-process"]["goodput"]
    assert modes["snapshot"]["goodput"] == pytest.approx(out["goodput"], abs=1e-4)
    assert not modes["in-process"]["in_smelt"] and NOT_IN_SMELT in modes["in-process"]["label"]


def test_in_process_is_marked_as_not_in_smelts_trainer_in_text_and_json():
    text = runner.invoke(app, ["plan", "--mtbf-gpu-hours", "8192", "--recovery", "in-process"]).stdout
    assert f"recovery: in-process ({NOT_IN_SMELT})" in " ".join(text.split())
    out = json.loads(runner.invoke(app, [*SEED, "--recovery", "in-process"]).stdout)
    assert out["recovery"] == f"in-process ({NOT_IN_SMELT})" and not out["recovery_model"]["in_smelt"]
    assert out["recovery_model"]["deciding"][0] == "process-group (NCCL) init"
    assert [r["factor"] for r in out["sensitivity"]].count("process-group init") == 2


def test_sensitivity_always_has_cluster_mtbf_rows_of_2_and_3_hours_beside_llama_3s_rate():
    out = json.loads(runner.invoke(app, [*SEED, "--mtbf-gpu-hours", "8192"]).stdout)
    rows = [r for r in out["sensitivity"] if r["factor"] == "cluster MTBF"]
    assert [r["setting"].split(" (")[0] for r in rows] == ["2.0 h", "3.0 h", "12.4 h"]
    assert "Llama 3" in rows[2]["setting"] and rows[0]["days"] == pytest.approx(out["days"], abs=0.01)
    assert rows[0]["days"] > rows[1]["days"] > rows[2]["days"]


def test_unknown_recovery_mode_exits_2():
    result = runner.invoke(app, ["plan", "--recovery", "live-migration"])
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the error box
    assert result.exit_code == 2 and "choose one of storage, snapshot, in-process" in flat, result.output
