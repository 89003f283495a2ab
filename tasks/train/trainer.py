"""The training loop: one synchronous job over a ``pp × dp_replicate × dp_shard × tp`` mesh.

Read ``Trainer.__init__`` then ``Trainer.train_step`` top to bottom: build on meta → split into
pipeline stages → parallelise → materialise → optimise. The batch contract (DESIGN.md §4): each
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
import os
import random
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from tasks import datasets as contract
from tasks.train import metrics, pipeline
from tasks.train.config import DataConfig, ModelConfig, TrainConfig
from tasks.train.data import TokenLoader
from tasks.train.model import Transformer
from tasks.train.optim import Optimizers, clip_grad_norm_, lr_at
from tasks.train.parallel_dims import ParallelDims
from tasks.train.parallelize import check_model_fits, compute_dtype, materialize, param_counts, parallelize_model

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
    if data.global_batch % dims.dp_size:
        raise ValueError(f"data.global_batch ({data.global_batch}) must be divisible by the data-parallel size "
                         f"({dims.dp_size} = dp_replicate × dp_shard); change one of them")
    local = data.global_batch // dims.dp_size
    micro = data.micro_batch or local
    if local % micro:
        raise ValueError(f"data.micro_batch ({micro}) must divide the per-rank batch ({local} = global_batch / "
                         f"{dims.dp_size} data-parallel ranks); set data.micro_batch = 0 to use {local}")
    n_mb = 1
    if dims.pp_enabled:
        n_mb = pp_microbatches or dims.pp * stages_per_rank
        if micro % n_mb:
            raise ValueError(f"the micro-batch ({micro} sequences) must split into parallel.pp_microbatches ({n_mb}); "
                             "change data.micro_batch or parallel.pp_microbatches")
    return BatchPlan(data.global_batch, data.seq_len, local, micro, local // micro, n_mb)


# -- checkpointable state -----------------------------------------------------------------------------


class ModelState(Stateful):
    """All model parts (pipeline stages) of this rank as one state dict with the full model's names."""

    def __init__(self, parts: list[nn.Module]) -> None:
        self.parts = parts

    def state_dict(self) -> dict:
        return {k: v for part in self.parts for k, v in get_model_state_dict(part).items()}

    def load_state_dict(self, state_dict: dict) -> None:
        for part in self.parts:  # each part takes the keys it owns
            set_model_state_dict(part, state_dict, options=StateDictOptions(strict=False))


