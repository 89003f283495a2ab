"""The planner against published runs (infra/validation.py).

Checks that the held-out throughput error and the memory error stay within the bounds below, that the table
spans systems, sizes, scales, GPUs and precisions, that each fitted constant is named and fitted on one stated
row, and that FP8, context parallelism, the stacks' loss implementations and torchtitan's selective
recomputation cost what their sources show.
"""

import dataclasses

import pytest

from infra.catalogue import CATALOGUE
from infra.layout import ModelShape
from infra.memory import cp_ring_bytes
from infra.timing import ASYNC_TP_HIDDEN, ATTENTION_RATE, FP8_SPEEDUP
from infra.published_runs import RUNS
from infra.stacks import FITTED, STACKS
from infra.validation import CP_SWEEPS, _balanced_attention, _worst, cp_sweep_floor, fit, score, summary, table

ROWS = table()
BY_KEY = {r.run.key: r for r in ROWS}

# The bound this table holds today (how each figure moved: infra/README.md and git log). Lower these when a
# change improves it; a change that breaks them made the planner worse on runs it was not fitted to.
HELD_OUT_MEAN, HELD_OUT_WORST, MEMORY_MEAN, MEMORY_WORST = 0.0474, 0.171, 0.0511, 0.147
MEMORY_WITHIN_10 = 15  # rows whose peak memory is within 10% of the published figure


def test_held_out_error_stays_within_the_bound():
    s = summary(ROWS)
    assert s["held_out_mean_abs_error"] <= HELD_OUT_MEAN and s["held_out_worst_abs_error"] <= HELD_OUT_WORST, s
    assert s["memory_mean_abs_error"] <= MEMORY_MEAN and s["memory_worst_abs_error"] <= MEMORY_WORST, s
    within = [r for r in ROWS if r.run.memory_gib and abs(r.memory_gb / (r.run.memory_gib * 2**30 / 1e9) - 1) <= 0.10]
    assert len(within) >= MEMORY_WITHIN_10, [r.run.key for r in within]
    assert s["fitted_mean_abs_error"] < 0.002  # each fitted row is reproduced by its constant


def test_the_table_spans_systems_sizes_scales_gpus_and_precisions():
    s = summary(ROWS)
    assert s["held_out"] >= 15 and len(s["systems"]) >= 4
    sizes = [r.run.cfg.num_params() for r in ROWS]
    assert min(sizes) < 1.5e9 and max(sizes) > 4e11
    assert min(r.run.gpus for r in ROWS) <= 8 and max(r.run.gpus for r in ROWS) == 16384
    assert {r.run.gpu.split("-")[0] for r in ROWS} == {"a100", "h100", "h200"}
    assert {r.run.precision for r in ROWS} == {"bf16", "fp8"}
    assert all(r.run.source and r.run.published > 0 for r in ROWS)


def test_constants_are_few_named_and_each_fitted_on_one_stated_row():
    assert len(FITTED) <= 12
    for name in FITTED:
        assert len([r for r in RUNS if r.fits == name]) == 1, name
    assert fit() == pytest.approx(FITTED, rel=1e-3)
    for row in ROWS:
        if row.run.fits:  # a fitted constant reproduces its row
            assert abs(row.error) < 1e-3, (row.run.key, row.error)


def test_planner_defaults_are_the_fitted_constants():
    assert CATALOGUE["h100"].compute_efficiency == FITTED["meta"]
    assert CATALOGUE["a100"].compute_efficiency == pytest.approx(FITTED["meta"] * FITTED["a100"], abs=1e-4)
    assert FP8_SPEEDUP == FITTED["fp8_torchtitan"] and ATTENTION_RATE == FITTED["attention"]
    assert ASYNC_TP_HIDDEN == FITTED["async_tp"]


def test_published_layouts_fit_the_memory_model_on_their_hardware():
    for r in ROWS:
        assert r.fits and r.memory_gb <= CATALOGUE[r.run.gpu].memory_gb, (r.run.key, r.memory_gb)
    llama3 = BY_KEY["llama3-405b-8k"]  # TP8 PP16 with no recomputation, as Meta ran it
    # within 91% of the 80 GB: its last rank holds what its first does (112 layer micro-batches after the
    # interleaved warm-up), and the loss
    assert llama3.layout.activation_checkpoint == "none" and llama3.memory_gb < 0.91 * 80


