"""The training loop: one synchronous job over a ``pp × dp_replicate × dp_shard × tp`` mesh.

Read ``Trainer.__init__`` then ``Trainer.train_step`` top to bottom: build on meta → split into
pipeline stages → parallelise → materialise → optimise. The batch contract (docs/design.md §4): each
optimizer step consumes one global batch of ``global_batch × seq_len`` tokens, whatever the
world size; each data-parallel rank takes its slice and walks it in micro-batches. The loss of
each micro-batch is a token *sum* divided by the tokens of this rank's whole step, so after
FSDP's average over data-parallel ranks the gradient is the per-token mean over the global batch,
whatever the accumulation, micro-batching or pipeline schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from tasks import branches, contract, storage
from tasks.errors import UserError
from tasks.lease import Fence, Fenced
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.train import goodput, hf, metrics, pipeline_parallel, watchdog
from tasks.train.agent import GEN_ENV
from tasks.train.callbacks import Callback, Callbacks
from tasks.checkpoint_reader import is_committed, step_dirs, step_url
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState, RNGState
from tasks.train.config import DataConfig, TrainConfig
from tasks.train.cross_entropy import token_cross_entropy, token_sum_cross_entropy
from tasks.train.data import TokenLoader
from tasks.train.identity import config_fingerprint
from tasks.train.loss_guard import LossGuard, SkippedRange, SkipList, skip_window
from tasks.train.optim import Optimizers, clip_grad_norm_, lr_at
from tasks.train.parallel_dims import ParallelDims
from tasks.train.sample_losses import SampleLosses, write_lineage
from tasks.train.parallelize import check_model_fits, compute_dtype, materialize, param_counts, parallelize_model
from tasks.train.snapshot import Snapshotter, folder_instance
from tasks.train.preemption import StopRequest
from tasks.train.stragglers import StragglerDetector

log = logging.getLogger(__name__)


# -- batch arithmetic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPlan:
    """How one global batch is walked on each rank. Only ``global_batch`` and ``seq_len`` are the
    run's contract; the rest follows from the world size."""

    global_batch: int
    seq_len: int
    local_batch: int  # sequences per data-parallel rank per step
    micro_batch: int  # sequences per forward/backward (per pipeline schedule call under PP)
    grad_accum: int  # micro-batches per step
    pp_microbatches: int  # pipeline microbatches each micro-batch is cut into (1 without PP)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def tokens_per_rank_step(self) -> int:
        return self.local_batch * self.seq_len


