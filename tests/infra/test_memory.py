"""Per-rank memory: ZeRO model states as in the ZeRO paper, activations and buffers by hand."""

import dataclasses

import pytest

from infra.catalogue import gpu
from infra.layout import Layout, ModelShape
from infra.memory import (GB, MemoryAssumptions, inflight_forwards, inflight_microbatches, layer_activation_bytes,
                          memory_per_rank, model_state_bytes)
from tasks.model_config import PRESETS, ModelConfig

PAPER = MemoryAssumptions(grad_bytes=2)  # ZeRO paper: fp16 gradients, K = 12
SMALL = ModelConfig(dim=1024, n_layers=4, n_heads=8, n_kv_heads=4, ffn_hidden=4096, vocab_size=8192)


@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_for_7_5b_on_64_gpus_match_the_zero_paper(stage, expected_gb):
    total = sum(model_state_bytes(7.5e9, stage, 64, PAPER))
    assert round(total / GB, 1) == expected_gb


def test_zero_stage_formulas_hold_exactly():
    psi, n = 7.5e9, 64
    assert sum(model_state_bytes(psi, 1, n, PAPER)) == pytest.approx(4 * psi + 12 * psi / n)
    assert sum(model_state_bytes(psi, 2, n, PAPER)) == pytest.approx(2 * psi + 14 * psi / n)
    assert sum(model_state_bytes(psi, 3, n, PAPER)) == pytest.approx(16 * psi / n)
    with pytest.raises(ValueError, match="ZeRO stage must be"):
        model_state_bytes(psi, 4, n)


def test_layer_activations_per_token_by_recomputation_mode():
    shape = ModelShape(SMALL, 512)  # h = 1024, kv = 512, f = 4096
    # none: 4h whole + (8h + 4kv + 8f)/t
    assert layer_activation_bytes(shape, 2, "none") == 4096 + (8192 + 2048 + 32768) / 2
    assert layer_activation_bytes(shape, 1, "none") == 12 * 1024 + 4 * 512 + 8 * 4096
    # selective: 8h whole + (10h + 4kv + 4f)/t with TP; 10h + 4kv + 4f without
    assert layer_activation_bytes(shape, 2, "selective") == 8192 + (10240 + 2048 + 16384) / 2
    assert layer_activation_bytes(shape, 1, "selective") == 10240 + 2048 + 16384
    assert layer_activation_bytes(shape, 2, "full") == 1024
    with pytest.raises(ValueError, match="activation_checkpoint must be one of"):
        layer_activation_bytes(shape, 2, "some")


def test_trainers_selective_policy_keeps_more_than_none_under_tensor_parallel():
    shape = ModelShape(PRESETS["70b"], 8192)
    assert layer_activation_bytes(shape, 8, "selective") > layer_activation_bytes(shape, 8, "none")
    assert layer_activation_bytes(shape, 1, "selective") < layer_activation_bytes(shape, 1, "none")


def test_memory_breakdown_matches_a_hand_computed_zero3_case():
    layout = Layout(tp=2, pp=1, dp_replicate=1, dp_shard=4, zero=3, micro_batch=2)
    mem = memory_per_rank(ModelShape(SMALL, 512), layout, gpu("h100"), microbatches=1)
    # layer 15,730,688 params; embedding 8,388,608; output 8,389,632 → 79,700,992 / tp 2 = 39,850,496
    assert mem.params == 2 * 39_850_496 / 4
    assert mem.grads == 4 * 39_850_496 / 4
    assert mem.optimizer == 12 * 39_850_496 / 4
    assert mem.fsdp_buffers == 15_730_688 / 2 * (2 * 2 + 4)  # two gathered bf16 layers + one fp32 gradient
    # 4 layers × bytes/token × (2 × 512) tokens, and the head: the final norm's input (2h / tp) and the output
    # projection's gathered input (2h)
    assert mem.activations == 4 * 25_600 * 1024 + (2 * 1024 + 1024) * 1024
    assert mem.logits == 1024 * 8192 / 2 * 6  # tp 2: the trainer's chunked loss, 6 bytes per logit
    assert mem.usable == 72e9 and mem.fits