def test_fp8_speeds_up_as_the_sources_show():
    bf16, fp8 = BY_KEY["titan-8b-128-bf16"], BY_KEY["titan-8b-128-fp8"]  # neither was fitted
    published = fp8.run.published / bf16.run.published  # torchtitan Table 3: 1.29
    assert fp8.tokens_per_gpu / bf16.tokens_per_gpu == pytest.approx(published, rel=0.05)
    # attention stays in bf16, so long sequences gain less from FP8
    long_bf16 = score(_with(bf16.run, seq_len=32768, global_batch=256, precision="bf16"))
    long_fp8 = score(_with(bf16.run, seq_len=32768, global_batch=256, precision="fp8"))
    assert 1 < long_fp8.tokens_per_gpu / long_bf16.tokens_per_gpu < fp8.tokens_per_gpu / bf16.tokens_per_gpu


def test_context_parallel_costs_what_the_sources_show():
    cp = [BY_KEY[f"titan-8b-8-cp{n}"] for n in (1, 2, 4, 8)]  # torchtitan Table 2: seq 32K → 256K, cp 1 → 8
    predicted = [r.tokens_per_gpu / cp[0].tokens_per_gpu for r in cp]
    published = [r.run.published / cp[0].run.published for r in cp]
    assert predicted == sorted(predicted, reverse=True)
    # within 30%: the cp1 row is predicted 11.5% low (its async TP hides the fitted share of the collectives,
    # not all of them) and cp8 11% high; the published 16 tokens/s is rounded, ±3%
    for p, q in zip(predicted[1:], published[1:]):
        assert p == pytest.approx(q, rel=0.30)
    # the same tokens per rank: the same memory per GPU (the source: 84 GiB at every cp)
    assert max(r.memory_gb for r in cp) - min(r.memory_gb for r in cp) < 1.0
    # Llama 3: CP16 at 131K tokens reaches 88% of the 8K run's TFLOP/s (fitted attention rate, not a prediction)
    ratio = BY_KEY["llama3-405b-16k-cp16"].mfu / BY_KEY["llama3-405b-16k"].mfu
    assert ratio == pytest.approx(380 / 400, rel=0.05)


def test_nemo_long_sequence_sweep_holds_from_4k_to_1m_tokens():
    """NeMo's Llama 2 7B table grows the sequence 256-fold and cp from 1 to 32 (with tp and dp changing): one
    constant for its cuDNN's attention speed, fitted at 128K, must carry every other row within 5%."""
    sweep = sorted((r for r in ROWS if r.run.stack == "nemo-2403"), key=lambda r: r.run.seq_len)
    assert [r.layout.cp for r in sweep] == [1, 1, 1, 2, 2, 4, 8, 16, 32]
    for r in sweep:
        assert abs(r.error) < 0.05, (r.run.key, r.error)
    # the source: TFLOP/s per GPU falls only 3.4% from 128K (cp 4) to 1M (cp 32), while 4K runs 38% faster
    tflops = {r.run.seq_len // 1024: r.tokens_per_gpu * ModelShape(r.run.cfg, r.run.seq_len).flops_per_token
              for r in sweep}
    assert tflops[1024] / tflops[128] == pytest.approx(536 / 555, abs=0.03)
    assert tflops[4] / tflops[128] == pytest.approx(768 / 555, rel=0.06)


def _without_fp32_merges(monkeypatch) -> list:
    """The CP sweeps scored as if torch's ring attention merged its steps for free."""
    monkeypatch.setitem(STACKS, "torchtitan", dataclasses.replace(STACKS["torchtitan"], cp_fp32_merge=False))
    return [score(r) for r in RUNS if r.key.startswith(CP_SWEEPS)]


def test_the_8b_cp_sweep_is_within_reach_of_the_bar_at_smelts_fixed_work(monkeypatch):
    """infra/README.md: the 8B CP sweep's floor. smelt's fixed work F (its compiled recomputation skipping w2, its
    fp32 ring merges paid per ring step, which lower the F that matters) leaves an attention cost that would bring
    all four rows within 15%, but barely (a floor of 14.6%); smelt's own worst row is within two points of that
    floor. The 405B sweep is well within reach."""
    small, large = (cp_sweep_floor(ROWS, prefix) for prefix in CP_SWEEPS)
    assert 0.14 < small["floor"] <= 0.15 and small["fixed_for_bar_s"] == small["fixed_s"], small
    assert small["smelt_worst"] < small["floor"] + 0.02, small
    assert large["floor"] < 0.15 and large["fixed_for_bar_s"] == large["fixed_s"], large
    free = cp_sweep_floor(_without_fp32_merges(monkeypatch), "titan-8b-8-cp")
    assert free["fixed_s"] > small["fixed_s"] and free["floor"] > small["floor"]


