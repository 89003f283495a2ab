"""The Hugging Face Llama format: tensor names, rotary layout and config.json, both ways.

smelt's attention rotates interleaved pairs (x[2i], x[2i+1]) of each head (Meta's layout);
transformers and vLLM rotate half-split pairs (x[i], x[i + E/2]). The two are the same model up to
a fixed permutation of the rows of wq and wk inside each head, so the export permutes those rows
(``to_hf``) and a load permutes them back (``from_hf``); every other tensor is only renamed.

A Hugging Face folder is read one tensor at a time (``HFWeights``): ``load_into`` fills a sharded
model (FSDP, TP, pipeline stages) parameter by parameter. Where a rank's shard is one block of the
parameter (FSDP, TP or HSDP alone) it reads just that block from the safetensors file; for strided
layouts (FSDP over TP) it reads the full parameter and keeps its shard, so no rank ever holds more
than one full parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from tasks.llama import Transformer, canonical_name, rope_tables
from tasks.model_config import ModelConfig
from tasks.train.hf_folder import (  # noqa: F401 - callers read the folder's names through hf too
    CONFIG, SMELT_META, local_folder, model_config, read_config)
from tasks.train.parallelize import assign_full_value

GENERATION_CONFIG = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX = "model.safetensors.index.json"
TORCH_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_IN_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
}
_TOP_BACK = {v: k for k, v in _TOP.items()}
_IN_LAYER_BACK = {v: k for k, v in _IN_LAYER.items()}
_ROTATED = ("attention.wq.weight", "attention.wk.weight")


def hf_name(name: str) -> str:
    """transformers' LlamaForCausalLM name of a smelt parameter; ValueError for anything else."""
    if name in _TOP:
        return _TOP[name]
    match = _LAYER.match(name)
    if match and match.group(2) in _IN_LAYER:
        return f"model.layers.{match.group(1)}.{_IN_LAYER[match.group(2)]}"
    raise ValueError(f"{name!r} is not a parameter of smelt's Llama model")


def smelt_name(name: str) -> str:
    """The smelt parameter behind a LlamaForCausalLM tensor name; ValueError for anything else."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    match = _HF_LAYER.match(name)
    if match and match.group(2) in _IN_LAYER_BACK:
        return f"layers.{match.group(1)}.{_IN_LAYER_BACK[match.group(2)]}"
    raise ValueError(f"{name!r} is not a tensor of a Llama model")


def hf_order(name: str) -> tuple:
    """Sort key of smelt names in transformers' order: embeddings, layers by number, norm, head."""
    match = _LAYER.match(name)
    if match:
        return (1, int(match.group(1)), list(_IN_LAYER).index(match.group(2)) if match.group(2) in _IN_LAYER else 99)
    return {"tok_embeddings.weight": (0,), "norm.weight": (2,), "output.weight": (3,)}.get(name, (4, name))


