"""Model shapes for the planner: a trainer preset, with ``key=value`` overrides, or a Hugging Face config.json.

The planner counts a Llama block (attention with grouped KV heads, a three-matrix SwiGLU MLP). A GPT-style
two-matrix MLP of width ``e·d`` has the same parameters and matmul FLOPs as a SwiGLU of width ``2e·d/3``, so
GPT/MPT configs map onto that width; only the activation memory of the MLP differs (a few percent of a layer).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tasks.model_config import ModelConfig, preset

# --model-set key → ModelConfig field
SET_KEYS = {"dim": "dim", "layers": "n_layers", "heads": "n_heads", "kv_heads": "n_kv_heads", "ffn": "ffn_hidden",
            "vocab": "vocab_size", "tied": "tie_embeddings"}


def parse_model_set(items: list[str]) -> dict[str, int | bool]:
    """``["dim=4096,layers=32", "vocab=32000"]`` → ModelConfig field overrides."""
    out: dict[str, int | bool] = {}
    for item in (part for chunk in items for part in chunk.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in SET_KEYS:
            raise ValueError(f"--model-set {item!r}: use key=value with key one of {', '.join(SET_KEYS)}")
        try:
            out[SET_KEYS[key]] = (value.strip().lower() in ("1", "true", "yes")) if key == "tied" else int(value)
        except ValueError:
            raise ValueError(f"--model-set {item!r} needs a whole number after '='") from None
        if key != "tied" and out[SET_KEYS[key]] <= 0:
            raise ValueError(f"--model-set {item!r} must be positive")
    if "n_heads" in out and "n_kv_heads" not in out:
        out["n_kv_heads"] = out["n_heads"]  # plain multi-head attention unless told otherwise
    return out


def from_hf_config(config: dict) -> ModelConfig:
    """A ModelConfig from a Hugging Face ``config.json`` (Llama/Mistral/Qwen keys, or GPT-2/MPT keys)."""
    def first(*keys):
        for key in keys:
            if config.get(key) is not None:
                return config[key]
        raise ValueError(f"config.json has none of {', '.join(keys)}")

    dim = int(first("hidden_size", "d_model", "n_embd"))
    heads = int(first("num_attention_heads", "n_heads", "n_head"))
    kv = int(config.get("num_key_value_heads") or heads)
    if config.get("intermediate_size"):
        ffn = int(config["intermediate_size"])
        if config.get("hidden_act", "silu") not in ("silu", "swish"):  # a two-matrix MLP: same FLOPs as 2/3 width
            ffn = round(2 * ffn / 3)
    else:
        ratio = config.get("expansion_ratio") or (config.get("n_inner") or 4 * dim) / dim
        ffn = round(2 * ratio * dim / 3)
    return ModelConfig(dim=dim, n_layers=int(first("num_hidden_layers", "n_layers", "n_layer")), n_heads=heads,
                       n_kv_heads=kv, ffn_hidden=ffn, vocab_size=int(first("vocab_size")),
                       max_seq_len=int(config.get("max_position_embeddings") or config.get("max_seq_len") or 8192),
                       tie_embeddings=bool(config.get("tie_word_embeddings", False)))


def model_config(name: str, sets: dict | None = None, hf_config: Path | None = None, vocab_size: int = 0
                 ) -> ModelConfig:
    """The shape the planner counts: the HF config if given, else the preset ``name``; then ``sets``."""
    if hf_config is not None:
        try:
            base = from_hf_config(json.loads(Path(hf_config).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {hf_config}: {e}") from None
    else:
        base = preset(name)
    fields = dict(sets or {})
    if vocab_size:
        fields.setdefault("vocab_size", vocab_size)
    cfg = dataclasses.replace(base, **fields)
    if not cfg.vocab_size:
        raise ValueError(f"model preset {name!r} takes its vocabulary from the tokenizer; pass --vocab-size")
    return cfg