def test_the_cp_floor_is_the_best_attention_cost():
    # smelt's cp = 1 row 10% slower: a fixed work F past the one at which the bar can be met
    rows = [dataclasses.replace(r, tokens_per_gpu=r.tokens_per_gpu / 1.1) if r.run.key == "titan-8b-8-cp1" else r
            for r in ROWS]
    sweep = cp_sweep_floor(rows, "titan-8b-8-cp")
    steps, cps, fixed = sweep["published_step_s"], [1, 2, 4, 8], sweep["fixed_s"]
    best = sweep["balanced_attention_s"]
    assert _worst(steps, cps, fixed, best) == pytest.approx(sweep["floor"], abs=2e-4)
    for other in (0.9 * best, 0.99 * best, 1.01 * best, 1.1 * best):
        assert _worst(steps, cps, fixed, other) > sweep["floor"]
    # just below the F it names, the bar is met; above it, not
    f = sweep["fixed_for_bar_s"]
    assert sweep["floor"] > 0.15 and f < fixed
    assert _worst(steps, cps, f - 0.01, _balanced_attention(steps, cps, f - 0.01)) <= 0.15
    assert _worst(steps, cps, f + 0.01, _balanced_attention(steps, cps, f + 0.01)) > 0.15


def test_a_cp_sweep_must_keep_a_ranks_tokens_fixed():
    rows = [dataclasses.replace(r, run=dataclasses.replace(r.run, global_batch=r.run.global_batch * 2))
            if r.run.key == "titan-8b-8-cp4" else r for r in ROWS]
    with pytest.raises(ValueError, match="tokens fixed"):
        cp_sweep_floor(rows, "titan-8b-8-cp")


def test_context_parallel_under_a_pipeline_costs_what_the_source_shows():
    cp = [BY_KEY[f"titan-405b-512-cp{n}"] for n in (1, 2, 4, 8)]  # torchtitan Table 6: 405B, TP8 PP8, 32K → 256K
    predicted = [r.tokens_per_gpu / cp[0].tokens_per_gpu for r in cp]
    published = [r.run.published / cp[0].run.published for r in cp]  # 1, 0.62, 0.41, 0.21
    # within 30%: the cp1 row is predicted 11.5% low (its async TP hides the fitted share of the collectives,
    # not all of them) and cp8 11% high; the published 16 tokens/s is rounded, ±3%
    for p, q in zip(predicted[1:], published[1:]):
        assert p == pytest.approx(q, rel=0.30)


def test_torch_ring_attention_buffers_grow_with_cp_where_the_loss_does_not_hide_them():
    # on the 405B's first pipeline stage (no loss) the all-gathered K and V add to the peak as cp grows: the last
    # stage (loss, kept logits) holds the peak up to cp 4, and at cp 8 rank 0 with the ring's buffers overtakes it
    # (the source: 75.3 → 84.9 GiB from cp 1 to 8)
    memory = [BY_KEY[f"titan-405b-512-cp{n}"].memory_gb for n in (1, 2, 4, 8)]
    assert memory == sorted(memory) and memory[3] > memory[2]
    # on the 8B (pp 1) the rank's 50 GB loss has freed its logits before any layer's backward: no change
    cp8 = BY_KEY["titan-8b-8-cp8"]
    assert 0 < cp_ring_bytes(_shape(cp8.run), cp8.layout, 32768, "torchtitan") < 50e9
    assert cp8.memory_gb == pytest.approx(BY_KEY["titan-8b-8-cp1"].memory_gb, abs=0.1)
    # torchtitan's K and V are repeated to the query heads; Transformer Engine's ring is not counted
    assert cp_ring_bytes(_shape(cp8.run), cp8.layout, 32768, "torch") < cp_ring_bytes(
        _shape(cp8.run), cp8.layout, 32768, "torchtitan")
    assert cp_ring_bytes(_shape(cp8.run), cp8.layout, 32768, "megatron") == 0