def _rng_state() -> dict[str, torch.Tensor]:
    """This rank's RNG states as tensors (no pickles): torch CPU/CUDA, NumPy, Python."""
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": torch.tensor([np_state[2], np_state[3]], dtype=torch.int64),
        "numpy_gauss": torch.tensor(np_state[4], dtype=torch.float64),
        "python": torch.tensor([py_version, *py_state], dtype=torch.int64),
        "python_gauss": torch.tensor(float("nan") if py_gauss is None else py_gauss, dtype=torch.float64),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    pos, has_gauss = state["numpy_pos"].tolist()
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), pos, has_gauss,
                         float(state["numpy_gauss"])))
    version, *py_state = state["python"].tolist()
    gauss = float(state["python_gauss"])
    random.setstate((version, tuple(py_state), None if np.isnan(gauss) else gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass
class TrainState(Stateful):
    """Where the run is: optimizer steps done, tokens seen, the loader's position, RNG states.

    RNG states differ per rank, so they are keyed by global rank; a run resumed on a different
    world size finds no state for its new ranks and keeps the seeded one (nothing here draws
    random numbers during training, so this changes no result).
    """

    loader: TokenLoader
    rank: int
    step: int = 0
    tokens: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "loader": self.loader.state_dict(),
                "rng": {f"rank{self.rank}": _rng_state()}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = int(state_dict["step"])
        self.tokens = int(state_dict["tokens"])
        self.loader.load_state_dict(state_dict["loader"])
        mine = state_dict.get("rng", {}).get(f"rank{self.rank}")
        if mine is not None:
            _set_rng_state(mine)


# -- process group --------------------------------------------------------------------------------------


def _init_distributed(device_type: str) -> bool:
    """Join torchrun's process group (or make a one-rank group); True if we created it."""
    if dist.is_initialized():
        return False
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    else:  # a single process (tests, benchmarks): a trivial group keeps one code path
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def _pick_device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


# -- the trainer -----------------------------------------------------------------------------------------


class Trainer:
    """Builds the model, optimizer and loader for ``cfg`` on the current process group and trains.

    ``datasets`` maps names to tokens dataset URLs (weights from ``cfg.data.mixture``). Rank 0
    writes ``<run_dir>/metrics.jsonl`` (one record per step) and ``<run_dir>/summary.json``.
    """

    def __init__(self, cfg: TrainConfig, datasets: dict[str, str], run_dir: str) -> None:
        self.cfg = cfg
        self.run_dir = contract.normalize_url(run_dir)
        self.device = _pick_device()
        self._owns_group = _init_distributed(self.device.type)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)

        # 1. Layout and the batch contract.
        self.dims = ParallelDims.from_config(cfg.parallel, self.world_size)
        self.dims.build_mesh(self.device.type)
        stage_ids = pipeline.stage_ids(cfg.parallel.pp_schedule, self.dims.pp_rank, self.dims.pp) if self.dims.pp_enabled else [0]
        self.batch = plan_batches(cfg.data, self.dims, cfg.parallel.pp_microbatches, len(stage_ids))

        # 2. Data: this rank's slice of every global batch; the vocabulary comes from its manifest.
        weights = dict(cfg.data.mixture) or None
        self.loader = TokenLoader(
            datasets, weights, split="train", seq_len=cfg.data.seq_len, global_batch=cfg.data.global_batch,
            dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size, seed=cfg.data.seed, prefetch=cfg.data.prefetch,
        )
        self.model_cfg: ModelConfig = cfg.model_config(vocab_size=self.loader.vocab_size)

        # 3. Model: built on meta (no memory), split into this rank's pipeline stages, sharded,
        #    and only then allocated and initialised (layout-independently, from cfg.seed).
        with torch.device("meta"):
            whole = Transformer(self.model_cfg)
        check_model_fits(whole, self.dims, cfg.data.seq_len)
        if self.dims.pp_enabled:
            stages = pipeline.split_model(whole, cfg.parallel.pp_schedule, self.dims.pp_rank, self.dims.pp)
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
        self.schedule = None
        if self.dims.pp_enabled:
            self.schedule = pipeline.build_schedule(
                list(zip([s for s, _ in stages], self.model_parts)), schedule=cfg.parallel.pp_schedule,
                pp=self.dims.pp, n_microbatches=self.batch.pp_microbatches, loss_fn=self._loss,
                group=self.dims.mesh["pp"].get_group(), device=self.device,
            )
            self.holds_first_stage = any(s == 0 for s, _ in stages)

        # 4. Optimizer and the checkpointable state.
        self.optimizers = Optimizers(self.model_parts, cfg.optim, self.device.type)
        self.state = TrainState(loader=self.loader, rank=self.rank)
        self.app_state = {"model": ModelState(self.model_parts), "optim": self.optimizers, "train": self.state}

        # 5. Metrics.
        self.compute_dtype = compute_dtype(cfg.parallel, self.device.type)
        self.flops_per_token = self.model_cfg.flops_per_token(cfg.data.seq_len)
        self.device_name, self.peak_flops = metrics.device_peak_flops(self.device, self.compute_dtype)
        self.metrics = metrics.MetricsLogger(self.run_dir, enabled=self.rank == 0)
        counts = sum((param_counts(part) for part in self.model_parts), Counter())
        log.info("layout %s on %d ranks (%s); model %s: %.1fM params, %.1fM on this rank; batch %s",
                 self.dims.describe(), self.world_size, self.device_name, cfg.model_preset,
                 self.model_cfg.num_params() / 1e6, counts["local"] / 1e6, self.batch)

    # -- one step -------------------------------------------------------------------------------

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Token-summed cross entropy over this rank's whole step: see the module docstring."""
        ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        return ce / self.batch.tokens_per_rank_step

    def _train_context(self) -> contextlib.ExitStack:
        """Loss parallel under TP (the vocabulary-sharded logits are never gathered); autocast when
        bf16 compute is asked for but no FSDP policy casts the parameters."""
        stack = contextlib.ExitStack()
        if self.dims.tp_enabled:
            stack.enter_context(loss_parallel())
        if self.compute_dtype != torch.float32 and not self.dims.fsdp_enabled:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.compute_dtype))
        return stack

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Accumulate gradients of this rank's slice of one global batch; returns its loss share
        (meaningful on ranks holding the last pipeline stage, zero elsewhere)."""
        total = torch.zeros((), device=self.device)
        with self._train_context():
            for mb_inputs, mb_targets in zip(inputs.split(self.batch.micro_batch), targets.split(self.batch.micro_batch)):
                if self.schedule is None:
                    loss = self._loss(self.model_parts[0](mb_inputs), mb_targets)
                    loss.backward()
                    losses = [loss]
                else:
                    losses = []
                    args = (mb_inputs,) if self.holds_first_stage else ()
                    targets_arg = mb_targets if self.holds_last_stage else None
                    self.schedule.step(*args, target=targets_arg, losses=losses)
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
        start = time.perf_counter()
        inputs, targets = self.loader.next_batch()
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)

        lr = lr_at(step, self.cfg.optim, self.cfg.steps)
        self.optimizers.set_lr(lr)
        self.optimizers.zero_grad()
        local_loss = self.forward_backward(inputs, targets)
        pp_group = self.dims.mesh["pp"].get_group() if self.dims.pp_enabled else None
        grad_norm = clip_grad_norm_(self.params, self.cfg.optim.grad_clip, pp_group)
        self.optimizers.step()
        loss = self.global_loss(local_loss)

        self.state.step = step
        self.state.tokens += self.batch.tokens_per_step
        elapsed = time.perf_counter() - start
        tokens_per_s = self.batch.tokens_per_step / elapsed
        return {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "tokens": self.state.tokens,
            "step_time_s": elapsed,
            "tokens_per_s": tokens_per_s,
            "mfu": metrics.mfu(tokens_per_s, self.flops_per_token, self.world_size, self.peak_flops),
            "peak_mem_gib": metrics.peak_memory_gib(self.device),
        }

    # -- the loop -------------------------------------------------------------------------------

    def train(self) -> dict:
        """Train from the current state to ``cfg.steps``; returns (and on rank 0 writes) the summary."""
        start, records = time.perf_counter(), []
        first_step = self.state.step + 1
        for step in range(first_step, self.cfg.steps + 1):
            record = self.train_step(step)
            records.append(record)
            self.metrics.log(record)
            if self.rank == 0 and (step % self.cfg.log_every == 0 or step == self.cfg.steps):
                log.info("step %d/%d  loss %.4f  grad_norm %.3f  lr %.2e  tok/s %.0f  mfu %.2f%%  mem %.2f GiB",
                         step, self.cfg.steps, record["loss"], record["grad_norm"], record["lr"],
                         record["tokens_per_s"], 100 * record["mfu"], record["peak_mem_gib"])
        summary = self._summary(records, time.perf_counter() - start, first_step)
        if self.rank == 0:
            with contract.atomic_write(contract.join(self.run_dir, "summary.json"), "w") as f:
                f.write(json.dumps(summary, indent=2, sort_keys=True))
        return summary

    def _summary(self, records: list[dict], wall_s: float, first_step: int) -> dict:
        # The first step pays for warm-up (allocation, compile, pipeline shape inference).
        steady = records[1:] or records
        step_time = sum(r["step_time_s"] for r in steady) / max(1, len(steady))
        tokens_per_s = self.batch.tokens_per_step / step_time if steady else 0.0
        return {
            "steps": self.state.step,
            "first_step": first_step,
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
        }

    def close(self) -> None:
        self.loader.close()
        self.metrics.close()
        if self._owns_group:
            dist.destroy_process_group()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
