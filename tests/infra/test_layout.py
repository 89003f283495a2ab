"""Layout rules that need neither memory nor timing: node size, divisibility, the trainer's schedules."""

import pytest

from infra.layout import Layout, ModelShape, check_shape
from tasks.model_config import PRESETS

SHAPE = ModelShape(PRESETS["70b"], 8192)


def layout(**kw):
    base = dict(tp=8, pp=4, dp_replicate=1, dp_shard=128, zero=1, micro_batch=1)
    return Layout(**{**base, **kw})


def test_valid_layouts_pass_and_have_readable_names():
    zbv = layout(pp_schedule="ZBVZeroBubble", virtual_stages=2)
    interleaved = layout(pp_schedule="Interleaved1F1B", virtual_stages=2, dp_replicate=16, dp_shard=8)
    assert check_shape(zbv, SHAPE, 8, 2048) is None and check_shape(interleaved, SHAPE, 8, 2048) is None
    assert zbv.name == "tp8·pp4zbv·fsdp128·zero1·mb1·ac-none"
    assert interleaved.name == "tp8·pp4v2·hsdp16x8·zero1·mb1·ac-none"


def test_each_rule_names_its_reason():
    cases = {
        "layout.tp_exceeds_node": (SHAPE, layout(tp=16, dp_shard=64)),
        "layout.tp_indivisible": (SHAPE, layout(tp=3)),
        "layout.seq_indivisible": (ModelShape(PRESETS["70b"], 8190), layout()),
        "layout.tied_embeddings_with_pp": (ModelShape(PRESETS["1b"], 8192), layout()),
        "layout.pp_exceeds_layers": (SHAPE, layout(pp=64, dp_shard=8, pp_schedule="Interleaved1F1B",
                                                   virtual_stages=2)),
        "layout.schedule_unsupported": (SHAPE, layout(pp_schedule="Interleaved1F1B", virtual_stages=4)),
        "layout.batch_indivisible": (SHAPE, layout(micro_batch=32)),
        "layout.interleave_needs_microbatches": (SHAPE, layout(pp=16, dp_shard=32, micro_batch=8,
                                                               pp_schedule="ZBVZeroBubble", virtual_stages=2)),
    }
    for reason, (shape, candidate) in cases.items():
        assert check_shape(candidate, shape, 8, 2048).reason == reason, reason


def test_llama3_style_balanced_layouts_may_use_deeper_interleaving():
    meta = Layout(tp=8, pp=16, dp_replicate=1, dp_shard=64, zero=1, micro_batch=1, pp_schedule="Interleaved1F1B",
                  virtual_stages=7, stage_split="balanced")
    assert check_shape(meta, ModelShape(PRESETS["405b"], 8192), 8, 2048) is None
    assert meta.name.endswith("·balanced")


def test_trainer_settings_for_a_layout_without_pipeline():
    plain = Layout(tp=8, pp=1, dp_replicate=1, dp_shard=512, zero=2, micro_batch=2)
    pc = plain.to_parallel_config(2048)
    assert pc.zero2 and pc.pp_microbatches == 0 and pc.pp_schedule == "1F1B"
    assert plain.trainer_overrides(2048, 8192)["data.micro_batch"] == 2
    assert "parallel.float8" not in plain.trainer_overrides(2048, 8192) and pc.float8 == "none"
    assert "parallel.compile" not in plain.trainer_overrides(2048, 8192) and not pc.compile
    assert plain.trainer_overrides(2048, 8192, compile=True)["parallel.compile"] is True
    assert plain.to_parallel_config(2048, compile=True).compile


def test_an_fp8_layout_runs_the_trainer_with_tensorwise_float8():
    from infra.layout import parse_layout, trainer_gaps
    fp8 = parse_layout("tp=2", 4096, precision="fp8")
    assert trainer_gaps(fp8) == [] and fp8.to_parallel_config(2048).float8 == "tensorwise"
    assert fp8.trainer_overrides(2048, 8192)["parallel.float8"] == "tensorwise"


def test_a_given_layout_parses_with_dp_from_the_gpu_count():
    from infra.layout import parse_layout
    given = parse_layout("tp=8,pp=4,dp=64,cp=1,mb=1,ac=selective,schedule=1F1B", 2048)
    assert (given.tp, given.pp, given.dp, given.cp, given.micro_batch) == (8, 4, 64, 1, 1)
    assert given.activation_checkpoint == "selective" and given.pp_schedule == "1F1B" and given.zero == 1
    inferred = parse_layout("tp=8,cp=2,pp=4,vp=5,dp_shard=8", 4096, precision="fp8")
    assert inferred.dp == 64 and inferred.dp_replicate == 8 and inferred.world == 4096
    assert inferred.pp_schedule == "Interleaved1F1B" and inferred.virtual_stages == 5
    assert inferred.name == "tp8·cp2·pp4v5·hsdp8x8·zero1·mb1·ac-none·fp8"
    assert parse_layout("tp=2", 8).zero == 3  # FSDP's default without a pipeline


def test_what_the_trainer_cannot_run_is_named_and_other_systems_rules_are_relaxed():
    from infra.layout import parse_layout, trainer_gaps
    meta = parse_layout("tp=8,pp=16,vp=8,split=balanced,zero=2", 8192)
    shape = ModelShape(PRESETS["405b"], 8192)
    assert trainer_gaps(meta) == ["Interleaved1F1B with 8 stages per rank", "ZeRO-2 under pipelining",
                                  "the balanced stage split"]
    assert check_shape(meta, shape, 8, 2048, trainer_only=False) is None  # 126 layers in 16 × 8 stages, 2 empty
    assert meta.split(shape).chunks[0] == (0, 1, 1, 1, 1, 1, 1, 1)
    cp = parse_layout("tp=8,cp=3", 24)
    assert check_shape(cp, SHAPE, 8, 1, trainer_only=False).reason == "layout.cp_indivisible"


def test_the_stage_split_is_a_layout_key():
    from infra.layout import parse_layout
    titan = parse_layout("tp=8,pp=8,split=torchtitan", 512)
    assert titan.stage_split == "torchtitan" and titan.name.endswith("·torchtitan")
    assert parse_layout("tp=8,pp=8", 512).stage_split == "even"
    with pytest.raises(ValueError, match="split='halves': choose one of even, balanced, torchtitan"):
        parse_layout("tp=8,pp=8,split=halves", 512)
