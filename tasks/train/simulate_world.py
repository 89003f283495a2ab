"""One rank of an N-rank job, built and stepped on this CPU: ``--dry-run --simulate-world N [--rank R]``.

The trainer's own code builds the rank (ParallelDims' mesh, pipeline_parallel.split_model and build_schedule,
parallelize_model: FP8 layers, the TP plan, activation checkpointing, FSDP2) and runs one step with the
trainer's own step functions (``Trainer.forward_backward``, ``clip_grad_norm_``, ``Optimizers``), but on
torch's fake process group (``FakeStore``: every collective returns at once, moving nothing) and under
``FakeTensorMode`` (tensors with shapes, dtypes and storages but no memory). FSDP2's memory tracker
(``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``) counts every storage the step creates and frees,
by what it holds: parameters, gradients, optimizer state, activations, and the collectives' buffers.

The rank is a GPU rank: bf16 compute and the fused AdamW are chosen as on an accelerator (``device_type``
"cuda" for the trainer's choices), while the fake tensors live on the CPU. Two steps run: the first
allocates the optimizer state and lets the pipeline infer its shapes, the second is measured (every step
but a run's first looks like it).

Two things are replaced, each where a fake run would otherwise differ from a real one: the absent ranks'
answers to a pipeline stage (``_absent_peers``), and the fake mode DTensor's shape propagation runs in
(``_propagation_apart``). tests/tasks/train/test_simulate_world.py checks the peak against real gloo ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tasks.errors import UserError
from tasks.llama import Transformer
from tasks.train import pipeline_parallel
from tasks.train.config import TrainConfig
from tasks.train.optim import Optimizers, clip_grad_norm_
from tasks.train.parallel_dims import DIM_NAMES, ParallelDims
from tasks.train.parallelize import check_model_fits, compute_dtype, materialize, parallelize_model
from tasks.train.trainer import Trainer, plan_batches

log = logging.getLogger(__name__)

GB = 1e9
# what the trainer would choose on an accelerator: bf16 compute, the fused optimizer
SIMULATED_DEVICE_TYPE = "cuda"
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "comm_buffers")


@dataclass(frozen=True)
class RankMemory:
    """A rank's peak bytes by category (``CATEGORIES``), and the tracker's own finer split at that peak."""

    layout: str
    world_size: int
    rank: int
    coordinates: dict[str, int]
    dp_shard: int  # parallel.dp_shard resolved (-1 in a config takes the rest of the world)
    stages: list[int]
    batch: dict  # the trainer's BatchPlan
    peak: int
    by_category: dict[str, int]
    tracker: dict[str, int]
    seconds: float
    cpu_seconds: float

    def as_dict(self) -> dict:
        return {"layout": self.layout, "world_size": self.world_size, "rank": self.rank,
                "coordinates": self.coordinates, "dp_shard": self.dp_shard, "stages": self.stages,
                "batch": self.batch, "peak_gb": round(self.peak / GB, 3),
                "by_category_gb": {k: round(v / GB, 3) for k, v in self.by_category.items()},
                "tracker_gb": {k: round(v / GB, 3) for k, v in self.tracker.items()},
                "seconds": round(self.seconds, 1), "cpu_seconds": round(self.cpu_seconds, 1)}


def rank_at(dims: ParallelDims, **coords: int) -> int:
    """The global rank at these mesh coordinates (the others 0): the mesh is ``DIM_NAMES`` row-major."""
    rank = 0
    for name in DIM_NAMES:
        rank = rank * getattr(dims, name) + coords.get(name, 0)
    return rank


# -- the tracker -------------------------------------------------------------------------------------


def _tracker_class():
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    class StagesMemTracker(FSDPMemTracker):
        """FSDPMemTracker over several model parts (a pipeline rank's stages) and their optimizers, whose
        roots run once per micro-batch: each call restarts the part's per-module statistics (the tracker
        refuses a root called twice, meaning a second iteration); the rank's peak is unaffected."""

        def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
            MemTracker.__init__(self)
            self._root_mod = nn.ModuleList(parts)  # .modules() and .buffers() walk every part
            self._optm = None
            self._optimizers = optimizers
            self._fsdp_mod_to_saved_methods = {}
            from torch.distributed._tools.fsdp2_mem_tracker import _FSDPState, _FSDPRefType

            self._fsdp_state = _FSDPState.PRE_FW
            self._ref_class = _FSDPRefType
            self._roots = {id(p) for p in parts}

        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def again(*args, **kwargs):
                if id(fsdp_mod) in self._roots and not self._mod_tracker.is_bw:
                    self.memory_tracking.pop(fsdp_mod, None)
                return inner(*args, **kwargs)

            return again

        def _instrument_optimizer(self) -> None:
            handles = []
            for opt in self._optimizers:
                self._optm = opt
                super()._instrument_optimizer()
                handles += self._optimizer_hook_handles
            self._optimizer_hook_handles = tuple(handles)

        def track_params(self, params: list[nn.Parameter]) -> None:
            """Parameters outside FSDP (a rank with no data parallelism) count as the rank's own."""
            from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

            for p in params:
                self._update_and_maybe_create_winfos(p, _FSDPRefType.SHARDED_PARAM)

    return StagesMemTracker


