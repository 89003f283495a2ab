"""FLOPs per token against the formula; step time parts against hand computation."""

import dataclasses

import pytest

from infra.catalogue import gpu
from infra.layout import Layout, ModelShape, split_stages
from infra.timing import (ASYNC_TP_HIDDEN, FP8_SPEEDUP, TimingAssumptions, _fp8_cast_bytes, _fp8_linear_speedup,
                          _gemm_activation_bytes, _ring_collective, linear_seconds, rank_linears,
                          attention_seconds, step_time)
from tasks.model_config import PRESETS


def test_70b_parameters_and_flops_per_token_match_the_formula():
    cfg = PRESETS["70b"]
    assert cfg.num_params() == 70_553_706_496
    non_embedding = 69_503_033_344
    assert cfg.num_params(include_embedding=False) == non_embedding
    assert cfg.flops_per_token(8192) == 6 * non_embedding + 12 * 80 * 64 * 128 * 8192 == 481_442_709_504


def test_layer_and_output_flops_add_up_to_the_model_flops():
    shape = ModelShape(PRESETS["405b"], 8192)
    assert 126 * shape.layer_flops + shape.output_flops == pytest.approx(shape.flops_per_token)


def test_trainer_split_is_even_with_the_remainder_on_earlier_stages():
    shape = ModelShape(PRESETS["405b"], 8192)
    split = split_stages(shape, 16)  # 126 = 14 × 8 + 2 × 7
    assert (split.per_rank[0], split.per_rank[split.output_rank], split.max_layers) == (8, 7, 8)
    assert split.max_flops == pytest.approx(max(8 * shape.layer_flops, 7 * shape.layer_flops + shape.output_flops))


def test_zbv_folds_the_first_and_last_stage_onto_rank_0():
    shape = ModelShape(PRESETS["70b"], 8192)
    split = split_stages(shape, 4, virtual_stages=2, folded=True)  # 8 stages of 10 layers
    assert split.output_on_first and split.per_rank[0] == 20
    assert split.params[0] == 20 * shape.layer_params + shape.embedding_params + shape.output_params


def test_balanced_split_takes_one_layer_off_the_first_and_the_last_stage():
    split = split_stages(ModelShape(PRESETS["405b"], 8192), 16, style="balanced")
    assert (split.per_rank[0], split.per_rank[split.output_rank]) == (7, 7)  # as Llama 3 did (§3.3.2): 7 + 14 × 8 + 7
    assert sum(split.per_rank) == 126


def test_zero_bubble_v_leaves_what_torchs_order_leaves_a_fifth_of_1f1bs_bubble():
    shape, h100 = ModelShape(PRESETS["70b"], 8192), gpu("h100")
    base = dict(tp=8, pp=4, dp_replicate=1, dp_shard=128, zero=1, micro_batch=1)
    one_f_one_b = step_time(shape, Layout(**base), h100, 2048)
    zbv = step_time(shape, Layout(**base, pp_schedule="ZBVZeroBubble", virtual_stages=2), h100, 2048)
    # per layer and token: F = (L + A)/3, B = L/3 + 2A/3, W = L/3 with L = 6·params, A = 12·H·Q·T; here
    # B > F > W and B < F + W, where torch's order idles (pp − 1)·B, in a slot of both chunks' F + B + W
    lin, att = 6 * shape.layer_params, 12 * 64 * 128 * 8192
    b_share = (lin / 3 + 2 * att / 3) / (lin + att)
    slot = (zbv.compute + zbv.recompute + zbv.tp_comm + zbv.pp_comm) / 16
    assert zbv.bubble == pytest.approx(3 * b_share * slot / 2)
    assert 0.15 * one_f_one_b.bubble < zbv.bubble < 0.25 * one_f_one_b.bubble


def _attention(rate, seq=2048):
    """Attention at the GEMM ``rate`` (``attention=1``) scaled by FlashAttention-2's measured speed at 2K over its
    causal forward at 16K (FlashAttention-3 paper: causal forward 298 of 335 TFLOP/s, 362 without the mask,
    backward 291 without it); the forward does 2·H·Q·T FLOPs per token, the backward 2.5 times that."""
    forward = 2 * 768 * seq
    return forward / (rate * 298 / 335), 2.5 * forward / (rate * 291 * 298 / 362 / 335)


