"""Hugging Face format, checked with transformers itself: an export loads with AutoModelForCausalLM
and AutoTokenizer and computes what smelt computes; a transformers-written folder loads back."""

from __future__ import annotations

import dataclasses
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks import contract, storage
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.checkpoint_reader import step_url
from tasks.eval.evaluate import probe
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.tokenize.stage import run_tokenize
from tasks.tokenize.tokenizer import train_tokenizer
from tasks.tokenizer_files import load_tokenizer
from tasks.train import hf
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState
from tasks.train.config import CheckpointConfig
from tasks.train.export import export_checkpoint, load_exported

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning", "ignore::UserWarning")

WORDS = ("the cat dog sat ran on a mat under tree big small red blue and then it was very happy sad "
         "fox jumps over lazy quick brown bird sings in morning night").split()


def documents(url: str, n: int = 160, seed: int = 0) -> contract.Manifest:
    """A documents dataset of ``n`` seeded word-salad sentences (plus one with a literal ``<|eos|>``)."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40))) + "." for _ in range(n)]
    texts[3] = "a literal <|eos|> and <|bos|> stay text " + texts[3]
    table = pa.table({name: [f"d{i}" for i in range(n)] if name == "id" else texts if name == "text" else [None] * n
                      for name in DOCUMENT_COLUMNS}, schema=document_schema())

    def write(f) -> int:
        pq.write_table(table, f)
        return n

    shard = contract.write_shard(url, "docs-00000.parquet", write)
    return contract.commit(url, "documents", f"docs-{seed}", [shard], {"docs": n})


def make_tokens(root, *, add_bos: bool = False) -> str:
    """A real tokens dataset (trained BPE tokenizer, the tokenize stage) under ``root``."""
    docs = documents(str(root / "docs"))
    tok = train_tokenizer([docs], str(root / "tokenizer"), TokenizerConfig(vocab_size=320, min_frequency=1),
                          fingerprint="tok")
    cfg = TokenizeConfig(val_fraction=0.2, add_bos=add_bos)
    return run_tokenize([docs], tok.meta["url"], str(root / "tokens"), cfg, fingerprint="tokens").meta["url"]


def model_cfg(vocab: int, *, tie: bool, **overrides) -> ModelConfig:
    return ModelConfig(**{"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 96,
                          "vocab_size": vocab, "max_seq_len": 128, "rope_theta": 10000.0, "tie_embeddings": tie,
                          **overrides})


def sharp_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Random weights with q/k scaled up: attention is sharp, so the rotary layout shows in the logits."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    model.init_weights(seed)
    with torch.no_grad():
        for layer in model.layers.values():
            layer.attention.wq.weight.mul_(12.0)
            layer.attention.wk.weight.mul_(12.0)
    return model.eval()


def save_checkpoint(model: Transformer, run_dir: str, tokens_url: str | None, step: int = 5) -> str:
    """Checkpoint ``model`` the way the trainer does (ModelOptimState + model config meta)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mgr = CheckpointManager(run_dir, CheckpointConfig(async_mode="off"), rank=0, world_size=1,
                            config_fingerprint="fp")
    meta = {"model": dataclasses.asdict(model.cfg), "tokens": step * 100,
            "data": {"main": tokens_url} if tokens_url else {}}
    mgr.maybe_save(step, {"model_optim": ModelOptimState(model, opt)}, meta, force=True)
    mgr.close()
    return step_url(run_dir, step)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    return make_tokens(tmp_path_factory.mktemp("data"))


def hf_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_transformers_loads_the_export_and_computes_smelts_logits(tmp_path, tokens, tie):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    model = sharp_model(model_cfg(vocab, tie=tie))
    export_checkpoint(save_checkpoint(model, str(tmp_path / "run"), tokens), str(tmp_path / "export"))
    ids = torch.randint(0, vocab, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
    got = hf_logits(tmp_path / "export", ids)
    assert (got - expected).abs().max().item() < 1e-4
    # The check can fail: loading with names mapped but q/k left in smelt's interleaved order is far off.
    weights = load_exported(str(tmp_path / "export"))[0]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), dtype=torch.float32)
    for i in range(model.cfg.n_layers):
        for proj, name in (("q_proj", "wq"), ("k_proj", "wk")):
            getattr(hf_model.model.layers[i].self_attn, proj).weight.data.copy_(weights[f"layers.{i}.attention.{name}.weight"])
    with torch.no_grad():
        assert (hf_model(ids).logits - expected).abs().max().item() > 1e-2