# the tracker's categories → the planner's
_CATEGORY_OF = {
    "Sharded Param": "parameters", "Unsharded Param": "parameters", "Buffer": "parameters",
    "Sharded Grad": "gradients", "Unsharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations", "Temp": "activations", "Inputs": "activations",
    "All Gather": "comm_buffers", "Reduce Scatter": "comm_buffers",
}


# -- the peer a pipeline stage asks for shapes -------------------------------------------------------


@contextlib.contextmanager
def _absent_peers(boundary: torch.Tensor) -> Iterator[None]:
    """A stage's neighbours live on other ranks. Their answers, as the whole job would give them: the vote on
    static or dynamic shapes is dynamic (no stage of pipeline_parallel.build_schedule is given example inputs), and
    the shapes a neighbour sends are those a stage boundary carries (a micro-batch's hidden states,
    sequence-sharded under TP) and their gradient."""
    from torch.distributed.pipelining import stage as stage_mod

    meta = stage_mod.extract_tensor_meta(boundary)

    def recv_meta(self, src_stage: int):
        if src_stage < self.stage_index:
            return stage_mod._StageForwardMeta(forward_metas=(meta,))
        return stage_mod._StageBackwardMeta(backward_metas=(meta,))

    class Dynamic:  # the vote's result, read with .item() (a fake tensor has no value to read)
        @staticmethod
        def item() -> int:
            return 0

    def vote(self, *args, **kwargs) -> Dynamic:
        return Dynamic()

    cls = stage_mod.PipelineStage
    saved = {name: getattr(cls, name) for name in ("_recv_meta", "_warmup_forward_vote", "_warmup_backward_result")}
    cls._recv_meta, cls._warmup_forward_vote, cls._warmup_backward_result = recv_meta, vote, vote
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)


@contextlib.contextmanager
def _propagation_apart() -> Iterator[None]:
    """DTensor computes some outputs' shapes by running the op on fake tensors of the global shape (loss
    parallel's log-softmax: a whole vocabulary's logits). In a real run that happens in a fake mode of its own,
    which the tracker ignores; under the simulation's fake mode DTensor would reuse that one and the tracker
    would count it. Give it a mode of its own, as in a real run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import _sharding_prop

    own = FakeTensorMode()
    saved = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args: own
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = saved


# -- one rank ----------------------------------------------------------------------------------------


class _Off:
    """A trainer side task that records to the run folder (per-sample losses), off: every call does nothing."""

    enabled = False

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


class _RankStep:
    """The trainer's own step functions, bound to a rank built here (Trainer needs data and a run folder)."""

    forward_backward = Trainer.forward_backward
    _loss = Trainer._loss
    _train_context = Trainer._train_context
    sample_losses = _Off()


def simulate_rank(cfg: TrainConfig, world_size: int, rank: int = 0, vocab_size: int = 0) -> RankMemory:
    """Build rank ``rank`` of a ``world_size``-rank job with ``cfg`` on a fake process group and fake tensors, and
    measure its peak over one step. ``vocab_size`` 0 takes the model preset's. Raises ValueError for a layout the
    trainer refuses."""
    if dist.is_initialized():
        raise RuntimeError("simulate_rank needs a process without a process group (it makes a fake one)")
    if not 0 <= rank < world_size:
        raise UserError(f"--rank {rank} must be in [0, {world_size})")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        return measure_step(cfg, vocab_size, fake=True)
    finally:
        dist.destroy_process_group()