def _seconds_per_token(shape, rate, hbm=3.35e12):
    """Hand count for the 125m model (h 768, kv 256, f 2048, 12 layers, vocabulary 32,000): linear GEMMs at
    ``rate``, attention at FlashAttention-2's measured rate, the memory-bound ops (52h + 8kv + 16f bytes per
    layer), the GEMMs' activations (6 bytes per input and output of q, k, v, wo, w1, w3, w2) and their weights
    (6 bytes per parameter and micro-batch of one 2,048-token sequence), and the loss (12 bytes per logit) at
    HBM speed."""
    gemms = 6 * ((768 + 768) + 2 * (768 + 256) + (768 + 768) + 3 * (768 + 2048))
    layer = ((shape.layer_flops - shape.attention_flops) / rate + sum(_attention(rate))
             + (52 * 768 + 8 * 256 + 16 * 2048 + gemms) / hbm)
    weights = 6 * 12 * shape.layer_params / 2048 / hbm
    return layer, 12 * layer + weights + shape.output_flops / rate + 12 * 32000 / hbm


def test_a_tensor_parallel_shard_of_a_narrow_model_moves_the_most_gemm_bytes_per_flop():
    # A shard keeps the full-width side of each GEMM, so bytes per FLOP grow with tp and shrink with width.
    def per_flop(name, tp, fp8=False):
        shape = ModelShape(PRESETS[name], 8192)
        return _gemm_activation_bytes(shape, tp, fp8) / ((shape.layer_flops - shape.attention_flops) / tp)
    assert per_flop("8b", 8) > 3 * per_flop("8b", 1)
    assert per_flop("8b", 8) > 1.5 * per_flop("70b", 8) and per_flop("8b", 1) > 1.5 * per_flop("70b", 1)
    assert per_flop("8b", 8, fp8=True) == pytest.approx(per_flop("8b", 8) * 4 / 6)  # FP8 operands, bf16 results
    # the 8B at TP8 on an H100: GEMM traffic adds a fifth to its bf16 math at the fitted efficiency
    assert 0.15 < per_flop("8b", 8) * 0.6 * 989e12 / 3.35e12 < 0.25


def test_one_gpu_without_communication_runs_at_the_compute_efficiency_plus_memory_bound_ops():
    shape = ModelShape(PRESETS["125m"], 2048)
    plain = TimingAssumptions(compute=0.5, attention=1.0)
    step = step_time(shape, Layout(1, 1, 1, 1, 3, 1), gpu("h100"), global_seqs=4, a=plain)
    assert step.tp_comm == step.dp_comm == step.bubble == step.pp_comm == step.cp_comm == 0
    _, per_token = _seconds_per_token(shape, 0.5 * 989e12)
    assert step.mfu == pytest.approx(shape.flops_per_token / (per_token * 989e12))
    assert 0.35 < step.mfu < 0.5  # a small model loses a fifth of its time to memory-bound ops


def test_full_recomputation_costs_one_more_forward_of_the_layers():
    shape = ModelShape(PRESETS["125m"], 2048)
    step = step_time(shape, Layout(1, 1, 1, 1, 3, 1, "full"), gpu("h100"), 4,
                     TimingAssumptions(compute=0.5, attention=1.0))
    layer, per_token = _seconds_per_token(shape, 0.5 * 989e12)
    forward, backward = _attention(0.5 * 989e12)
    again = (layer - forward - backward) / 3 + forward  # the linear and memory-bound third, attention's forward
    assert step.recompute == pytest.approx(4 * 2048 * 12 * again)
    assert step.mfu == pytest.approx(shape.flops_per_token / ((per_token + 12 * again) * 989e12))


