"""Model shapes for the planner: key=value overrides and Hugging Face config.json files."""

import json

import pytest

from infra.models import from_hf_config, model_config, parse_model_set
from tasks.model_config import PRESETS


def test_model_set_overrides_fields_and_defaults_to_plain_multi_head_attention():
    assert parse_model_set(["dim=4096,layers=32", "heads=32"]) == {"dim": 4096, "n_layers": 32, "n_heads": 32,
                                                                   "n_kv_heads": 32}
    cfg = model_config("8b", parse_model_set(["layers=16"]))
    assert cfg.n_layers == 16 and cfg.dim == PRESETS["8b"].dim
    with pytest.raises(ValueError, match="key one of"):
        parse_model_set(["width=3"])
    with pytest.raises(ValueError, match="whole number"):
        parse_model_set(["dim=big"])


def test_llama_and_gpt_style_configs_map_onto_the_llama_block(tmp_path):
    llama = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "intermediate_size": 28672, "vocab_size": 128256, "hidden_act": "silu"}
    assert from_hf_config(llama) == PRESETS["70b"]
    gpt2 = {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "tie_word_embeddings": True}
    cfg = from_hf_config(gpt2)  # GELU MLP of 4h → SwiGLU of the same FLOPs: 2/3 × 4h
    assert (cfg.dim, cfg.n_layers, cfg.n_kv_heads, cfg.ffn_hidden, cfg.tie_embeddings) == (768, 12, 12, 2048, True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama))
    assert model_config("ignored", hf_config=path).n_layers == 80
    with pytest.raises(ValueError, match="cannot read model config"):
        model_config("8b", hf_config=tmp_path / "missing.json")