def plan_batches(data: DataConfig, dims: ParallelDims, pp_microbatches: int, stages_per_rank: int) -> BatchPlan:
    """Derive the per-rank batch walk; ``pp_microbatches = 0`` means one per pipeline stage."""
    if data.global_batch % dims.dp_size:
        raise UserError(f"data.global_batch ({data.global_batch}) must be divisible by the data-parallel size "
                         f"({dims.dp_size} = dp_replicate × dp_shard); change one of them")
    local = data.global_batch // dims.dp_size
    micro = data.micro_batch or local
    if local % micro:
        raise UserError(f"data.micro_batch ({micro}) must divide the per-rank batch ({local} = global_batch / "
                         f"{dims.dp_size} data-parallel ranks); set data.micro_batch = 0 to use {local}")
    n_mb = 1
    if dims.pp_enabled:
        n_mb = pp_microbatches or dims.pp * stages_per_rank
        if micro % n_mb:
            raise UserError(f"the micro-batch ({micro} sequences) must split into parallel.pp_microbatches ({n_mb}); "
                             "change data.micro_batch or parallel.pp_microbatches")
    return BatchPlan(data.global_batch, data.seq_len, local, micro, local // micro, n_mb)


# -- checkpointable state -----------------------------------------------------------------------------


@dataclass
class TrainState(Stateful):
    """Where the run is: optimizer steps done, tokens seen, and the loader's position (whose
    identity check refuses a resume onto different data or a different global batch)."""

    loader: TokenLoader
    step: int = 0
    tokens: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "loader": self.loader.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = int(state_dict["step"])
        self.tokens = int(state_dict["tokens"])
        self.loader.load_state_dict(state_dict["loader"])


# config_fingerprint: the run's identity (model shape, data, batch contract, initial weights), one definition
# shared with the flow's run folder: tasks/train/identity.py.


def accepted_losses(run_dir: str, upto: int) -> list[tuple[int, float]]:
    """(step, loss) of the steps up to ``upto`` on the run's final trajectory, from ``metrics.jsonl``: a step
    trained again after a restart or a rollback keeps its last record; rejected steps are left out."""
    losses: dict[int, float] = {}
    for record in goodput.read_jsonl(run_dir, goodput.METRICS):
        if "rolled_back_to" not in record and record["step"] <= upto:
            losses[record["step"]] = record["loss"]
    return sorted(losses.items())


# -- process group --------------------------------------------------------------------------------------


def _init_distributed(device_type: str, timeout_s: float) -> bool:
    """Join torchrun's process group (or make a one-rank group); True if we created it."""
    if dist.is_initialized():
        return False
    if "WORLD_SIZE" in os.environ:
        watchdog.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout_s)
    else:  # a single process (tests, benchmarks): a trivial group keeps one code path
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def _pick_device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def restart_count() -> int:
    """Restarts of this job so far: torchrun's restart count, or the generation under smelt's agent."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get(GEN_ENV) or 0)


# -- the trainer -----------------------------------------------------------------------------------------


class Trainer:
    """Builds the model, optimizer and loader for ``cfg`` on the current process group and trains.

    ``datasets`` maps names to tokens dataset URLs (weights from ``cfg.data.mixture``). Rank 0
    writes ``<run_dir>/metrics.jsonl`` (one record per step), ``events.jsonl`` (process group
    starts, for goodput), ``skipped.jsonl`` (loss-guard rollbacks), ``stragglers.json`` and
    ``<run_dir>/summary.json``. A progress watchdog exits a rank whose steps stop (watchdog.py).
    ``callbacks`` act at fixed points of each step (tasks/train/callbacks.py); fault injection is one, which
    the rank's entry point adds (tasks/train/main.py): the trainer has no code for tests.
    ``resume_from``: continue from this older retained checkpoint, the later ones kept as a superseded
    branch, optionally skipping the samples of steps ``skip_steps`` (A, B) (tasks/branches.py).
    """

    def __init__(self, cfg: TrainConfig, datasets: dict[str, str], run_dir: str,
                 callbacks: list[Callback] | None = None, *, resume_from: int | None = None,
                 skip_steps: tuple[int, int] | None = None, branch_request: str | None = None) -> None:
        started_at = time.time()
        branches.check_request(resume_from, skip_steps)
        self.cfg = cfg
        self.resume_from, self.skip_steps, self.branch_request = resume_from, skip_steps, branch_request
        self.callbacks = Callbacks(list(callbacks or []))  # per-sample losses join them in _build
        self.run_dir = storage.normalize_url(run_dir)
        self.datasets = dict(datasets)
        self.device = _pick_device()
        self._owns_group = _init_distributed(self.device.type, cfg.watchdog.collective_timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.watchdog = watchdog.ProgressWatchdog(cfg.watchdog, rank=self.rank, world_size=self.world_size).start()
        try:
            self._build(started_at)
        except BaseException:  # a failed build leaves no watchdog thread and no process group behind
            self.watchdog.stop()
            if self._owns_group:
                dist.destroy_process_group()
            raise

    def _build(self, started_at: float) -> None:
        """Everything after joining the process group, in order."""
        cfg, datasets = self.cfg, self.datasets
        torch.manual_seed(cfg.seed)

        # 1. Layout and the batch contract.
        self.dims = ParallelDims.from_config(cfg.parallel, self.world_size)
        self.dims.build_mesh(self.device.type)
        stage_ids = pipeline_parallel.stage_ids(cfg.parallel.pp_schedule, self.dims.pp_rank, self.dims.pp) if self.dims.pp_enabled else [0]
        self.batch = plan_batches(cfg.data, self.dims, cfg.parallel.pp_microbatches, len(stage_ids))

        # 2. Data: this rank's slice of every global batch; the vocabulary comes from its manifest.
        weights = dict(cfg.data.mixture) or None
        self.loader = TokenLoader(
            datasets, weights, split="train", seq_len=cfg.data.seq_len, global_batch=cfg.data.global_batch,
            dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size, seed=cfg.data.seed, prefetch=cfg.data.prefetch,
        )
        self.model_cfg: ModelConfig = cfg.model_for_data(self.loader.vocab_size)  # init_from: the folder's shape

        # 3. Model: built on meta (no memory), split into this rank's pipeline stages, sharded,
        #    and only then allocated and initialised (layout-independently, from cfg.seed).
        with torch.device("meta"):
            whole = Transformer(self.model_cfg)
        check_model_fits(whole, self.dims, cfg.data.seq_len, cfg.parallel.float8)
        if self.dims.pp_enabled:
            stages = pipeline_parallel.split_model(whole, cfg.parallel.pp_schedule, self.dims.pp_rank, self.dims.pp)
        else:
            stages = [(0, whole)]
        self.model_parts = []
        for _, part in stages:
            parallelize_model(part, self.dims, cfg.parallel, self.device.type)
            materialize(part, self.device, cfg.seed)
            part.train()
            self.model_parts.append(part)
        self.params = [p for part in self.model_parts for p in part.parameters()]
        self.holds_last_stage = any(part.output is not None for part in self.model_parts)
        self.schedule, self.pp_group = None, None
        if self.dims.pp_enabled:
            self.pp_group = self.dims.mesh["pp"].get_group()
            self.schedule = pipeline_parallel.build_schedule(
                list(zip([s for s, _ in stages], self.model_parts)), schedule=cfg.parallel.pp_schedule,
                pp=self.dims.pp, n_microbatches=self.batch.pp_microbatches, loss_fn=self._loss,
                group=self.pp_group, device=self.device,
            )
            self.holds_first_stage = any(s == 0 for s, _ in stages)

        # 4. Optimizer, the checkpointable state, and resuming from the newest good checkpoint.
        self.optimizers = Optimizers(self.model_parts, cfg.optim, self.device.type)
        self.state = TrainState(loader=self.loader)
        self.app_state = {
            "model_optim": ModelOptimState(self.model_parts, self.optimizers.optimizers),
            "train": self.state,
            "rng": RNGState(self.rank, cfg.seed),
        }
        fingerprints = {name: contract.open_dataset(url, kind="tokens").fingerprint for name, url in datasets.items()}
        self.fence = Fence.from_env(self.run_dir)  # the launcher's lease epoch: a stale trainer commits nothing
        self.checkpointer = CheckpointManager(
            self.run_dir, cfg.checkpoint, rank=self.rank, world_size=self.world_size,
            config_fingerprint=config_fingerprint(self.model_cfg, cfg.data, fingerprints, seed=cfg.seed,
                                                  init_from=cfg.init_from), fence=self.fence,
            on_written=self.callbacks.on_checkpoint_written,
        )
        self.snapshots = None
        if cfg.snapshot.active(self.world_size):
            self.snapshots = Snapshotter(
                self.run_dir, rank=self.rank, world_size=self.world_size,
                local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)),
                interval_steps=cfg.snapshot.interval_steps, keep=cfg.snapshot.keep, directory=cfg.snapshot.dir,
                identity={"fingerprint": self.checkpointer.config_fingerprint, "world_size": self.world_size,
                          "layout": self.dims.describe(), "folder": self._folder_instance()}, fence=self.fence)
        self.resumed_from = self._resume()
        if self.resumed_from is None and cfg.init_from:
            # a fresh run starts from the folder's weights, each rank reading only its shards
            hf.load_into(self.model_parts, hf.local_folder(cfg.init_from))
            log.info("initialised the model from %s", cfg.init_from)

        # 5. Fault tolerance: the loss guard and its skipped samples, stragglers; per-sample losses as a callback.
        # per-sample losses (sample_losses.py): ranks holding the loss record their slice; rank 0 the loader's order
        self.sample_losses = SampleLosses(self.run_dir, rank=self.rank, first_row=self.dims.dp_rank * self.batch.local_batch,
                                          records=self.holds_last_stage and self.dims.tp_rank == 0)
        self.callbacks.callbacks.append(self.sample_losses)
        if self.rank == 0:
            write_lineage(self.run_dir, self.loader)
        self.loss_guard = LossGuard(cfg.loss_guard)
        if self.resumed_from is not None:
            self.loss_guard.remember(accepted_losses(self.run_dir, self.resumed_from))
        self.skips = SkipList(self.run_dir, writer=self.rank == 0)
        self.stragglers = StragglerDetector(cfg.stragglers, self.run_dir, rank=self.rank, world_size=self.world_size)
        self.stop_request = StopRequest(self.device)

        # 6. Metrics, and this process group's start for goodput accounting.
        self.compute_dtype = compute_dtype(cfg.parallel, self.device.type)
        self.flops_per_token = self.model_cfg.flops_per_token(cfg.data.seq_len)
        self.device_name, self.peak_flops = metrics.device_peak_flops(self.device, self.compute_dtype)
        self.metrics = metrics.MetricsLogger(self.run_dir, enabled=self.rank == 0)
        counts = sum((param_counts(part) for part in self.model_parts), Counter())
        log.info("layout %s on %d ranks (%s); model %s: %.3gM params, %.3gM on this rank; batch %s",
                 self.dims.describe(), self.world_size, self.device_name, cfg.model_preset,
                 self.model_cfg.num_params() / 1e6, counts["local"] / 1e6, self.batch)
        # This launch's index among the run's starts (events.jsonl), stamped on every metrics record as "group"
        # for goodput and trace; not a process group (that is pp_group and the mesh's).
        self.start_index = None
        if self.rank == 0:
            self.start_index = goodput.start_group(self.run_dir, time=started_at, resumed_from=self.resumed_from,
                                             world_size=self.world_size,
                                             restart_count=restart_count())

    def _resume(self) -> int | None:
        """Restore the newest state: a snapshot from memory when every rank has one at least as new as
        the newest storage checkpoint (snapshot.py), else that checkpoint; the step, or None for a new run.
        ``--resume-from`` first moves the checkpoints after its step to a superseded branch (``_branch``)."""
        started = time.time()
        branch = self._branch()
        stored = self.checkpointer.latest_step()
        restored = None
        if self.snapshots is not None:
            restored = self.snapshots.restore(self.app_state, not_before=stored, template=self._live_state)
        event = None
        if restored is not None:
            self.checkpointer.mark_loaded(restored.step)
            event = {"source": "snapshot", "step": restored.step,
                     "sources": {str(r): s for r, s in restored.sources.items()}, "refused": restored.refused, "seconds": round(restored.seconds, 3)}
            log.info("resumed from the in-memory snapshot of step %d (%d tokens seen) in %.2f s",
                     self.state.step, self.state.tokens, restored.seconds)
        elif stored is not None:
            self.checkpointer.load(self.app_state, step=stored)
            event = {"source": "storage", "step": stored, "seconds": round(time.time() - started, 3),
                     "refused": self.snapshots.refused if self.snapshots is not None else []}
            log.info("resumed from checkpoint step %d (%d tokens seen)", self.state.step, self.state.tokens)
        if branch is not None:
            self._skip_branch_steps(branch, None if event is None else event["step"])
            if event is not None and branch["group"] == self._starts:
                event["branch"] = branch["branch"]
        self._fenced_on_rank0(lambda: self.fence.adopt(0 if event is None else event["step"]))
        if event is not None and self.rank == 0:
            goodput.append_event(self.run_dir, {"event": "restore", "time": time.time(), "world_size": self.world_size,
                                                **event})
        return None if event is None else event["step"]

    def _branch(self) -> dict | None:
        """``--resume-from STEP`` (tasks/branches.py): once per launch, check that STEP is a good checkpoint and
        have rank 0 move the later ones to a superseded branch; the record in force (None without a request).
        Snapshots of an older trajectory never restore: the branch count is part of their identity."""
        records, self._starts = self._from_rank0(lambda: (
            branches.read(self.run_dir),
            sum(1 for e in goodput.read_jsonl(self.run_dir, goodput.EVENTS) if e.get("event") == "start")))
        record = None
        if self.resume_from is not None:
            step = self.resume_from
            record = branches.served(records, step, self.skip_steps, request=self.branch_request,
                                     epoch=self.fence.epoch, restarted=restart_count() > 0)
            if record is None and not self.checkpointer.is_good(step):
                kept = ", ".join(map(str, step_dirs(self.run_dir))) or "none"
                raise UserError(f"--resume-from {step}: {step_url(self.run_dir, step)} is not a committed, intact "
                                 f"checkpoint (step folders here: {kept}); choose a retained one")
            if record is None or not record["complete"]:
                def move() -> dict:
                    self.fence.check()  # a launch taken over moves nothing
                    if record is not None:
                        return branches.finish(self.run_dir, record)
                    dirs = step_dirs(self.run_dir)
                    later = {s: url for s, url in dirs.items() if s > step}
                    return branches.declare(self.run_dir, step, later, {s for s, u in later.items() if is_committed(u)},
                                            skip_steps=self.skip_steps, request=self.branch_request,
                                            epoch=self.fence.epoch, group=self._starts)
                record = self._from_rank0(move)
                if self.snapshots is not None:
                    self.snapshots.drop_after(step)  # the abandoned steps' snapshots free the nodes' memory
                records = [r for r in records if r["branch"] != record["branch"]] + [record]
        if self.snapshots is not None and records:
            self.snapshots.identity["branch"] = len(records)
        return record

    def _skip_branch_steps(self, branch: dict, restored: int | None) -> None:
        """``--skip-steps A:B``: record, once, the samples steps A..B would train on after the branch's step as a
        skipped window (``skipped.jsonl``), which the loader then moves past."""
        if not branch["skip_steps"] or branch["skip_samples"] is not None:
            return
        if restored != branch["from_step"]:
            raise RuntimeError(f"branch {branch['branch']} skips steps {branch['skip_steps']} after step "
                               f"{branch['from_step']}, but the run resumed from {restored}")
        existing = SkipList(self.run_dir, writer=False).ranges
        a, b = branches.skip_window(self.loader.samples_consumed, restored, tuple(branch["skip_steps"]),
                                    self.batch.global_batch, [(r.start, r.end) for r in existing])

        def write() -> None:
            self.fence.check()
            if not any((r.start, r.end, r.reason) == (a, b, branches.SKIP_REASON) for r in existing):
                SkipList(self.run_dir, writer=True).add(
                    SkippedRange(a, b, branch["skip_steps"][0], restored, branches.SKIP_REASON, None))
            branches.update(self.run_dir, {**branch, "skip_samples": [a, b]})
        self._fenced_on_rank0(write)
        log.warning("branch %d: skipping samples [%d, %d) of steps %d..%d", branch["branch"], a, b, *branch["skip_steps"])

    def _from_rank0(self, make: Callable[[], object]) -> object:
        """``make()`` on rank 0, its value on every rank; its Fenced or other failure raised on every rank."""
        box: list = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", make())
            except Fenced as e:
                box[0] = ("fenced", str(e))
            except Exception as e:  # noqa: BLE001 - every rank must stop, not wait for a broadcast
                box[0] = ("error", f"{type(e).__name__}: {e}")
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "fenced":
            raise Fenced(value, self.fence.epoch, None)
        if kind == "error":
            raise RuntimeError(f"rank 0 failed: {value}")
        return value

    def _fenced_on_rank0(self, write: Callable[[], object]) -> None:
        """Run a fenced ``write`` on rank 0 and raise its ``Fenced`` on every rank, so all stop together."""
        box: list[str | None] = [None]
        if self.rank == 0:
            try:
                write()
            except Fenced as e:
                box[0] = str(e)
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            raise Fenced(box[0], self.fence.epoch, None)

    def _folder_instance(self) -> str:
        """snapshot.folder_instance, read on rank 0 so every rank names the same folder life."""
        box = [folder_instance(self.run_dir) if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def _live_state(self) -> dict:
        """The state dicts as they are, optimizer state initialised (a fresh optimizer has none): the
        shapes, meshes and placements a snapshot's local shards are loaded into."""
        self.app_state["model_optim"].init_optimizer_state()
        return {key: value.state_dict() for key, value in self.app_state.items()}

    # -- one step -------------------------------------------------------------------------------

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Token-summed cross entropy over this rank's whole step: see the module docstring. Each sequence's
        loss is recorded from the same softmax (sample_losses.py)."""
        if not self.sample_losses.enabled:
            return token_sum_cross_entropy(logits, targets) / self.batch.tokens_per_rank_step
        total, per_token = token_cross_entropy(logits, targets)
        self.sample_losses.add(targets, per_token)
        return total / self.batch.tokens_per_rank_step

    def _train_context(self) -> contextlib.AbstractContextManager:
        """Loss parallel under TP (the vocabulary-sharded logits are never gathered). bf16 compute is
        FSDP2's parameter cast on every layout (parallelize.py), never autocast."""
        return loss_parallel() if self.dims.tp_enabled else contextlib.nullcontext()

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Accumulate gradients of this rank's slice of one global batch; returns its loss share
        (meaningful on ranks holding the last pipeline stage, zero elsewhere)."""
        total = torch.zeros((), device=self.device)
        with self._train_context():
            for i, (mb_inputs, mb_targets) in enumerate(zip(inputs.split(self.batch.micro_batch),
                                                            targets.split(self.batch.micro_batch))):
                self.sample_losses.micro_batch(mb_targets, i * self.batch.micro_batch)
                if self.schedule is None:
                    loss = self._loss(self.model_parts[0](mb_inputs), mb_targets)
                    loss.backward()
                    losses = [loss]
                else:
                    losses = []
                    args = (mb_inputs,) if self.holds_first_stage else ()
                    targets_arg = mb_targets if self.holds_last_stage else None
                    # return_outputs=False: the last stage would otherwise keep every micro-batch's logits
                    # until the step ends (its outputs are never used: the losses are).
                    self.schedule.step(*args, target=targets_arg, losses=losses, return_outputs=False)
                for loss in losses:
                    total += (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
        return total

    def global_loss(self, local: torch.Tensor) -> float:
        """Mean per-token loss of the global batch: each data-parallel group's last stage (one TP
        rank of it) contributes its share; one all-reduce over the world sums them."""
        if self.world_size == 1:
            return local.item()
        contributes = self.holds_last_stage and self.dims.tp_rank == 0
        share = local / self.dims.dp_size if contributes else torch.zeros_like(local)
        dist.all_reduce(share)
        return share.item()

    def train_step(self, step: int) -> dict:
        """One optimizer step on the next global batch; returns its metrics record."""
        start, blocked_before = time.perf_counter(), self._blocked_s()
        batch_start = self.loader.samples_consumed  # this step's samples: [batch_start, + global_batch)
        inputs, targets = self.loader.next_batch()
        self.sample_losses.begin_step(step, batch_start)
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)

        lr = lr_at(step, self.cfg.optim, self.cfg.steps)
        self.optimizers.set_lr(lr)
        self.optimizers.zero_grad()
        local_loss = self.forward_backward(inputs, targets)
        local_loss = self.callbacks.on_loss(step, local_loss, self.params)
        grad_norm = clip_grad_norm_(self.params, self.cfg.optim.grad_clip, self.pp_group)
        self.checkpointer.wait_for_staging()  # an in-flight save may still be copying these parameters
        if self.snapshots is not None:
            self.snapshots.wait_for_copy()  # and so may the in-flight snapshot
        self.optimizers.step()
        self.callbacks.on_step_end(step, time.perf_counter() - start)
        arrived = time.perf_counter()
        loss = self.global_loss(local_loss)  # the step-end sync point: every rank waits for the slowest here
        self.stragglers.observe(compute_s=arrived - start - (self._blocked_s() - blocked_before),
                                wait_s=time.perf_counter() - arrived)

        self.state.step = step
        self.state.tokens += self.batch.tokens_per_step
        elapsed = time.perf_counter() - start
        tokens_per_s = self.batch.tokens_per_step / elapsed
        return {
            "step": step,
            "loss": loss,
            "samples": [batch_start, batch_start + self.batch.global_batch],  # the ledger's source (tasks/trace)
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "tokens": self.state.tokens,
            "step_time_s": elapsed,
            "tokens_per_s": tokens_per_s,
            "mfu": metrics.mfu(tokens_per_s, self.flops_per_token, self.world_size, self.peak_flops),
            "peak_mem_gib": metrics.peak_memory_gib(self.device),
        }

    # -- the loop -------------------------------------------------------------------------------

    def train(self, stop_after: int | None = None) -> dict:
        """Train from the current state to ``cfg.steps`` and checkpoint the end; returns (and on rank 0
        writes) the summary. ``stop_after`` ends a time-boxed job early, checkpointed, for the next
        launch to resume; the schedule still runs to ``cfg.steps``."""
        start, records = time.perf_counter(), []
        first_step = step = self.state.step + 1
        last_step = min(self.cfg.steps, stop_after or self.cfg.steps)
        while step <= last_step:
            self.callbacks.on_step_start(step, self.checkpointer)
            self.skips.advance(self.loader)
            iteration_start, blocked_before = time.perf_counter(), self._blocked_s()
            snapshot_before = self.snapshots.blocked_s if self.snapshots is not None else 0.0
            record = self.train_step(step)
            if self.rank == 0:
                self.fence.check()  # one read per step, before its writes: a run taken over stops here
            if self.stop_request.agreed() and step < last_step:  # SIGUSR1: checkpoint this step and stop
                log.info("stop requested (SIGUSR1): final checkpoint at step %d", step)
                last_step = step
            rejected = self.loss_guard.check(step, record["loss"])
            if rejected:  # every checkpoint passed the guard: roll back to the newest one
                record["rolled_back_to"] = self._roll_back(step, rejected, record["loss"])
            else:
                record.update(self.stragglers.maybe_check(step))
                meta = {"tokens": self.state.tokens, "loss": record["loss"], "layout": self.dims.describe(),
                        "model": dataclasses.asdict(self.model_cfg), "config": dataclasses.asdict(self.cfg),
                        "data": self.datasets, "seq_len": self.cfg.data.seq_len}
                self.callbacks.on_save_start(step)
                saved = self.checkpointer.maybe_save(step, self.app_state, meta, force=step == last_step)
                self.callbacks.on_save_end(step, saved, self.checkpointer)
                if self.snapshots is not None and self.snapshots.take(step, self.app_state):
                    self.callbacks.on_snapshot(step, self.snapshots)
            record.update(group=self.start_index, time=time.time(), iteration_s=time.perf_counter() - iteration_start,
                          checkpoint_s=self._blocked_s() - blocked_before,
                          checkpoint_blocked_s=self.checkpointer.blocked_s)
            if self.snapshots is not None:
                record.update(snapshot_s=self.snapshots.blocked_s - snapshot_before,
                              snapshot_acked=self.snapshots.last_acked,
                              snapshot_replicated_bytes=self.snapshots.replicated_bytes)
            record = self.fence.stamp(record)
            self.metrics.log(record)
            self.watchdog.beat(step)
            if rejected:
                step = record["rolled_back_to"] + 1
                records = [r for r in records if r["step"] < step]
                continue
            records.append(record)
            if self.rank == 0 and (step % self.cfg.log_every == 0 or step == last_step):
                log.info("step %d/%d  loss %.4f  grad_norm %.3f  lr %.2e  tok/s %.0f  mfu %.2f%%  mem %.2f GiB",
                         step, self.cfg.steps, record["loss"], record["grad_norm"], record["lr"],
                         record["tokens_per_s"], 100 * record["mfu"], record["peak_mem_gib"])
            step += 1
        blocked_before = self.checkpointer.blocked_s
        self.watchdog.long_phase()
        if self.snapshots is not None:
            self.snapshots.wait()
        self.checkpointer.wait_for_commit()  # the run is done only when its last checkpoint is
        if self.snapshots is not None and self.state.step >= self.cfg.steps:
            self.snapshots.discard()  # the final checkpoint is on storage: free the nodes' memory
        summary = self._summary(records, time.perf_counter() - start, first_step,
                                final_checkpoint_s=self.checkpointer.blocked_s - blocked_before)
        if self.rank == 0:
            self.fence.check()
            with storage.atomic_write(storage.join(self.run_dir, "summary.json"), "w") as f:
                f.write(json.dumps(summary, indent=2, sort_keys=True))
        return summary

    def _blocked_s(self) -> float:
        """Seconds training has been blocked by checkpoints and snapshots (both count as checkpointing)."""
        return self.checkpointer.blocked_s + (self.snapshots.blocked_s if self.snapshots is not None else 0.0)

    def _roll_back(self, step: int, reason: str, loss: float) -> int:
        """Reload the newest committed checkpoint and record the skipped samples; returns its step."""
        end = self.loader.samples_consumed
        self.watchdog.long_phase()
        target = self.checkpointer.latest_step()  # waits for an in-flight save: the same answer on every rank
        if target is None:
            start, end = skip_window(end, 0, self.cfg.loss_guard.skip_batches, self.batch.global_batch)
            self.skips.add(SkippedRange(start, end, step, None, reason, loss))
            raise RuntimeError(f"loss guard: {reason} at step {step} and no checkpoint to roll back to; samples "
                               f"[{start}, {end}) are recorded as skipped, so the restarted run trains without them "
                               "(lower checkpoint.interval_steps to roll back without a restart)")
        if self.snapshots is not None:
            self.snapshots.drop_after(target)  # the steps after target are abandoned: never restore them
        self.checkpointer.load(self.app_state, step=target)
        start, end = skip_window(end, self.loader.samples_consumed, self.cfg.loss_guard.skip_batches,
                                 self.batch.global_batch)
        self.skips.add(SkippedRange(start, end, step, target, reason, loss))
        self.loss_guard.forget_after(target)
        log.warning("loss guard: %s at step %d (loss %s, robust z %s): rolled back to step %d, skipping samples "
                    "[%d, %d)", reason, step, loss, self.loss_guard.last_z, target, start, end)
        return target

    def _summary(self, records: list[dict], wall_s: float, first_step: int, final_checkpoint_s: float) -> dict:
        # The first step pays for warm-up (allocation, compile, pipeline shape inference).
        steady = records[1:] or records
        step_time = sum(r["step_time_s"] for r in steady) / max(1, len(steady))
        tokens_per_s = self.batch.tokens_per_step / step_time if steady else 0.0
        return {
            "steps": self.state.step,
            "first_step": first_step,
            "resumed_from": self.resumed_from,
            "restarts": restart_count(),
            "checkpoint_blocked_s": self.checkpointer.blocked_s,
            "losses": [r["loss"] for r in records],
            "first_loss": records[0]["loss"] if records else None,
            "last_loss": records[-1]["loss"] if records else None,
            "tokens": self.state.tokens,
            "wall_s": wall_s,
            "tokens_per_s": tokens_per_s,
            "mfu": metrics.mfu(tokens_per_s, self.flops_per_token, self.world_size, self.peak_flops),
            "layout": self.dims.describe(),
            "world_size": self.world_size,
            "device": self.device_name,
            "model": {"preset": self.cfg.model_preset, "params": self.model_cfg.num_params()},
            "batch": dataclasses.asdict(self.batch),
            "skipped": [r.to_json() for r in self.skips.ranges],
            "stragglers": self.stragglers.flagged,
            "goodput": goodput.summarize(self.run_dir, time.time(), final_checkpoint_s) if self.rank == 0 else None,
        }

    def close(self) -> None:
        self.stop_request.close()
        if self.snapshots is not None:
            self.snapshots.close()
        self.checkpointer.close()
        self.loader.close()
        self.metrics.close()
        self.watchdog.stop()  # last: a hang in the steps above still ends in a restart
        if self._owns_group:
            dist.destroy_process_group()

    def abort(self) -> None:
        """After a peer's failure (smelt's in-process restart): stop this trainer's threads without waiting
        for collectives that can no longer finish; the process group is the caller's to destroy."""
        self.watchdog.stop()
        for part in (self.stop_request.close, self.snapshots.abandon if self.snapshots else None,
                     self.checkpointer.abandon, self.loader.close, self.metrics.close):
            if part is None:
                continue
            try:
                part()
            except Exception as e:  # noqa: BLE001 - a broken peer may fail any of them; none may stop the rejoin
                log.warning("abandoning the trainer: %s failed: %s", getattr(part, "__qualname__", part), e)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- dry run ---------------------------------------------------------------------------------------------