def measure_step(cfg: TrainConfig, vocab_size: int = 0, *, fake: bool = True) -> RankMemory:
    """This rank of the current process group, built with ``cfg`` and stepped twice; the second step's peak.
    ``fake``: on fake tensors (no memory; the group is torch's fake one); else on real CPU tensors, initialised
    as the trainer initialises them (a real gloo group: the check that the fake run measures what a real one
    allocates)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started, cpu_started = time.perf_counter(), time.process_time()
    world_size, rank = dist.get_world_size(), dist.get_rank()
    dims = ParallelDims.from_config(cfg.parallel, world_size)
    dims.build_mesh("cpu")
    ids = pipeline_parallel.stage_ids(cfg.parallel.pp_schedule, dims.pp_rank, dims.pp) if dims.pp_enabled else [0]
    batch = plan_batches(cfg.data, dims, cfg.parallel.pp_microbatches, len(ids))
    model_cfg = cfg.model_for_data(vocab_size) if vocab_size else cfg.model_config()
    if not model_cfg.vocab_size:
        raise UserError(f"model preset {cfg.model_preset!r} has no vocabulary; give --data or model.vocab_size")
    device = torch.device("cpu")
    dtype = compute_dtype(cfg.parallel, SIMULATED_DEVICE_TYPE)

    # As Trainer._build: on meta, split into this rank's stages, parallelised (FSDP2's shards stay on meta).
    with torch.device("meta"):
        whole = Transformer(model_cfg)
    check_model_fits(whole, dims, cfg.data.seq_len, cfg.parallel.float8)
    stages = (pipeline_parallel.split_model(whole, cfg.parallel.pp_schedule, dims.pp_rank, dims.pp) if dims.pp_enabled
              else [(0, whole)])
    parts = []
    for _, part in stages:
        parallelize_model(part, dims, cfg.parallel, SIMULATED_DEVICE_TYPE)
        parts.append(part)

    with (FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(),
          _propagation_apart() if fake else contextlib.nullcontext()):
        for part in parts:
            if fake:
                part.to_empty(device=device)  # materialize() without init_weights: fake values are never read
            else:
                materialize(part, device, cfg.seed)
            part.train()
        step = _RankStep()
        step.batch, step.dims, step.device, step.compute_dtype = batch, dims, device, dtype
        step.model_parts = parts
        step.holds_last_stage = any(part.output is not None for part in parts)
        step.holds_first_stage = any(s == 0 for s, _ in stages)
        step.schedule, pp_group = None, None
        if dims.pp_enabled:
            pp_group = dims.mesh["pp"].get_group()
            step.schedule = pipeline_parallel.build_schedule(
                list(zip([s for s, _ in stages], parts)), schedule=cfg.parallel.pp_schedule, pp=dims.pp,
                n_microbatches=batch.pp_microbatches, loss_fn=step._loss, group=pp_group, device=device)
        optimizers = Optimizers(parts, cfg.optim, SIMULATED_DEVICE_TYPE)
        params = [p for part in parts for p in part.parameters()]
        generator = torch.Generator().manual_seed(cfg.seed + dims.dp_rank)
        tokens = torch.randint(0, model_cfg.vocab_size, (batch.local_batch, batch.seq_len + 1), generator=generator)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        boundary = torch.empty(batch.micro_batch // batch.pp_microbatches, batch.seq_len // dims.tp, model_cfg.dim,
                               dtype=dtype, device=device, requires_grad=True)

        def train_step() -> None:
            optimizers.zero_grad()
            step.forward_backward(inputs, targets)
            clip_grad_norm_(params, cfg.optim.grad_clip, pp_group)
            optimizers.step()

        with _absent_peers(boundary) if fake and dims.pp_enabled else contextlib.nullcontext():
            train_step()  # allocates the optimizer state; the pipeline infers its shapes
            tracker = _tracker_class()(parts, optimizers.optimizers)
            tracker.track_inputs((inputs, targets))
            with tracker:
                train_step()
        snapshot = tracker.get_tracker_snapshot("peak")
    coords = {name: dims.mesh[name].get_local_rank() for name in DIM_NAMES}

    peak_snap = snapshot.get(device, {})
    fine = {str(getattr(k, "value", k)): int(v) for k, v in peak_snap.items() if str(getattr(k, "value", k)) != "Total"}
    by_category = dict.fromkeys(CATEGORIES, 0)
    for name, value in fine.items():
        by_category[_CATEGORY_OF[name]] += value
    return RankMemory(layout=dims.describe(), world_size=world_size, rank=rank, coordinates=coords,
                      dp_shard=dims.dp_shard, stages=[s for s, _ in stages], batch=dataclasses.asdict(batch),
                      peak=int(peak_snap.get("Total", 0)), by_category=by_category, tracker=fine,
                      seconds=time.perf_counter() - started, cpu_seconds=time.process_time() - cpu_started)
