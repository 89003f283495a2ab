"""AdamW over every model part, the warmup + cosine learning-rate schedule, and gradient clipping
on the true global norm (across FSDP/TP shards and pipeline stages).

The schedule is a pure function of the step, so restoring the step restores it: no scheduler
state to checkpoint.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tasks.train.config import OptimConfig


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (1-based): linear warmup to ``cfg.lr`` over
    ``warmup_steps``, then cosine decay to ``lr · min_lr_ratio`` at ``total_steps``."""
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Optimizers:
    """One AdamW per model part (pipeline stage), stepped and zeroed together (checkpointed through
    tasks.train.checkpoint_writer.ModelOptimState, which needs each part's own optimizer).

    Matrices and embeddings get weight decay; norm weights do not (decaying a gain towards 0 only
    fights the normalisation).
    """

    def __init__(self, parts: list[nn.Module], cfg: OptimConfig, device_type: str) -> None:
        self.optimizers = []
        for part in parts:
            params = [p for p in part.parameters() if p.requires_grad]
            groups = [
                {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
            ]
            # The fused kernel is fastest on accelerators; foreach is the fast path on CPU.
            fused = device_type != "cpu"
            self.optimizers.append(torch.optim.AdamW(
                groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused, foreach=not fused,
            ))

    def set_lr(self, lr: float) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


@torch.no_grad()
def clip_grad_norm_(params: list[nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Clip gradients to ``max_norm`` by their global L2 norm, which is returned (before clipping).

    Sharded gradients are DTensors whose norm reduces over their mesh (FSDP and TP shards);
    pipeline stages hold disjoint parameters, so their squared norms are summed over ``pp_group``.
    ``max_norm <= 0`` only measures.
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if pp_group is not None:
        squared = total**2
        dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=pp_group)
        total = squared.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total
