"""A Hugging Face Llama folder read as smelt's model shape: its config.json, checked, as a ``ModelConfig``.

No torch: the typed train config (which the planner imports) sizes a run started from such a folder
(``train.init_from``) through this module; the weights are ``tasks/train/hf.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks import contract, storage
from tasks.model_config import ModelConfig

CONFIG = "config.json"
SMELT_META = "smelt_meta.json"  # smelt's own record beside the Hugging Face files (tasks/train/export.py)


def model_config(hf: dict, *, vocab_size: int | None = None) -> ModelConfig:
    """The smelt ModelConfig of a Llama config.json; a ValueError names what smelt's model lacks.

    ``vocab_size``: the training data's vocabulary, which must fit in the model's.
    """
    if hf.get("model_type") != "llama":
        raise ValueError(f"the folder holds a {hf.get('model_type')!r} model; --init-from needs a Llama one")
    unsupported = [key for key in ("attention_bias", "mlp_bias") if hf.get(key)]
    if hf.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={hf['hidden_act']}")
    rope = hf.get("rope_parameters") or {}
    if hf.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        unsupported.append("rope scaling")
    heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        unsupported.append(f"head_dim={hf['head_dim']} != hidden_size / num_attention_heads")
    if unsupported:
        raise ValueError(f"smelt's model cannot represent this Llama config: {', '.join(unsupported)}")
    if vocab_size is not None and vocab_size > hf["vocab_size"]:
        raise ValueError(f"the training data has {vocab_size} token ids but the model's vocabulary holds "
                         f"{hf['vocab_size']}; tokenize with the model's tokenizer")
    return ModelConfig(
        dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads, ffn_hidden=hf["intermediate_size"],
        vocab_size=hf["vocab_size"], max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def local_folder(url: str) -> Path:
    """The local path of a Hugging Face folder URL (safetensors are read in place, slice by slice)."""
    url = storage.normalize_url(url)
    if not url.startswith("file://"):
        raise ValueError(f"{url}: a Hugging Face folder must be on the local filesystem (copy it there first)")
    path = Path(url.removeprefix("file://"))
    if not (path / CONFIG).is_file():
        raise ValueError(f"{path} has no config.json; pass a Hugging Face model folder (e.g. one `smelt export` wrote)")
    if (path / SMELT_META).is_file() and not (path / contract.MANIFEST).is_file():
        raise ValueError(f"{path} is an unfinished smelt export (no manifest.json); export it again")
    return path


def read_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / CONFIG).read_text())
