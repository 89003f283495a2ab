"""Cross entropy over a rank's logits that never holds their whole fp32 softmax.

``F.cross_entropy(logits.float())`` keeps an fp32 copy of the logits and their fp32 log-softmax for the
backward: 12 bytes per logit at its peak, and 16 under tensor parallelism, where torch's vocabulary-parallel
loss (``loss_parallel``) decomposes log-softmax and its backward. Here the tokens are cut into chunks of about
``CHUNK_LOGITS`` logits and each chunk's loss runs under activation checkpointing, so the backward recomputes
one chunk's fp32 softmax at a time. The loss then holds about 6 bytes per logit: the bf16 logits, the chunks'
bf16 gradients and their concatenation (``bench/loss_memory.py`` measures both). The price is one more
forward pass of the loss, which reads and writes only the logits. A micro-batch of one chunk or less is
computed as one eager loss: its peak is one chunk's, and recomputing it would save nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

# Logits per chunk: 256 MB per fp32 copy of a chunk, and few enough chunks (8 for a 70B's 8K-token micro-batch
# under TP2) that launching each chunk's kernels, DTensor's dispatch included, costs little beside their work.
CHUNK_LOGITS = 2**26


def _summed(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def token_sum_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, chunk_logits: int | None = None
                            ) -> torch.Tensor:
    """Cross entropy summed over tokens. ``logits`` (B, T, V), or a DTensor sharded over V under
    ``loss_parallel``; ``targets`` (B, T); ``chunk_logits`` (this rank's logits per chunk) defaults to
    ``CHUNK_LOGITS``."""
    flat, labels = logits.flatten(0, 1), targets.flatten()
    vocab = logits.to_local().shape[-1] if isinstance(logits, DTensor) else logits.shape[-1]  # this rank's
    tokens = max(1, (chunk_logits or CHUNK_LOGITS) // vocab)
    if flat.shape[0] <= tokens:  # one chunk: recomputing it would save nothing
        return _summed(flat, labels)
    # the loss draws no random numbers: no RNG state to save and restore per chunk
    parts = [checkpoint(_summed, x, y, use_reentrant=False, preserve_rng_state=False)
             for x, y in zip(flat.split(tokens), labels.split(tokens))]
    return sum(parts[1:], parts[0])


def _per_token(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    losses = F.cross_entropy(logits.float(), targets, reduction="none")
    return losses.sum(), losses.detach()


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, chunk_logits: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_sum_cross_entropy`` and, from the same softmax, every token's loss (detached, fp32, (B·T,)):
    the per-sample records (tasks/train/sample_losses.py) cost a vector of B·T floats, not another pass over
    the logits. Under ``loss_parallel`` the per-token losses are gathered from their DTensor (B·T floats)."""
    flat, labels = logits.flatten(0, 1), targets.flatten()
    vocab = logits.to_local().shape[-1] if isinstance(logits, DTensor) else logits.shape[-1]
    tokens = max(1, (chunk_logits or CHUNK_LOGITS) // vocab)
    if flat.shape[0] <= tokens:  # one chunk: recomputing it would save nothing
        parts = [_per_token(flat, labels)]
    else:
        parts = [checkpoint(_per_token, x, y, use_reentrant=False, preserve_rng_state=False)
                 for x, y in zip(flat.split(tokens), labels.split(tokens))]
    total = sum((p[0] for p in parts[1:]), parts[0][0])
    each = [p[1].full_tensor() if isinstance(p[1], DTensor) else p[1] for p in parts]
    return total, each[0] if len(each) == 1 else torch.cat(each)