def test_vocabulary_parallel_loss_holds_its_own_bytes_per_logit_only_under_tensor_parallel():
    # torch.distributed.tensor.parallel.loss decomposes log-softmax and its backward (four fp32 tensors at once)
    a = MemoryAssumptions(logits_bytes=12, loss_parallel_logits_bytes=16)
    shape = ModelShape(SMALL, 512)
    for tp, per_logit in ((1, 12), (2, 16)):
        layout = Layout(tp=tp, pp=1, dp_replicate=1, dp_shard=4, zero=3, micro_batch=2)
        mem = memory_per_rank(shape, layout, gpu("h100"), microbatches=1, a=a)
        assert mem.logits == 1024 * SMALL.vocab_size / tp * per_logit


def test_full_recomputation_keeps_inputs_plus_one_layer():
    shape = ModelShape(SMALL, 512)
    layout = Layout(tp=2, pp=1, dp_replicate=1, dp_shard=4, zero=3, micro_batch=2, activation_checkpoint="full")
    mem = memory_per_rank(shape, layout, gpu("h100"), microbatches=1)
    # 4 inputs + one layer's recomputed rest, and the head's saved inputs
    assert mem.activations == (4 * 1024 + 25_600 - 1024) * 1024 + (2 * 1024 + 1024) * 1024


def test_pipeline_first_stage_holds_pp_microbatches_and_interleaving_adds_more():
    one_f_one_b = Layout(tp=1, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1)
    interleaved = Layout(tp=1, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, virtual_stages=2)
    assert inflight_microbatches(one_f_one_b, 8) == 4
    assert inflight_microbatches(one_f_one_b, 2) == 2
    assert inflight_microbatches(interleaved, 8) == 4 * (1 + 3 / 8)


def test_the_interleaved_last_rank_holds_pp_micro_batches_of_its_first_stage():
    # torch's (and Megatron's) warm-up runs (v − 1)·pp forwards on the last rank before its first backward:
    # pp micro-batches of its first stage, then one of the stage with the loss
    interleaved = Layout(tp=1, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, virtual_stages=2,
                         pp_schedule="Interleaved1F1B")
    one_f_one_b = dataclasses.replace(interleaved, virtual_stages=1, pp_schedule="1F1B")
    assert inflight_forwards(interleaved, 8, rank=3) == (4, 1)
    assert inflight_forwards(one_f_one_b, 8, rank=3) == (1,) and inflight_forwards(one_f_one_b, 8, rank=1) == (3,)
    shape, h100 = ModelShape(PRESETS["8b"], 8192), gpu("h100")
    a = MemoryAssumptions(torch_pipelining=False)
    kept = layer_activation_bytes(shape, 1, "none") * 8192  # one layer's saves, one micro-batch
    loss_rank = {x: memory_per_rank(shape, x, h100, 8, a) for x in (one_f_one_b, interleaved)}
    # 8 layers per rank either way; the interleaved last rank adds 3 more micro-batches of its first 4 layers
    assert loss_rank[interleaved].activations - loss_rank[one_f_one_b].activations == pytest.approx(3 * 4 * kept)
    with pytest.raises(ValueError, match="rank"):
        inflight_forwards(interleaved, 8, rank=4)


def test_a_layout_that_does_not_fit_says_by_how_much():
    layout = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=8, zero=3, micro_batch=8)
    mem = memory_per_rank(ModelShape(SMALL, 8192), layout, gpu("h100", memory_gb=8), microbatches=1)
    rejection = mem.rejection(layout)
    assert not mem.fits and rejection.reason == "memory.exceeds_capacity"
    assert "GB usable" in rejection.message and rejection.excess == pytest.approx(mem.total - mem.usable)


def test_a_layout_just_over_the_limit_shows_two_numbers_that_differ():
    layout = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=8, zero=3, micro_batch=8)
    shape = ModelShape(SMALL, 8192)
    mem = memory_per_rank(shape, layout, gpu("h100", memory_gb=8), microbatches=1)
    tight = gpu("h100", memory_gb=8 * (mem.total - 0.01 * GB) / mem.usable)  # usable 10 MB short of the need
    message = memory_per_rank(shape, layout, tight, microbatches=1).rejection(layout).message
    needs, usable = (float(part.split(" GB")[0].split()[-1]) for part in message.split(" > "))
    assert needs > usable, message