def test_llm_foundry_fixed_cost_does_not_depend_on_scale():
    # LLM Foundry's H100 table runs MPT-13B at micro-batch 2 on 8, 16, 32 and 64 GPUs at 4,792-4,811 tokens/s per
    # GPU: its shortfall against the 7B row is per layer and micro-batch, not the network (the 64-GPU row fits it)
    row = BY_KEY["foundry-mpt-13b-h100-64-2048"]
    for gpus in (8, 16, 32):
        small = score(_with(row.run, gpus=gpus, global_batch=2 * gpus))
        assert small.tokens_per_gpu == pytest.approx(row.tokens_per_gpu, rel=0.02), gpus
    # the same cost is a smaller share of a larger micro-batch: full recomputation at mb 8 runs the 70B faster
    # per FLOP than the 13B at mb 2 (source: 42.6% against 39.9% MFU)
    assert BY_KEY["foundry-mpt-70b-h100-64-2048"].mfu > row.mfu


def test_torchtitan_compiled_loss_holds_fewer_logit_bytes():
    # June 2025's torchtitan compiles the loss (bf16 logits and gradient); December 2024's does not (12 bytes)
    assert STACKS["torchtitan-2506"].logits_bytes < STACKS["torchtitan"].logits_bytes
    for key in ("titan-h200-8b-32", "titan-h200-8b-64"):
        r = BY_KEY[key]
        assert r.memory_gb == pytest.approx(r.run.memory_gib * 2**30 / 1e9, rel=0.10), key


def test_torchtitan_vocabulary_parallel_loss_brings_the_70b_tp8_rows_within_10_percent():
    # under TP the eager loss runs through torch's decomposed loss_parallel: 16 bytes per logit, not 12
    assert STACKS["torchtitan"].loss_parallel_logits_bytes > STACKS["torchtitan"].logits_bytes
    for key in ("titan-70b-256", "titan-70b-256-asynctp"):
        r = BY_KEY[key]
        assert r.memory_gb == pytest.approx(r.run.memory_gib * 2**30 / 1e9, rel=0.10), key


def test_megatron_core_unfused_loss_weighs_on_the_smallest_model():
    # Megatron-Core r0.8's unfused vocab-parallel cross entropy moves 52 bytes per logit; with 131,072 logits per
    # token it costs the 1.7B (hidden 2,048, TP1) several percent and the 177B (hidden 12,288, TP8) almost nothing.
    # Megatron-Bridge's recipes fuse it, so scoring the same run as Bridge isolates the loss.
    assert STACKS["bridge"].loss_bytes < STACKS["megatron"].loss_bytes == STACKS["nemo"].loss_bytes
    gains = {}
    for key in ("megatron-1.7B", "megatron-177B"):
        row = BY_KEY[key]
        gains[key] = score(_with(row.run, stack="bridge")).tokens_per_gpu / row.tokens_per_gpu - 1
    assert 0.04 < gains["megatron-1.7B"] < 0.10 and 0 < gains["megatron-177B"] < 0.01, gains


def test_every_stack_names_its_memory_accounting():
    assert {s.saves for s in STACKS.values()} == {"torch", "torchtitan", "megatron"}


def _shape(run):
    return ModelShape(run.cfg, run.seq_len)


def _with(run, **changes):
    return dataclasses.replace(run, key=run.key + "-variant", fits=None, **changes)


def test_the_plot_is_written_as_png(tmp_path, capsys):
    from infra.validation_report import main

    path = tmp_path / "validation.png"
    main(["--plot", str(path)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    assert "held-out rows" in capsys.readouterr().out


def test_torchtitans_selective_policy_reruns_matmuls_and_under_tensor_parallel_gathers_again(monkeypatch):
    # its per-op policy reruns k, w3 and (at tp 1) wo, test_selective_policy.py; it keeps no all-gather output,
    # so under TP the backward also gathers the inputs of q/k/v and w1/w3 again: two collectives per layer more
    for name in ("torchtitan", "torchtitan-2506"):
        monkeypatch.setitem(STACKS, name, dataclasses.replace(STACKS[name], selective_policy="smelt"))
    tp8, tp1 = BY_KEY["titan-2506-8b-64-bf16"], BY_KEY["titan-8b-8-bf16"]
    tp1_gain, tp8_gain = (score(r.run).tokens_per_gpu / r.tokens_per_gpu for r in (tp1, tp8))
    assert 1.05 < tp1_gain < 1.10 and tp8_gain > tp1_gain + 0.02