def test_attention_runs_at_its_kernels_measured_rate():
    # cuDNN's fused attention (Transformer Engine on Hopper) is faster than FlashAttention-2; longer calls run
    # nearer the kernels' peak; under context parallel each call sees seq_len / cp
    shape = ModelShape(PRESETS["8b"], 8192)
    one = Layout(1, 1, 1, 8, 3, 1)
    fa2 = sum(attention_seconds(shape, one, gpu("h100"), TimingAssumptions()))
    cudnn = sum(attention_seconds(shape, one, gpu("h100"), TimingAssumptions(attention_kernel="cudnn")))
    assert 1.5 < fa2 / cudnn < 1.7  # FlashAttention-3 paper at 8K: 529 vs 333 causal forward, 518 vs 318 backward
    short = sum(attention_seconds(ModelShape(PRESETS["8b"], 1024), one, gpu("h100"), TimingAssumptions()))
    assert short * 8 > fa2  # an eighth of the FLOPs per token, but a slower kernel at 1K
    cp2 = dataclasses.replace(one, cp=2, dp_shard=4)
    ring = sum(attention_seconds(ModelShape(PRESETS["8b"], 16384), cp2, gpu("h100"), TimingAssumptions()))
    assert ring == pytest.approx(2 * fa2)  # twice the keys per query, the same 8K calls


def test_selective_recomputation_costs_memory_traffic_not_flops():
    shape = ModelShape(PRESETS["125m"], 2048)  # h 768, kv 256, f 2048, 12 layers
    step = step_time(shape, Layout(1, 1, 1, 1, 3, 1, "selective"), gpu("h100"), 4)
    per_token_layer = 18 * 768 + 4 * 256 + 10 * 2048
    assert step.recompute == pytest.approx(4 * 2048 * 12 * per_token_layer / 3.35e12)


def test_tensor_parallel_traffic_is_eight_ring_collectives_per_layer_over_nvlink():
    shape, h100 = ModelShape(PRESETS["70b"], 8192), gpu("h100")
    layout = Layout(tp=8, pp=1, dp_replicate=1, dp_shard=512, zero=3, micro_batch=1)
    step = step_time(shape, layout, h100, global_seqs=2048)  # 4 micro-batches per rank
    per_layer = 8 * (7 / 8 * (8192 * 8192 * 2) / (450e9 * 0.8) + (8.4 + 7 * 3.4) * 1e-6)  # + NCCL's ring latency
    assert step.tp_comm == pytest.approx(4 * 80 * per_layer)


def test_overlapped_tensor_parallel_leaves_the_last_reduce_scatter_chunk_exposed():
    # Transformer Engine pipelines the two forward reduce-scatters per layer in 4 splits; PyTorch's async TP
    # fuses all four (forward and backward) in tp chunks, and hides its fitted share of the 8 collectives per
    # layer. The compute window here hides everything else.
    shape, h100 = ModelShape(PRESETS["70b"], 8192), gpu("h100")
    layout = Layout(tp=4, pp=1, dp_replicate=1, dp_shard=1024, zero=3, micro_batch=1)
    collective = 3 / 4 * (8192 * 8192 * 2) / (450e9 * 0.8) + (8.4 + 3 * 3.4) * 1e-6
    cases = (("te", ASYNC_TP_HIDDEN, 2 * 80 / 4), ("torch", ASYNC_TP_HIDDEN, 8 * 80 * (1 - ASYNC_TP_HIDDEN)),
             ("torch", 1.0, 4 * 80 / 4))  # hiding it all leaves the last chunk's share
    for kind, hidden, exposed in cases:
        overlap = TimingAssumptions(tp_overlap=0.9, tp_overlap_kind=kind, async_tp_hidden=hidden)
        step = step_time(shape, layout, h100, global_seqs=2048, a=overlap)
        assert step.tp_comm == pytest.approx(2 * exposed * collective), kind  # 2 micro-batches per rank
    with pytest.raises(ValueError, match="tp_overlap_kind"):
        TimingAssumptions(tp_overlap_kind="nccl")


def test_pipeline_bubble_is_p_minus_1_over_v_slots():
    shape = ModelShape(PRESETS["8b"], 4096)
    for v in (1, 2, 4):
        layout = Layout(tp=2, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, virtual_stages=v)
        step = step_time(shape, layout, gpu("h100"), global_seqs=16)  # m = 8
        slots = step.compute + step.recompute + step.tp_comm + step.pp_comm
        assert step.bubble / slots == pytest.approx(3 / v / 8)


