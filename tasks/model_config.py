"""The model's shape: the Llama-3-style decoder config and its published presets.

Shared core (train builds the model, eval and export rebuild it from a checkpoint's manifest, the
planner in ``infra/`` sizes it). Plain dataclasses with no torch import, so the planner and the CLI
read the same presets the trainer builds; the model itself is ``tasks/llama.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tasks.errors import UserError


@dataclass
class ModelConfig:
    """Llama-3-style decoder shape. ``vocab_size = 0`` means: take it from the tokenizer."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 192
    vocab_size: int = 0
    max_seq_len: int = 2048
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name} must be at least 1, got {getattr(self, name)}")
        if self.vocab_size < 0:
            raise UserError(f"model.vocab_size must be >= 0 (0: from the tokenizer), got {self.vocab_size}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise UserError("model.rope_theta and model.norm_eps must be positive")
        if self.dim % self.n_heads:
            raise UserError(f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({self.n_kv_heads})")
        if (self.dim // self.n_heads) % 2:
            raise UserError("model.dim / model.n_heads must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def num_params(self, include_embedding: bool = True) -> int:
        """Exact parameter count of the model this config builds (needs ``vocab_size``)."""
        d, kv = self.dim, self.n_kv_heads * self.head_dim
        attn = d * d + 2 * d * kv + d * d  # wq, wk, wv, wo
        mlp = 3 * d * self.ffn_hidden  # w1, w2, w3
        per_layer = attn + mlp + 2 * d  # two RMSNorm weights
        embed = self.vocab_size * d
        out = 0 if self.tie_embeddings else self.vocab_size * d
        total = self.n_layers * per_layer + d + out  # final norm
        return total + (embed if include_embedding else 0)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6·N (non-embedding) + 12·L·H·Q·T (attention), as in PaLM/torchtitan."""
        n = self.num_params(include_embedding=False)
        return 6 * n + 12 * self.n_layers * self.n_heads * self.head_dim * seq_len


# Published shapes: Llama 3 8B / 70B (ffn from multiplier 1.3 / 1.3, multiple_of 1024), Llama 3.2 1B / 3B.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192, max_seq_len=512),
    "125m": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_hidden=2048, vocab_size=32000),
    "1b": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_hidden=8192, vocab_size=128256,
                      tie_embeddings=True, max_seq_len=8192),
    "3b": ModelConfig(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_hidden=8192, vocab_size=128256,
                      tie_embeddings=True, max_seq_len=8192),
    "8b": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256,
                      max_seq_len=8192),
    "70b": ModelConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=128256,
                       max_seq_len=8192),
    # Llama 3 405B (Llama 3 paper, Table 3; ffn multiplier 1.2): the planner's calibration (infra/README.md).
    "405b": ModelConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_hidden=53248, vocab_size=128256,
                        max_seq_len=8192),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
