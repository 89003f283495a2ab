"""Llama-3-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention (SDPA).

Single-device code: nothing here knows about meshes or sharding (tasks/train/parallelize.py does
that from outside). Built on the meta device, sharded, then materialised with ``init_weights``.

Shape legend:
    B  batch (micro-batch) size          T  sequence length (T / tp inside sequence-parallel regions)
    D  model dim                         V  vocabulary size
    H  query heads (H / tp under TP)     K  key/value heads (K / tp under TP)
    E  head dim (D / H)                  F  feed-forward hidden size

Heads are reshaped with ``-1`` rather than H or K so the same code runs on a tensor-parallel
shard, which holds H/tp query and K/tp key/value heads.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tasks.model_config import ModelConfig

# Wrappers that activation checkpointing and compile put around a block add these to parameter
# names; the canonical name (used for seeds and checkpoints) has them removed.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


class _RMSNorm(torch.autograd.Function):
    """``(x / rms(x)).type_as(x) * weight``, normalised in fp32 (bf16 sums of squares over D lose too much
    precision). Autograd would keep two fp32 copies of x and the bf16 normalised x for the backward (10
    bytes per element of a bf16 x); this keeps x as it came and one fp32 scale per row, and recomputes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad_weight = (grad * normed.type_as(x)).sum(dim=tuple(range(grad.ndim - 1)))
        g = (grad * weight).to(rstd.dtype)
        grad_x = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return grad_x.type_as(x), grad_weight, None


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """(max_seq_len, E/2, 2) cos and sin of each position's rotation angle per frequency pair."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), freqs)  # (T, E/2)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x0, x1) of each head by the position's angle (Meta Llama layout).

    x: (B, T, heads, E); rope: (T, E/2, 2). Real arithmetic instead of complex numbers keeps
    bf16 and torch.compile happy.
    """
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, T, heads, E/2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = rope[: x.shape[1], None, :, 0], rope[: x.shape[1], None, :, 1]  # (T, 1, E/2)
    rotated = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, -1, self.head_dim)  # (B, T, H, E)
        k = self.wk(x).view(B, T, -1, self.head_dim)  # (B, T, K, E)
        v = self.wv(x).view(B, T, -1, self.head_dim)  # (B, T, K, E)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, E)
        # enable_gqa lets SDPA share each K/V head across H/K query heads without copying.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, F) inside, (B, T, D) out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)  # (B, T, D)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder. A pipeline stage is this module with the parts it does not own set to None:
    then ``forward`` takes the previous stage's hidden states instead of token ids and returns
    hidden states instead of logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (it is read from the tokens dataset's manifest)")
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A ModuleDict keyed by layer number keeps parameter names stable when a pipeline stage
        # drops the layers it does not own, so checkpoints load into any pipeline layout.
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.tie_weights()
        # Recomputed by init_weights (a meta buffer has no values); not saved in checkpoints.
        self.register_buffer("rope", rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens  # (B, T, D)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h  # (B, T, V) logits or (B, T, D)

    def tie_weights(self) -> None:
        """Share the embedding matrix with the output layer if configured. Called again after
        ``to_empty``, which gives every module a fresh tensor and so unties them."""
        if self.cfg.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    # -- initialisation --------------------------------------------------------------------

    def init_std(self, name: str) -> float | None:
        """Standard deviation a parameter starts with; None for RMSNorm weights (ones).

        GPT-2 style: 0.02 everywhere, residual projections scaled by 1/sqrt(2·n_layers) so the
        residual stream's variance does not grow with depth.
        """
        name = canonical_name(name)
        if name.endswith("norm.weight"):
            return None
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            return 0.02 / math.sqrt(2 * self.cfg.n_layers)
        return 0.02

    def initial_value(self, name: str, shape: torch.Size, dtype: torch.dtype, device, seed: int) -> torch.Tensor:
        """The full starting value of parameter ``name``, from a generator seeded by (seed, name).

        Seeding per parameter makes the weights independent of how the model is later sharded or
        split into pipeline stages, so every parallel layout starts from identical weights.
        """
        std = self.init_std(name)
        if std is None:
            return torch.ones(shape, dtype=dtype, device=device)
        key = hashlib.blake2b(f"{seed}/{canonical_name(name)}".encode(), digest_size=7).digest()
        generator = torch.Generator(device=device).manual_seed(int.from_bytes(key, "little"))
        value = torch.empty(shape, dtype=torch.float32, device=device)
        nn.init.trunc_normal_(value, std=std, a=-3 * std, b=3 * std, generator=generator)
        return value.to(dtype)

    @torch.no_grad()
    def init_weights(self, seed: int = 0, assign: Callable[[nn.Parameter, torch.Tensor], None] | None = None) -> None:
        """Fill every parameter and buffer (after ``to_empty``). ``assign(param, full_value)`` writes a
        full value into a possibly sharded parameter; by default a plain copy."""
        assign = assign or (lambda param, value: param.copy_(value))
        self.tie_weights()
        for name, param in self.named_parameters():
            assign(param, self.initial_value(name, param.shape, param.dtype, param.device, seed))
        self.rope = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, device=self.rope.device)