def test_pipeline_sends_cross_the_nic_only_between_nodes():
    # pp is the outermost mesh dimension, so stages sit world/pp GPUs apart: 4 apart on 16 GPUs (two stages per
    # node: an edge rank sends one way over NVLink, the other over the NIC), 8 apart on 32 (every send leaves the
    # node), 2 apart on 8 (the whole pipeline in one node)
    shape, h100 = ModelShape(PRESETS["8b"], 4096), gpu("h100")
    activation = 4096 * 4096 * 2
    nvlink, nic = h100.nvlink_gbps * 1e9 * 0.8, h100.internode_gbps * 1e9 * 0.8
    for dp, per_send in ((4, 1 / nvlink + 1 / nic), (8, 2 / nic), (2, 2 / nvlink)):
        layout = Layout(tp=1, pp=4, dp_replicate=1, dp_shard=dp, zero=1, micro_batch=1, virtual_stages=2)
        step = step_time(shape, layout, h100, global_seqs=8 * dp)  # m = 8
        assert step.pp_comm == pytest.approx(8 * 2 * activation * per_send * 0.5), dp


def test_mfu_is_model_flops_over_peak_times_time():
    shape, h100 = ModelShape(PRESETS["70b"], 8192), gpu("h100")
    layout = Layout(tp=8, pp=4, dp_replicate=1, dp_shard=128, zero=1, micro_batch=1, virtual_stages=7)
    step = step_time(shape, layout, h100, 2048)
    assert step.mfu * step.total * 4096 * 989e12 == pytest.approx(2048 * 8192 * shape.flops_per_token)
    assert step.tokens_per_s == pytest.approx(2048 * 8192 / step.total)


def test_more_fsdp_traffic_than_compute_is_exposed():
    shape = ModelShape(PRESETS["8b"], 8192)
    slow_network = gpu("h100", internode_gbps=1)
    layout = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=64, zero=3, micro_batch=1)
    fast = step_time(shape, layout, gpu("h100"), 64)
    slow = step_time(shape, layout, slow_network, 64)
    assert slow.dp_comm > 10 * fast.dp_comm and slow.compute == fast.compute


def test_bad_efficiency_is_rejected():
    with pytest.raises(ValueError, match="efficiency compute"):
        TimingAssumptions(compute=1.5)
    with pytest.raises(ValueError, match="overlap dp_overlap"):
        TimingAssumptions(dp_overlap=-0.1)


def test_the_planners_even_split_is_the_trainers():
    from infra.layout import stage_layers
    from tasks.train.pipeline_parallel import layer_split
    for n_layers, stages in ((126, 8), (126, 16), (80, 8), (32, 3), (10, 10)):
        assert stage_layers(n_layers, stages) == [len(r) for r in layer_split(n_layers, stages)]


def test_torchtitan_split_gives_the_middle_stages_the_remainder():
    # torchtitan's generate_split_points (December 2024): the first stage the base count, the middle stages
    # one more while the remainder lasts, the last stage what is left
    from infra.layout import stage_layers
    assert stage_layers(126, 8, "torchtitan") == [15, 16, 16, 16, 16, 16, 16, 15]
    assert stage_layers(126, 16, "torchtitan") == [7] + [8] * 14 + [7]
    assert stage_layers(126, 8) == [16] * 6 + [15] * 2  # smelt's: the remainder first
    assert stage_layers(10, 1, "torchtitan") == [10] and stage_layers(10, 2, "torchtitan") == [5, 5]
    split = split_stages(ModelShape(PRESETS["405b"], 8192), 8, style="torchtitan")
    assert (split.per_rank[0], split.per_rank[split.output_rank], split.max_layers) == (15, 15, 16)
    assert split.max_params == 16 * split.params[1] // 16 == split.params[1]  # a middle rank holds the most
    with pytest.raises(ValueError, match="even, balanced, torchtitan"):
        split_stages(ModelShape(PRESETS["405b"], 8192), 8, style="uneven")