def test_export_files_config_and_tied_embeddings_written_once(tmp_path, tokens):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    model = sharp_model(model_cfg(vocab, tie=True))
    manifest = export_checkpoint(save_checkpoint(model, str(tmp_path / "run"), tokens), str(tmp_path / "export"),
                                 dtype="bf16")
    files = {s.name for s in manifest.shards}
    assert files == {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json", "smelt_meta.json"}
    assert (tmp_path / "export" / "manifest.json").is_file() and contract.verify(manifest) == []
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    assert config["head_dim"] == 16 and config["num_key_value_heads"] == 2 and config["rope_scaling"] is None
    meta = contract.open_dataset(tokens).meta
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (meta["bos_id"], meta["eos_id"],
                                                                                      meta["pad_id"])
    from safetensors import safe_open
    with safe_open(tmp_path / "export" / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys and f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert len(keys) == 1 + 2 * 9 + 1
    smelt_meta = json.loads((tmp_path / "export" / "smelt_meta.json").read_text())
    assert smelt_meta["step"] == 5 and smelt_meta["data"] == {"main": tokens} and smelt_meta["run"].endswith("/run")
    assert hf_logits(tmp_path / "export", torch.arange(20)[None]).shape == (1, 20, vocab)


def test_a_sharded_export_above_the_shard_limit_loads(tmp_path, tokens):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    model = sharp_model(model_cfg(vocab, tie=False, n_kv_heads=4))
    manifest = export_checkpoint(save_checkpoint(model, str(tmp_path / "run"), tokens), str(tmp_path / "export"),
                                 max_shard_bytes=40_000)
    weight_files = sorted(s.name for s in manifest.shards if s.name.endswith(".safetensors"))
    assert len(weight_files) == manifest.stats["weight_files"] > 3
    index = json.loads((tmp_path / "export" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(weight_files) and len(index["weight_map"]) == 2 + 2 * 9 + 1
    per_file = {f: sum(v == f for v in index["weight_map"].values()) for f in weight_files}
    # A file is within the limit (plus its small header) unless it holds one tensor larger than the limit.
    assert all(s.bytes < 40_000 + 2_000 or per_file[s.name] == 1 for s in manifest.shards if s.name in per_file)
    ids = torch.randint(0, vocab, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids)
    assert (hf_logits(tmp_path / "export", ids) - expected).abs().max().item() < 1e-4


def test_auto_tokenizer_round_trips_text_and_agrees_with_smelts_tokenizer(tmp_path, tokens):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    export_checkpoint(save_checkpoint(sharp_model(model_cfg(vocab, tie=False)), str(tmp_path / "run"), tokens),
                      str(tmp_path / "export"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    meta = contract.open_dataset(tokens).meta
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (meta["bos_id"], meta["eos_id"], meta["pad_id"])
    smelt_tok = load_tokenizer(tokens)
    for text in ["the cat sat on the mat.", "Ünïcödé 😀 漢字\tand  spaces\n", "a literal <|eos|> in <|bos|> text"]:
        ids = tok(text)["input_ids"]
        assert ids == smelt_tok.encode(text).ids  # special-token strings are text in both
        assert tok.decode(ids) == text
    assert meta["eos_id"] not in tok("x <|eos|> y")["input_ids"]


def test_a_bos_corpus_exports_a_tokenizer_that_prepends_bos(tmp_path):
    tokens = make_tokens(tmp_path, add_bos=True)
    meta = contract.open_dataset(tokens).meta
    export_checkpoint(save_checkpoint(sharp_model(model_cfg(meta["vocab_size"], tie=False)), str(tmp_path / "run"),
                                      tokens), str(tmp_path / "export"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    ids = tok("the cat")["input_ids"]
    assert ids[0] == meta["bos_id"] and ids[1:] == load_tokenizer(tokens).encode("the cat").ids


def test_greedy_generate_equals_smelts_probe_completions(tmp_path, tokens):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    model = sharp_model(model_cfg(vocab, tie=True), seed=3)
    export_checkpoint(save_checkpoint(model, str(tmp_path / "run"), tokens), str(tmp_path / "export"))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    prompts = ["the cat", "a big red fox jumps", "then"]
    expected = probe(model, load_tokenizer(tokens), prompts, 12)
    for prompt, want in zip(prompts, expected):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = hf_model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=None)
        assert tok.decode(out[0, ids.shape[1]:]) == want["completion"]


def test_a_transformers_written_llama_folder_loads_into_smelt(tmp_path):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                                      tie_word_embeddings=False, rope_theta=10000.0)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.self_attn.q_proj.weight.mul_(20.0)
            layer.self_attn.k_proj.weight.mul_(20.0)
    reference.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    model = hf.load_model(tmp_path / "hf")
    weights = hf.HFWeights(tmp_path / "hf")
    for name, offset, shape in [("layers.1.attention.wq.weight", (20, 0), (17, 64)),  # rows across heads
                                ("layers.0.attention.wk.weight", (16, 8), (16, 40)),
                                ("layers.0.feed_forward.w2.weight", (0, 48), (64, 48)), ("norm.weight", (5,), (0,))]:
        full = weights.get(name)
        box = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        assert torch.equal(weights.get_box(name, offset, shape), full[box]), name  # a rank's block, read alone
    ids = torch.randint(0, 100, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - reference(ids).logits).abs().max().item() < 1e-4


def test_configs_smelt_cannot_represent_are_refused_in_one_sentence():
    base = hf.hf_config(model_cfg(100, tie=False), dtype=torch.float32, bos_id=None, eos_id=1, pad_id=None)
    assert hf.model_config(base) == model_cfg(100, tie=False)
    with pytest.raises(ValueError, match="attention_bias"):
        hf.model_config({**base, "attention_bias": True})
    with pytest.raises(ValueError, match="rope scaling"):
        hf.model_config({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="vocabulary holds 100"):
        hf.model_config(base, vocab_size=200)


def train_small(tokens: str, run_dir: str, steps: int = 30) -> str:
    """A tiny Llama trained by smelt's Trainer (one process) on ``tokens``; its run folder."""
    from tasks.config import from_dict
    from tasks.train.config import TrainConfig
    from tasks.train.trainer import Trainer

    cfg = from_dict(TrainConfig, {"steps": steps, "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                                            "ffn_hidden": 128, "max_seq_len": 128},
                                  "data": {"seq_len": 64, "global_batch": 8, "prefetch": 0},
                                  "checkpoint": {"interval_steps": 0, "async_mode": "off"}})
    trainer = Trainer(cfg, {"main": tokens}, run_dir)
    try:
        trainer.train()
    finally:
        trainer.close()
    return run_dir


@pytest.mark.slow
def test_a_trained_model_exports_with_equal_logits_and_generations(tmp_path, tokens):
    from tasks.eval.evaluate import load_model as load_checkpoint

    run = train_small(tokens, str(tmp_path / "run"), steps=12)
    export_checkpoint(run, str(tmp_path / "export"))
    model, _ = load_checkpoint(storage.normalize_url(run) + "/checkpoints/step-00000012")
    ids = torch.tensor([load_tokenizer(tokens).encode("the quick brown fox jumps over the lazy dog and then").ids])
    with torch.no_grad():
        assert (hf_logits(tmp_path / "export", ids) - model(ids)).abs().max().item() < 1e-4
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    for want in probe(model, load_tokenizer(tokens), ["the cat", "a big"], 12):
        prompt = tok(want["prompt"], return_tensors="pt")["input_ids"]
        out = hf_model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=None)
        assert tok.decode(out[0, prompt.shape[1]:]) == want["completion"]


def test_an_unfinished_export_is_refused_as_a_starting_point(tmp_path, tokens):
    vocab = contract.open_dataset(tokens).meta["vocab_size"]
    export_checkpoint(save_checkpoint(sharp_model(model_cfg(vocab, tie=False)), str(tmp_path / "run"), tokens),
                      str(tmp_path / "export"))
    assert hf.local_folder(str(tmp_path / "export")) == tmp_path / "export"
    (tmp_path / "export" / "manifest.json").unlink()  # as if the export had died before its last write
    with pytest.raises(ValueError, match="unfinished smelt export"):
        hf.local_folder(str(tmp_path / "export"))
    with pytest.raises(ValueError, match="no config.json"):
        hf.local_folder(str(tmp_path))