def describe_layout(cfg: TrainConfig, *, world_size: int, vocab_size: int) -> dict:
    """What a run would do on ``world_size`` ranks, without starting one: the layout, the derived
    batch walk and the exact parameter count of the busiest pipeline rank (the model is built on
    meta and split as the trainer splits it). Raises ValueError for a layout the trainer refuses.
    Memory per rank is the planner's model (``infra/memory.py``, ``smelt plan``), not repeated here."""
    dims = ParallelDims.from_config(cfg.parallel, world_size)
    model_cfg = cfg.model_for_data(vocab_size)
    with torch.device("meta"):
        whole = Transformer(model_cfg)
    check_model_fits(whole, dims, cfg.data.seq_len, cfg.parallel.float8)
    if dims.pp_enabled:
        ranks = [pipeline_parallel.split_model(whole, cfg.parallel.pp_schedule, r, dims.pp) for r in range(dims.pp)]
    else:
        ranks = [[(0, whole)]]
    batch = plan_batches(cfg.data, dims, cfg.parallel.pp_microbatches, len(ranks[0]))

    def local_params(parts) -> int:
        # TP splits every matrix and embedding, not the norm gains; FSDP splits everything over dp_shard.
        total = 0
        for _, part in parts:
            for name, param in part.named_parameters():
                tp = 1 if name.endswith("norm.weight") else dims.tp
                total += math.ceil(param.numel() / (tp * dims.dp_shard))
        return total

    return {
        "layout": dims.describe(),
        "world_size": world_size,
        "float8": cfg.parallel.float8,
        "model": {"preset": cfg.model_preset, "params": model_cfg.num_params(), "vocab_size": model_cfg.vocab_size,
                  "flops_per_token": model_cfg.flops_per_token(cfg.data.seq_len)},
        "batch": {**dataclasses.asdict(batch), "tokens_per_step": batch.tokens_per_step},
        "per_rank": {"params": max(local_params(parts) for parts in ranks)},
    }