def test_fp8_sequence_parallel_gathers_halve_the_all_gathers_and_only_where_a_stack_sends_fp8():
    """smelt's trainer gathers bf16 activations under FP8 (the planner's default); TE and torchao's float8
    TP plans gather FP8: the inputs of q/k/v and w1/w3 forward, the output gradients of wo and w2 backward
    (cast on their shard before the gather), so 4 of the 8 TP collectives per layer move half the bytes."""
    shape = ModelShape(PRESETS["70b"], 8192)
    layout = Layout(tp=8, pp=1, dp_replicate=1, dp_shard=512, zero=3, micro_batch=1, precision="fp8")
    bf16_gathers = step_time(shape, layout, gpu("h100"), 2048)
    fp8_gathers = step_time(shape, layout, gpu("h100"), 2048, TimingAssumptions(fp8_tp_gathers=True))
    assert fp8_gathers.tp_comm == pytest.approx(bf16_gathers.tp_comm * (8 - 4 / 2) / 8)
    bf16 = dataclasses.replace(layout, precision="bf16")
    assert step_time(shape, bf16, gpu("h100"), 2048, TimingAssumptions(fp8_tp_gathers=True)).tp_comm == \
        step_time(shape, bf16, gpu("h100"), 2048).tp_comm


def test_fp8_casts_of_gathered_tensors_are_full_width_under_tensor_parallel():
    """Four tensors per layer are full width where a TP rank's GEMMs read them (the gathered inputs of
    q/k/v and w1/w3, the gathered output gradients of wo and w2): cast whole after a bf16 gather (6 bytes an
    element), or cast on the shard and transposed whole after an FP8 gather (5/tp + 2); the rest, and
    everything at tp 1, is cast on this rank's shard in one pass (6 bytes)."""
    shape = ModelShape(PRESETS["8b"], 8192)
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    sharded = 2 * h + 2 * kv + 3 * f
    assert _fp8_cast_bytes(shape, 1, True) == _fp8_cast_bytes(shape, 1, False) == 6 * (sharded + 4 * h)
    assert _fp8_cast_bytes(shape, 8, False) == pytest.approx(6 * sharded / 8 + 6 * 4 * h)
    assert _fp8_cast_bytes(shape, 8, True) == pytest.approx(6 * sharded / 8 + 5 * 4 * h / 8 + 2 * 4 * h)
    # FP8 gathers cast less than bf16 ones, and a TP8 rank casts more per token than an eighth of a TP1 rank
    assert _fp8_cast_bytes(shape, 1, True) / 8 < _fp8_cast_bytes(shape, 8, True) < _fp8_cast_bytes(shape, 8, False)


