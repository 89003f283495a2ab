"""Pipeline parallelism: split the (meta) model into stages and build a torch.distributed.pipelining
schedule over them.

Vocabulary: a *stage* is a contiguous run of layers (the first also holds the embeddings, the last
the final norm and output); a pp rank holds one stage (1F1B) or two (interleaved and V-shaped
zero-bubble schedules), so there are ``pp × stages_per_rank`` stages in all.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
    _PipelineSchedule,
)

from tasks.errors import UserError
from tasks.llama import Transformer
from tasks.train.config import PP_SCHEDULES

log = logging.getLogger(__name__)

# name -> (schedule class, stage placement style); stages per rank: config.PP_SCHEDULES
SCHEDULES = {
    "1F1B": (Schedule1F1B, "loop"),
    "Interleaved1F1B": (ScheduleInterleaved1F1B, "loop"),
    "ZBVZeroBubble": (ScheduleZBVZeroBubble, "v"),
}


def stage_ids(schedule: str, pp_rank: int, pp: int) -> list[int]:
    """Which stages this pp rank runs: round-robin ("loop") or folded back ("v": rank 0 holds the
    first and the last stage, so the V-shaped zero-bubble schedule needs no extra hop)."""
    if schedule not in SCHEDULES:
        raise UserError(f"parallel.pp_schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    (_, style), per_rank = SCHEDULES[schedule], PP_SCHEDULES[schedule]
    if style == "v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]


def layer_split(n_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges per stage, as even as possible (earlier stages get the remainder)."""
    if n_layers < num_stages:
        raise UserError(
            f"model.n_layers ({n_layers}) is smaller than the number of pipeline stages ({num_stages}); "
            "use fewer pipeline ranks or a schedule with one stage per rank"
        )
    base, extra = divmod(n_layers, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        bounds.append(range(start, end))
        start = end
    return bounds


def split_model(model: Transformer, schedule: str, pp_rank: int, pp: int) -> list[tuple[int, Transformer]]:
    """This rank's stages as (stage index, module): copies of the meta model with the layers and
    end pieces other stages own removed. Parameter names stay those of the full model."""
    if model.cfg.tie_embeddings:
        raise UserError("model.tie_embeddings cannot be used with pipeline parallelism (embeddings and output "
                         "live on different stages); set tie_embeddings = false or parallel.pp = 1")
    ids = stage_ids(schedule, pp_rank, pp)
    num_stages = pp * len(ids)
    ranges = layer_split(model.cfg.n_layers, num_stages)
    parts = []
    for stage in ids:
        part = copy.deepcopy(model)
        keep = {str(i) for i in ranges[stage]}
        for name in list(part.layers):
            if name not in keep:
                del part.layers[name]
        if stage != 0:
            part.tok_embeddings = None
        if stage != num_stages - 1:
            part.norm = None
            part.output = None
        parts.append((stage, part))
        log.info("pp rank %d holds stage %d/%d: layers %s", pp_rank, stage, num_stages, list(ranges[stage]))
    return parts


def build_schedule(
    parts: list[tuple[int, torch.nn.Module]],
    *,
    schedule: str,
    pp: int,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    group: ProcessGroup,
    device: torch.device,
) -> _PipelineSchedule:
    """The schedule driving this rank's stages. ``loss_fn`` must already be normalised for the whole
    step (sum over tokens / tokens per step), so gradients are not rescaled by the microbatch count."""
    (cls, _), per_rank = SCHEDULES[schedule], PP_SCHEDULES[schedule]
    num_stages = pp * per_rank
    if n_microbatches < 1:
        raise UserError(f"parallel.pp_microbatches must be positive, got {n_microbatches}")
    stages = [PipelineStage(module, stage, num_stages, device, group=group) for stage, module in parts]
    if per_rank == 1:
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