def _permute(name: str, tensor: torch.Tensor, head_dim: int, to_half_split: bool) -> torch.Tensor:
    if not name.endswith(_ROTATED):
        return tensor
    rows, cols = tensor.shape
    if to_half_split:  # row 2i+s of a head -> row s*E/2+i
        return tensor.view(rows // head_dim, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
    return tensor.view(rows // head_dim, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def to_hf(name: str, tensor: torch.Tensor, head_dim: int) -> tuple[str, torch.Tensor]:
    """A smelt parameter as the LlamaForCausalLM tensor: renamed, q/k rows in half-split order."""
    return hf_name(name), _permute(name, tensor, head_dim, to_half_split=True).contiguous()


def from_hf(name: str, tensor: torch.Tensor, head_dim: int) -> tuple[str, torch.Tensor]:
    """A LlamaForCausalLM tensor as the smelt parameter (inverse of ``to_hf``)."""
    smelt = smelt_name(name)
    return smelt, _permute(smelt, tensor, head_dim, to_half_split=False).contiguous()


# -- config.json --------------------------------------------------------------------------------------


def hf_config(cfg: ModelConfig, *, dtype: torch.dtype, bos_id: int | None, eos_id: int | None,
              pad_id: int | None) -> dict:
    """config.json of a LlamaForCausalLM: every field transformers (v4 and v5) and vLLM read."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers v4, vLLM
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # transformers v5
        "max_position_embeddings": cfg.max_seq_len,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": TORCH_DTYPES[dtype],
        "dtype": TORCH_DTYPES[dtype],
    }


def generation_config(*, bos_id: int | None, eos_id: int | None, pad_id: int | None) -> dict:
    return {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id, "do_sample": False}


class HFWeights:
    """The tensors of a local Hugging Face safetensors folder (one file or an index), read one at a
    time and returned under smelt's names in smelt's layout."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.config = read_config(self.folder)
        self.model_cfg = model_config(self.config)
        if (self.folder / INDEX).is_file():
            weight_map = json.loads((self.folder / INDEX).read_text())["weight_map"]
        elif (self.folder / SINGLE_FILE).is_file():
            with safe_open(self.folder / SINGLE_FILE, framework="pt") as f:
                weight_map = {key: SINGLE_FILE for key in f.keys()}
        else:
            raise ValueError(f"{self.folder} has neither {SINGLE_FILE} nor {INDEX}")
        self.files = {}  # smelt name -> (file, HF name)
        for name, file in weight_map.items():
            if name.endswith("rotary_emb.inv_freq"):  # a buffer some older exports carry
                continue
            self.files[smelt_name(name)] = (file, name)

    def names(self) -> list[str]:
        return sorted(self.files, key=hf_order)

    def _source(self, name: str) -> tuple[str, str]:
        if name not in self.files and name == "output.weight" and self.model_cfg.tie_embeddings:
            name = "tok_embeddings.weight"  # the tied head reads the embeddings
        if name not in self.files:
            raise ValueError(f"{self.folder} has no tensor for {name} ({hf_name(name)})")
        return self.files[name]

    def shape(self, name: str) -> tuple[int, ...]:
        file, hf = self._source(name)
        with safe_open(self.folder / file, framework="pt") as f:
            return tuple(f.get_slice(hf).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The full value of smelt parameter ``name``."""
        file, hf = self._source(name)
        with safe_open(self.folder / file, framework="pt") as f:
            tensor = f.get_tensor(hf)
        return from_hf(hf, tensor, self.model_cfg.head_dim)[1]

    def get_box(self, name: str, offset: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The block ``[offset, offset + shape)`` of smelt parameter ``name``, reading only that block
        (for wq/wk: the whole heads it lies in, whose rows the layout permutes)."""
        file, hf = self._source(name)
        box = [slice(o, o + n) for o, n in zip(offset, shape)]
        inner = slice(None)
        if name.endswith(_ROTATED):
            E = self.model_cfg.head_dim
            first, end = offset[0] // E * E, -(-(offset[0] + shape[0]) // E) * E
            box[0], inner = slice(first, end), slice(offset[0] - first, offset[0] - first + shape[0])
        with safe_open(self.folder / file, framework="pt") as f:
            block = f.get_slice(hf)[tuple(box)]
        return _permute(name, block, self.model_cfg.head_dim, to_half_split=False)[inner].contiguous()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor at once (small models: tests, eval)."""
        return {name: self.get(name) for name in self.names()}


def _local_box(param: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(offset, shape)`` of this rank's shard of ``param`` when it is one block of the full tensor
    (plain Shard/Replicate placements: FSDP, TP, HSDP alone); None for strided layouts (FSDP over TP)."""
    if not all(type(p) in (Shard, Replicate) for p in param.placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(offset), tuple(shape)


@torch.no_grad()
def load_into(parts: Iterable[nn.Module], folder: str | Path) -> int:
    """Overwrite every parameter of the (possibly sharded, possibly pipeline-split) model ``parts``
    with the folder's weights; returns the number of tensors loaded. A rank reads only its own block
    of each parameter where its shard is one block, otherwise one full parameter at a time."""
    weights = HFWeights(folder)
    loaded = 0
    for part in parts:
        for name, param in part.named_parameters():
            name = canonical_name(name)
            full_shape = weights.shape(name)
            if full_shape != tuple(param.shape):
                raise ValueError(f"{name}: the folder holds shape {full_shape}, the model {tuple(param.shape)}")
            box = _local_box(param) if isinstance(param, DTensor) else None
            if box is not None:
                param.to_local().copy_(weights.get_box(name, *box).to(param.device, param.dtype))
            else:
                assign_full_value(param, weights.get(name).to(param.device, param.dtype))
            loaded += 1
    return loaded


def load_model(folder: str | Path) -> Transformer:
    """The whole model of a (small) Hugging Face Llama folder as a smelt ``Transformer`` in fp32 on CPU."""
    weights = HFWeights(folder)
    with torch.device("meta"):
        model = Transformer(weights.model_cfg)
    model.load_state_dict({k: v.float() for k, v in weights.state_dict().items()}, assign=True, strict=True)
    model.tie_weights()
    cfg = weights.model_cfg
    model.rope = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)  # not saved: recompute it
    return model.eval()