def test_fp8_gains_nothing_on_gemms_torchao_finds_too_narrow():
    """torchao's tensorwise bound (K ≤ 4096 inputs and N ≤ 1024 outputs) on the GEMM each rank runs: Llama 3 8B's
    k and v (4096 → 1024) at any tp, q too at tp 8 (4096 → 512); nothing of a 70B's at tp 8 (its inputs are
    8,192 wide). The speed-up is the FLOP-weighted harmonic mean of the GEMMs' rates."""
    a = TimingAssumptions()
    cfg = PRESETS["8b"]
    h, kv, f = cfg.dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden
    total = 2 * h * h + 2 * h * kv + 3 * h * f
    for tp, slow in ((1, 2 * h * kv), (8, h * h + 2 * h * kv)):
        expected = total / ((total - slow) / FP8_SPEEDUP + slow)
        assert _fp8_linear_speedup(ModelShape(cfg, 8192), tp, a) == pytest.approx(expected)
    assert _fp8_linear_speedup(ModelShape(PRESETS["70b"], 8192), 8, a) == pytest.approx(FP8_SPEEDUP)
    every_gemm = dataclasses.replace(a, fp8_gainless_gemm=None)  # Transformer Engine's stacks
    assert _fp8_linear_speedup(ModelShape(cfg, 8192), 8, every_gemm) == pytest.approx(FP8_SPEEDUP)
    # so FP8 gains less on an 8B at tp 8 than at tp 1, and the bf16 step does not change
    shape, h100 = ModelShape(cfg, 8192), gpu("h100")
    gain = {}
    for tp in (1, 8):
        layout = Layout(tp=tp, pp=1, dp_replicate=1, dp_shard=64 // tp, zero=3, micro_batch=2)
        bf16 = step_time(shape, layout, h100, 128)
        assert bf16.total == step_time(shape, layout, h100, 128, every_gemm).total
        fp8 = dataclasses.replace(layout, precision="fp8")
        gain[tp] = bf16.total / step_time(shape, fp8, h100, 128).total
        assert gain[tp] < bf16.total / step_time(shape, fp8, h100, 128, every_gemm).total
    assert 1 < gain[8] < gain[1]


def test_compiled_full_recomputation_skips_w2_and_its_reduce_scatter():
    """Compiled over the checkpoint, full recomputation reruns the block but its last matmul, w2 (row-parallel:
    f/tp inputs, h outputs), and under TP that matmul's reduce-scatter: 11 collectives a layer, not 12."""
    shape, h100 = ModelShape(PRESETS["70b"], 8192), gpu("h100")
    c = shape.cfg
    layout = Layout(tp=8, pp=1, dp_replicate=1, dp_shard=64, zero=3, micro_batch=1, activation_checkpoint="full")
    eager, compiled = TimingAssumptions(), TimingAssumptions(compiled_recompute=True)
    a, b = step_time(shape, layout, h100, 64, eager), step_time(shape, layout, h100, 64, compiled)
    i, o, rate = c.ffn_hidden // 8, c.dim, h100.peak_flops * h100.compute_efficiency
    w2 = 8192 * c.n_layers * (2 * i * o / rate + (2 * i + 2 * o) / (h100.hbm_tbps * 1e12))
    assert a.recompute - b.recompute == pytest.approx(w2)
    assert b.tp_comm == pytest.approx(a.tp_comm * 11 / 12)
    assert a.compute == b.compute
    selective = dataclasses.replace(layout, activation_checkpoint="selective")  # nothing else changes
    assert step_time(shape, selective, h100, 64, eager).total == step_time(shape, selective, h100, 64, compiled).total


def test_torchs_ring_attention_merges_each_step_into_fp32_buffers():
    """After every ring step but the first: the forward reads the fp32 running output and the step's bf16 output
    and writes the buffer (10 bytes per query element), again under full recomputation; the backward does the
    same for dq and for the K/V gradients the ring passes on. Linear in cp − 1, none at cp 1, none on TE."""
    shape, h100 = ModelShape(PRESETS["8b"], 131072), gpu("h100")
    c = shape.cfg
    merged = TimingAssumptions(cp_rotate="allgather", cp_kv_repeated=True, cp_fp32_merge=True)
    free = dataclasses.replace(merged, cp_fp32_merge=False)
    for cp, ac in ((1, "full"), (4, "full"), (8, "full"), (8, "none")):
        layout = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=8 // cp, zero=3, micro_batch=1, cp=cp,
                        activation_checkpoint=ac)
        with_merges = step_time(shape, layout, h100, 8 // cp, merged)
        without = step_time(shape, layout, h100, 8 // cp, free)
        tokens, q = 131072 // cp, c.n_heads * c.head_dim  # K/V repeated: as wide as q
        per_step = tokens * c.n_layers * 10 / (h100.hbm_tbps * 1e12)
        assert with_merges.compute - without.compute == pytest.approx((cp - 1) * per_step * 4 * q)
        recomputed = (cp - 1) * per_step * q if ac == "full" else 0.0
        assert with_merges.recompute - without.recompute == pytest.approx(recomputed, abs=1e-12)


def test_torchs_allgather_rotater_exposes_what_the_local_block_cannot_hide():
    # 405B, TP8 in the node, CP8 across nodes (one NIC per rank): all seven K/V chunks gathered behind the local
    # block, repeated to the query heads, against a ring that hides each chunk behind a layer's attention
    shape, h100 = ModelShape(PRESETS["405b"], 262144), gpu("h100")
    layout = Layout(tp=8, pp=1, dp_replicate=1, dp_shard=1, zero=1, micro_batch=1, cp=8)
    ring = step_time(shape, layout, h100, 1)
    gathered = step_time(shape, layout, h100, 1, TimingAssumptions(cp_rotate="allgather", cp_kv_repeated=True))
    assert ring.cp_comm == 0  # 8 KV heads over TP8: one per rank, hidden
    tokens, layers = 262144 // 8, 126
    fwd, bwd = attention_seconds(shape, layout, h100, TimingAssumptions())
    chunks = 7 * tokens * 2 * (128 // 8) * 128 * 2 / (50e9 * 0.8)  # bf16 K and V of 16 heads, one NIC
    expected = layers * (max(chunks - tokens * fwd / 8, 0) + max(chunks - tokens * bwd / 8, 0)
                         + max(2 * chunks - 0.9 * tokens * bwd, 0))
    assert gathered.cp_comm == pytest.approx(expected) and expected > 0.02 * gathered.total
    with pytest.raises(ValueError, match="cp_rotate"):
        TimingAssumptions(cp_rotate="alltoall")


def test_a_collective_pays_nccls_ring_latency_on_the_protocol_nccl_would_pick():
    # 2,048 ranks on 512 nodes: 2,047 steps, 511 across nodes; LL128 (14 + 1.9/step + 4.0/network step µs, 92% of
    # the bandwidth) for a small message, Simple (8.4 + 3.4 + 14.0 µs, all of it) for a long one
    assert _ring_collective(0.0, 2048, 512) == pytest.approx((14 + 1536 * 1.9 + 511 * 4.0) * 1e-6)
    assert _ring_collective(1.0, 2048, 512) == pytest.approx(1.0 + (8.4 + 1536 * 3.4 + 511 * 14.0) * 1e-6)
    assert _ring_collective(5e-3, 8, 1) == pytest.approx(5e-3 + (8.4 + 7 * 3.4) * 1e-6)  # TP8 in a node
    assert _ring_collective(1.0, 1, 1) == 0.0


def test_a_ranks_linears_are_the_blocks_column_shards_and_row_shards():
    cfg = PRESETS["8b"]  # h 4096, 8 K/V heads of 128, f 14336
    assert rank_linears(ModelShape(cfg, 8192), 8) == [("q", 4096, 512), ("k", 4096, 128), ("v", 4096, 128),
                                                      ("w1", 4096, 1792), ("w3", 4096, 1792),
                                                      ("wo", 512, 4096), ("w2", 1792, 4096)]


def test_a_blocks_linears_alone_add_up_to_what_the_step_charges_them():
    """``linear_seconds`` (bench/fp8_linears.py's prediction) against ``step_time``'s own terms for a block's
    linears: their math, their activation traffic per token and their weights' traffic per micro-batch."""
    shape, h100, a = ModelShape(PRESETS["8b"], 8192), gpu("h100"), TimingAssumptions()
    tokens, rate, hbm = 16384, h100.peak_flops * h100.compute_efficiency, h100.hbm_tbps * 1e12
    for tp in (1, 8):
        alone = sum(linear_seconds(i, o, tokens, h100, False, a) for _, i, o in rank_linears(shape, tp))
        linear_flops = (shape.layer_flops - shape.attention_flops) / tp
        weights = sum(i * o for _, i, o in rank_linears(shape, tp))
        # (the step's layer FLOPs also count the two norms' weights, 6·2h of some 6·218M per token)
        assert alone == pytest.approx(tokens * (linear_flops / rate + _gemm_activation_bytes(shape, tp, False) / hbm)
                                      + 6 * weights / hbm, rel=1e-4)


def test_fp8_gains_on_a_wide_linear_and_loses_on_one_torchao_finds_too_narrow():
    h100, a = gpu("h100"), TimingAssumptions()

    def gain(i, o, tokens):
        return linear_seconds(i, o, tokens, h100, False, a) / linear_seconds(i, o, tokens, h100, True, a)

    assert 1 < gain(8192, 3584, 4096) < gain(8192, 3584, 131072) < FP8_SPEEDUP  # the casts weigh less on more rows
    assert gain(4096, 128, 131072) < 1  # 8B's k at any tp: the bf16 rate plus the casts
