"""The planner's pipeline model against torch's schedules as smelt's trainer builds them: gloo ranks run one
step of each schedule, counting on every stage the forwards whose backward has not run yet (``fwd_cache``,
whose activations the rank holds) and the receive buffers torch allocates, then a step that returns its
outputs, counting what the stages keep after it; the ZB-V schedule's order of actions is the one the planner
simulates for its bubble."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from infra.layout import Layout, ModelShape
from infra.memory import (inflight_forwards, inflight_microbatches, keeps_input_grads, kept_logits_bytes,
                           pipeline_buffer_bytes)
from infra.pipeline_order import makespan, zbv_order
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.pipeline_parallel import build_schedule, split_model
from tests.tasks.train.ranks import run_ranks

SEQ, VOCAB, LAYERS = 16, 64, 16
SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
MESHES = ((2, 4), (4, 4), (4, 8))  # (pp, micro-batches); ZB-V with m = pp holds most on rank pp − 1


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")


def _worker(rank: int, out_dir: str, pp: int, microbatches: int) -> None:
    result = {}
    for schedule in SCHEDULES:
        torch.manual_seed(0)
        model = Transformer(preset("tiny", vocab_size=VOCAB, n_layers=LAYERS))
        parts = split_model(model, schedule, rank, pp)
        pipe = build_schedule(parts, schedule=schedule, pp=pp, n_microbatches=microbatches, loss_fn=_loss,
                              group=dist.group.WORLD, device=torch.device("cpu"))
        stages = pipe._stages if hasattr(pipe, "_stages") else [pipe._stage]
        peak = {s.stage_index: 0 for s in stages}  # per stage, when the rank holds the most forwards
        for stage in stages:
            forward = stage.forward_one_chunk

            def counted(*args, _forward=forward, **kwargs):
                out = _forward(*args, **kwargs)
                if sum(len(s.fwd_cache) for s in stages) > sum(peak.values()):
                    peak.update({s.stage_index: len(s.fwd_cache) for s in stages})
                return out

            stage.forward_one_chunk = counted
        tokens = torch.randint(0, VOCAB, (microbatches, SEQ), generator=torch.Generator().manual_seed(1))
        first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
        pipe.step(*((tokens,) if first else ()), target=tokens if last else None, losses=[] if last else None,
                  return_outputs=False)
        buffers = 0
        for stage in stages:  # receive buffers, in units of one micro-batch's hidden states
            infos = [*(i for infos in stage.args_recv_info.values() for i in infos),
                     *(i for infos in stage.grad_recv_info.values() for i in (infos or ()))]
            buffers += sum(i.buffer.numel() for i in infos if getattr(i, "buffer", None) is not None)
        # the inputs' gradients the stages keep after the step, as ``.grad`` of their receive buffers
        input_grads = sum(i.buffer.grad.numel() for stage in stages for infos in stage.args_recv_info.values()
                          for i in infos if getattr(i, "buffer", None) is not None and i.buffer.grad is not None)
        # a step that returns its outputs, as torch's default and torchtitan's call: the stages keep them after it
        pipe.step(*((tokens,) if first else ()), target=tokens if last else None, losses=[] if last else None)
        kept = sum(t.numel() * t.element_size() for s in stages for t in s.output_chunks)
        result[schedule] = {"peak": {str(k): v for k, v in sorted(peak.items())},
                            "buffers": buffers / (SEQ * model.tok_embeddings.embedding_dim), "kept": kept,
                            "input_grads": input_grads / (SEQ * model.tok_embeddings.embedding_dim),
                            "stages": [s.stage_index for s in stages]}
        if schedule != "1F1B":  # every rank's actions, as this rank's schedule will run them
            result[schedule]["order"] = [[[KINDS[a.computation_type.name], a.stage_index, a.microbatch_index]
                                          for a in pipe.pipeline_order[r] if a is not None] for r in range(pp)]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _layout(schedule: str, pp: int) -> Layout:
    v = 1 if schedule == "1F1B" else 2
    return Layout(tp=1, pp=pp, dp_replicate=1, dp_shard=1, zero=1, micro_batch=1, pp_schedule=schedule,
                  virtual_stages=v)


@pytest.fixture(scope="module", params=MESHES, ids=lambda mesh: f"pp{mesh[0]}-m{mesh[1]}")
def measured_ranks(request, tmp_path_factory) -> tuple[int, int, list[dict]]:
    pp, microbatches = request.param
    out = tmp_path_factory.mktemp("pipeline")
    run_ranks(pp, _worker, str(out), pp, microbatches)
    return pp, microbatches, [json.loads((out / f"rank{r}.json").read_text()) for r in range(pp)]


@pytest.fixture
def measured(measured_ranks) -> tuple[int, int, dict]:
    pp, microbatches, ranks = measured_ranks
    return pp, microbatches, ranks[0]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_busiest_rank_holds_the_micro_batches_the_planner_counts(measured_ranks, schedule):
    # every stage has the same number of layers here, so a rank's activations go with its forwards in flight
    pp, microbatches, ranks = measured_ranks
    layout = _layout(schedule, pp)
    busiest = max(sum(r[schedule]["peak"].values()) for r in ranks)
    assert busiest == inflight_microbatches(layout, microbatches) * layout.virtual_stages


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_rank_zero_holds_the_forwards_the_planner_counts(measured, schedule):
    pp, microbatches, rank0 = measured
    peaks = rank0[schedule]["peak"]  # rank 0's stages in schedule order: 0, then pp or the last one
    assert tuple(peaks.values()) == inflight_forwards(_layout(schedule, pp), microbatches)


@pytest.mark.parametrize("schedule", ("1F1B", "Interleaved1F1B"))
def test_every_rank_holds_the_forwards_the_planner_counts(measured_ranks, schedule):
    # the last rank, with the loss, holds pp micro-batches of each stage but its last under interleaving
    pp, microbatches, ranks = measured_ranks
    layout = _layout(schedule, pp)
    for rank, measured in enumerate(ranks):
        assert tuple(measured[schedule]["peak"].values()) == inflight_forwards(layout, microbatches, rank), rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_receive_buffers_and_kept_outputs_are_what_the_planner_counts(measured_ranks, schedule):
    pp, microbatches, ranks = measured_ranks
    layout = _layout(schedule, pp)
    shape = ModelShape(preset("tiny", vocab_size=VOCAB, n_layers=LAYERS), SEQ)
    for rank in range(1 if schedule == "ZBVZeroBubble" else pp):  # ZB-V's loss is on rank 0
        counted = pipeline_buffer_bytes(shape, layout, microbatches, SEQ, rank=rank) / (SEQ * shape.cfg.dim * 2)
        measured = ranks[rank][schedule]
        held = inflight_forwards(layout, microbatches, rank)
        # the planner adds the outputs kept for non-last stages and leaves out activation buffers in flight
        # (their tensor is the stage's first layer's saved input, counted with the layers)
        stages = list(measured["peak"])
        last = str(pp * layout.virtual_stages - 1)
        kept = sum(h for s, h in zip(stages, held) if s != last)
        in_flight_inputs = sum(h for s, h in zip(stages, held) if s != "0")
        assert counted == measured["buffers"] + kept - in_flight_inputs, rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_step_that_returns_outputs_keeps_the_last_stages_logits_the_planner_counts(measured_ranks, schedule):
    # this torch keeps the last stage's outputs only (kept_outputs="last"); smelt's trainer passes
    # return_outputs=False and keeps none (the measured step above)
    pp, microbatches, ranks = measured_ranks
    layout = _layout(schedule, pp)
    shape = ModelShape(preset("tiny", vocab_size=VOCAB, n_layers=LAYERS), SEQ)
    counted = kept_logits_bytes(shape, layout, microbatches, SEQ, "last", logit_bytes=4)  # the tiny model is fp32
    holders = [r[schedule]["kept"] for r in ranks if r[schedule]["kept"]]
    assert holders == [counted] and counted == microbatches * SEQ * VOCAB * 4


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stages_keep_their_inputs_gradients_where_the_planner_counts_them(measured_ranks, schedule):
    # this torch frees them as it sends them, except under a split input backward (ZB-V): kept_input_grads="split"
    pp, microbatches, ranks = measured_ranks
    keeps = keeps_input_grads(_layout(schedule, pp), "split")
    for r in ranks:
        past_first = sum(1 for s in r[schedule]["stages"] if s != 0)
        assert r[schedule]["input_grads"] == (microbatches * past_first if keeps else 0)


def test_the_zbv_order_the_planner_simulates_is_the_one_torch_builds(measured):
    pp, microbatches, rank0 = measured
    theirs = [[tuple(action) for action in ops] for ops in rank0["ZBVZeroBubble"]["order"]]
    assert theirs == [list(ops) for ops in zbv_order(pp, microbatches)]


def test_torchs_interleaved_order_leaves_the_pp_minus_1_over_v_slots_the_planner_counts(measured):
    pp, microbatches, rank0 = measured
    order = tuple(tuple(tuple(action) for action in ops) for ops in rank0["Interleaved1F1B"]["order"])
    seconds = {"F": 1.0, "I": 1.3, "W": 0.7}
    slot = 2 * sum(seconds.values())  # a micro-batch through both of a rank's stages
    bubble = makespan(order, 2 * pp, seconds) - microbatches * slot
    assert bubble == pytest.approx((pp - 1) / 2 * slot)