def test_megatron_saves_sharded_inputs_and_fp8_keeps_linear_inputs_in_one_byte():
    shape = ModelShape(SMALL, 512)  # h = 1024, kv = 512, f = 4096
    assert layer_activation_bytes(shape, 2, "none", "megatron") == (12 * 1024 + 4 * 512 + 6 * 4096) / 2
    assert layer_activation_bytes(shape, 2, "selective", "megatron") == layer_activation_bytes(shape, 2, "none",
                                                                                               "megatron")
    assert layer_activation_bytes(shape, 2, "none", "megatron", "fp8") == (10 * 1024 + 4 * 512 + 5 * 4096) / 2
    assert layer_activation_bytes(shape, 1, "selective", "torchtitan") == 8 * 1024 + 2 * 512 + 2 * 4096


def test_context_parallel_splits_activations_and_shares_the_optimizer_states():
    shape, h100 = ModelShape(PRESETS["8b"], 16384), gpu("h100")
    plain = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=8, zero=3, micro_batch=1, activation_checkpoint="full")
    cp = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=4, zero=3, micro_batch=1, activation_checkpoint="full", cp=2)
    a, b = memory_per_rank(shape, plain, h100, 1), memory_per_rank(shape, cp, h100, 1)
    assert b.activations == pytest.approx(a.activations / 2) and b.logits == pytest.approx(a.logits / 2)
    assert b.optimizer == pytest.approx(a.optimizer)  # states shard over dp_shard × cp = 8 either way


def test_interleaving_counts_the_layers_of_each_virtual_stage_in_flight():
    # Llama 3: 16 ranks × 8 virtual stages; rank 0's first holds only the embedding, so the 2·15 + 7·16 + 1 = 143
    # forwards before its first backward hold 7 layers × 16 micro-batches
    meta = Layout(tp=8, pp=16, dp_replicate=1, dp_shard=64, zero=2, micro_batch=1, pp_schedule="Interleaved1F1B",
                  virtual_stages=8, stage_split="balanced")
    assert inflight_microbatches(meta, 32, (0, 1, 1, 1, 1, 1, 1, 1)) == 16
    assert inflight_microbatches(meta, 32) == pytest.approx(16 * (1 + 15 / 128))  # uniform stages


def test_a_gelu_mlp_keeps_its_two_outputs_instead_of_swiglus_four():
    cfg = ModelConfig(dim=1024, n_layers=4, n_heads=8, n_kv_heads=8, ffn_hidden=8 * round(1024 / 3), vocab_size=8192)
    swiglu, gelu = ModelShape(cfg, 512), ModelShape(cfg, 512, gelu_mlp=True)
    f = cfg.ffn_hidden
    assert layer_activation_bytes(swiglu, 1, "none") - layer_activation_bytes(gelu, 1, "none") == 2 * f
    assert layer_activation_bytes(swiglu, 1, "selective") - layer_activation_bytes(gelu, 1, "selective") == f


def test_torch_pipelining_buffers_count_on_rank_0_and_megatron_stacks_have_none():
    # 1F1B, 8 micro-batches on 4 ranks: rank 0 receives a gradient buffer per micro-batch and keeps the outputs
    # of the 4 forwards in flight, each a micro-batch's sequence-sharded bf16 hidden states
    from infra.memory import pipeline_buffer_bytes
    shape, h100 = ModelShape(PRESETS["8b"], 8192), gpu("h100")
    layout = Layout(tp=2, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, activation_checkpoint="full")
    boundary = 8192 * 4096 * 2 / 2
    assert pipeline_buffer_bytes(shape, layout, 8, 8192) == (8 + 4) * boundary
    torch_run = memory_per_rank(shape, layout, h100, 8)
    megatron = memory_per_rank(shape, layout, h100, 8, MemoryAssumptions(torch_pipelining=False))
    # here the output rank, with its 3 GB of logits, is the busiest: it holds the activation receive buffers of
    # the 7 micro-batches not in flight
    assert torch_run.logits > 0 and torch_run.activations - megatron.activations == pytest.approx(7 * boundary)
    assert pipeline_buffer_bytes(shape, dataclasses.replace(layout, pp=1), 8, 8192) == 0


