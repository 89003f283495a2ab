"""Apply parallelism to a single-device model from outside, in the order of docs/design.md §4:
FP8 layers (optional) → tensor (+ sequence, + loss) parallel → activation checkpointing →
torch.compile → FSDP2 (always, at data-parallel degree 1 too: the one home of mixed precision).

Each ``apply_*`` takes only what it needs (the TP mesh, not the world). Pipeline splitting happens
before this, in tasks/train/pipeline_parallel.py; each pipeline stage is parallelised on its own.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from tasks.errors import UserError
from tasks.llama import Transformer
from tasks.train.config import ParallelConfig
from tasks.train.float8 import apply_float8, float8_shape_problems
from tasks.train.parallel_dims import ParallelDims

log = logging.getLogger(__name__)


def check_model_fits(model: Transformer, dims: ParallelDims, seq_len: int, float8: str = "none") -> None:
    """Shapes the layout needs to divide evenly; a clear error instead of a deep DTensor one."""
    cfg = model.cfg
    if dims.tp_enabled:
        for name, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_hidden", cfg.ffn_hidden),
                           ("vocab_size", cfg.vocab_size)):
            if size % dims.tp:
                raise UserError(f"model.{name} ({size}) must be divisible by parallel.tp ({dims.tp})")
        if seq_len % dims.tp:
            raise UserError(f"data.seq_len ({seq_len}) must be divisible by parallel.tp ({dims.tp}) for sequence parallel")
    if seq_len > cfg.max_seq_len:
        raise UserError(f"data.seq_len ({seq_len}) exceeds model.max_seq_len ({cfg.max_seq_len})")
    if float8 != "none":
        widths = {"model.dim": cfg.dim, "model.ffn_hidden": cfg.ffn_hidden,
                  "model.n_kv_heads × head_dim": cfg.n_kv_heads * (cfg.dim // cfg.n_heads)}
        if problems := float8_shape_problems(widths, dims.tp):
            raise UserError(f"parallel.float8={float8} needs FP8-sized matmuls: " + "; ".join(problems))


def parallelize_model(model: Transformer, dims: ParallelDims, cfg: ParallelConfig, device_type: str) -> Transformer:
    """Shard ``model`` (still on meta) for ``dims``; returns it, ready for ``materialize`` (``cfg``'s
    choices were checked when it was built, tasks/train/config.py)."""
    if cfg.float8 != "none":
        apply_float8(model, cfg.float8)
    if dims.tp_enabled:
        apply_tp(model, dims.mesh["tp"], loss_parallel=True)
    if cfg.activation_checkpoint != "none":
        apply_ac(model, cfg.activation_checkpoint)
    if cfg.compile:
        apply_compile(model)
    # FSDP2 on every layout, over one rank too (dp_shard = 1, as torchtitan does): its
    # MixedPrecisionPolicy is then the only place bf16 compute comes from, so one model gives the
    # same bf16 numerics sharded or not (autocast, used before without FSDP, kept norms and the
    # residual stream in fp32). A pipeline stage runs several microbatches forward before their
    # backwards: resharding after each forward would all-gather its parameters once per microbatch.
    apply_fsdp(
        model,
        dims.fsdp_mesh(),
        param_dtype=compute_dtype(cfg, device_type),
        reshard_after_forward=not (cfg.zero2 or dims.pp_enabled),
        per_block=cfg.fsdp_per_block,
    )
    return model


def compute_dtype(cfg: ParallelConfig, device_type: str) -> torch.dtype:
    """bf16 compute on accelerators, fp32 on CPU, unless the config says otherwise."""
    if cfg.mixed_precision == "auto":
        return torch.float32 if device_type == "cpu" else torch.bfloat16
    return torch.bfloat16 if cfg.mixed_precision == "bf16" else torch.float32


# -- tensor parallel ------------------------------------------------------------------------------


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, loss_parallel: bool) -> None:
    """Megatron-style TP with sequence parallel: attention/FFN matmuls split by heads/hidden,
    norms and the residual stream split along the sequence (Shard(1)) between them.

    With ``loss_parallel`` the logits stay sharded over the vocabulary (Shard(-1)) and the loss
    is computed under ``torch.distributed.tensor.parallel.loss_parallel()`` without gathering them.
    """
    top_plan = {}
    if model.tok_embeddings is not None:
        top_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top_plan["norm"] = SequenceParallel()
    if model.output is not None:
        top_plan["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, top_plan)
    if model.cfg.tie_embeddings and model.output is not None:
        # Both are vocabulary-sharded (Shard(0)) DTensors now; share one again.
        model.output.weight = model.tok_embeddings.weight

    block_plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)
    log.info("applied tensor parallel (sequence parallel, loss parallel=%s) over %d ranks", loss_parallel, tp_mesh.size())


# -- activation checkpointing ---------------------------------------------------------------------

# Selective AC keeps the outputs of these ops (expensive to recompute, cheap to hold relative to
# their cost) and recomputes everything else (norms, activations, rotary: memory-bound ops).
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_mm.default,  # FP8 (parallel.float8)
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
}


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: Transformer, mode: str) -> None:
    """Wrap each block: ``full`` recomputes the whole block in backward; ``selective`` recomputes
    only memory-bound ops and keeps matmul and attention outputs."""
    for name, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            context_fn = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
            wrapped = checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)
        model.layers[name] = wrapped
    log.info("applied %s activation checkpointing to %d blocks", mode, len(model.layers))


# -- compile ---------------------------------------------------------------------------------------


def apply_compile(model: Transformer) -> None:
    """Compile each block separately: blocks repeat, so one compiled graph is reused, and FSDP's
    per-block hooks stay outside the graphs. ``Module.compile`` keeps parameter names unchanged."""
    for block in model.layers.values():
        block.compile(fullgraph=True)
    log.info("compiled %d blocks with torch.compile", len(model.layers))


# -- FSDP2 -----------------------------------------------------------------------------------------


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, *, param_dtype: torch.dtype, reshard_after_forward: bool,
               per_block: bool = True) -> None:
    """FSDP2 per block, then the root (embeddings, final norm, output). A 2-D ``dp_mesh``
    (dp_replicate, dp_shard) gives HSDP; a 1-rank one shards nothing but still casts the parameters
    to ``param_dtype`` for compute. Gradients are always reduced in fp32. Parameter names (the
    checkpoints' keys) are unchanged: fully_shard swaps tensors for DTensors, it wraps no module.

    ``reshard_after_forward=False`` is ZeRO-2: parameters stay gathered between forward and
    backward, trading memory for one all-gather less per block. ``per_block=False``: the root's one
    group holds every parameter (a small model's per-block collectives cost more than they overlap).
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = list(model.layers.values()) if per_block else []
    for i, block in enumerate(blocks):
        # The last block's backward starts right after forward: resharding it would be wasted.
        fully_shard(block, mesh=dp_mesh, mp_policy=mp,
                    reshard_after_forward=reshard_after_forward and i < len(blocks) - 1)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    log.info("applied FSDP2 over mesh %s (param dtype %s, reshard after forward %s)",
             dict(zip(dp_mesh.mesh_dim_names, dp_mesh.shape)), param_dtype, reshard_after_forward)


# -- materialise ------------------------------------------------------------------------------------


def assign_full_value(param: nn.Parameter, value: torch.Tensor) -> None:
    """Write a full (unsharded) value into ``param``, keeping only this rank's shard of it."""
    if isinstance(param, DTensor):
        local = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(value)


def materialize(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate the sharded parameters on ``device`` and initialise them layout-independently."""
    model.to_empty(device=device)
    model.init_weights(seed, assign=assign_full_value)


def param_counts(model: nn.Module) -> Counter:
    """Parameters this rank holds locally (``local``) and in the full model it is part of (``global``)."""
    counts: Counter = Counter()
    for param in model.parameters():
        counts["global"] += param.numel()
        counts["local"] += param.to_local().numel() if isinstance(param, DTensor) else param.numel()
    return counts