def test_outputs_torch_keeps_until_the_next_step_are_counted_where_the_stack_keeps_them():
    # torch before #153383 kept every stage's outputs of all micro-batches (torchtitan, December 2024), later
    # releases the last stage's; smelt's trainer keeps none (return_outputs=False)
    from infra.memory import kept_logits_bytes, pipeline_buffer_bytes
    shape, h100 = ModelShape(PRESETS["8b"], 8192), gpu("h100")
    layout = Layout(tp=2, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, activation_checkpoint="full")
    boundary = 8192 * 4096 * 2 / 2
    assert pipeline_buffer_bytes(shape, layout, 8, 8192, "all") - pipeline_buffer_bytes(shape, layout, 8, 8192) \
        == (8 - 4) * boundary  # rank 0 keeps all 8 outputs, not only the 4 in flight
    logits = 8 * 8192 * shape.cfg.vocab_size / 2 * 2  # 8 micro-batches of bf16 logits, vocabulary-sharded
    assert kept_logits_bytes(shape, layout, 8, 8192, "last") == logits
    assert kept_logits_bytes(shape, layout, 8, 8192, "none") == 0
    assert kept_logits_bytes(shape, dataclasses.replace(layout, pp=1), 8, 8192, "all") == 0
    smelt = memory_per_rank(shape, layout, h100, 8)
    last = memory_per_rank(shape, layout, h100, 8, MemoryAssumptions(kept_outputs="last"))
    assert last.logits - smelt.logits == pytest.approx(logits) and last.total > smelt.total
    with pytest.raises(ValueError, match="kept_outputs"):
        pipeline_buffer_bytes(shape, layout, 8, 8192, "some")
    with pytest.raises(ValueError, match="kept_outputs"):
        kept_logits_bytes(shape, layout, 8, 8192, "some")


def test_input_gradients_kept_until_the_next_step_count_on_stages_past_the_first():
    # torch before #164329 kept every micro-batch's input gradient on each stage past the first; this torch does
    # under ZB-V's split backward only
    from infra.memory import keeps_input_grads, pipeline_buffer_bytes
    shape, h100 = ModelShape(PRESETS["8b"], 8192), gpu("h100")
    one_f_one_b = Layout(tp=2, pp=4, dp_replicate=1, dp_shard=2, zero=1, micro_batch=1, activation_checkpoint="full")
    interleaved = dataclasses.replace(one_f_one_b, virtual_stages=2, pp_schedule="Interleaved1F1B")
    zbv = dataclasses.replace(interleaved, pp_schedule="ZBVZeroBubble")
    boundary = 8192 * 4096 * 2 / 2
    assert pipeline_buffer_bytes(shape, one_f_one_b, 8, 8192, kept_input_grads="all") == \
        pipeline_buffer_bytes(shape, one_f_one_b, 8, 8192)  # rank 0 holds only the first stage
    for layout in (interleaved, zbv):  # rank 0's second stage keeps 8
        assert pipeline_buffer_bytes(shape, layout, 8, 8192, kept_input_grads="all") - \
            pipeline_buffer_bytes(shape, layout, 8, 8192) == 8 * boundary
    assert [keeps_input_grads(x, "split") for x in (one_f_one_b, interleaved, zbv)] == [False, False, True]
    old = memory_per_rank(shape, one_f_one_b, h100, 8, MemoryAssumptions(kept_input_grads="all"))
    new = memory_per_rank(shape, one_f_one_b, h100, 8, MemoryAssumptions(kept_input_grads="none"))
    assert old.activations - new.activations == pytest.approx(8 * boundary)  # the rank with the loss here
    with pytest.raises(ValueError, match="kept_input_grads"):
        keeps_input_grads(zbv, "some")
