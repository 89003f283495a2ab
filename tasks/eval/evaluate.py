"""Score a checkpoint on held-out tokens: loss, perplexity, bits per byte per split beside compression
baselines on the same bytes, plus samples continuing the held-out text.

Runs in one process without torch.distributed: the checkpoint is consolidated from whatever mesh
trained it (``tasks/checkpoint_reader.py``) into a plain state dict.

Bits per byte makes models with different tokenizers comparable: the summed loss (nats) over the
scored tokens divided by ``ln 2`` times the UTF-8 bytes those tokens decode to. The same bytes are
handed to xz, zstd and zlib (``baselines.py``), so the model and the compressors are measured on
one text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

from tasks import contract, storage
from tasks.checkpoint_reader import load_consolidated, resolve, run_dir_of, step_of, verify_checkpoint
from tasks.eval.baselines import COMPRESSORS, compressed_bits_per_byte
from tasks.eval.config import EvalConfig
from tasks.eval.samples import complete, validation_samples
from tasks.llama import Transformer, rope_tables
from tasks.model_config import ModelConfig
from tasks.token_shards import TokenStream

log = logging.getLogger(__name__)


def load_model(step_url: str) -> tuple[Transformer, dict]:
    """The trained model in fp32 on CPU, and the checkpoint's manifest meta."""
    state, meta = load_consolidated(step_url)
    model_cfg = ModelConfig(**meta["model"])
    with torch.device("meta"):
        model = Transformer(model_cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()}, assign=True, strict=True)
    # The rotary table is not saved (a non-persistent buffer): recompute it on the real device.
    model.rope = rope_tables(model_cfg.head_dim, model_cfg.max_seq_len, model_cfg.rope_theta)
    return model.eval(), meta


@torch.no_grad()
def score(model: Transformer, stream: TokenStream, seq_len: int, batch_size: int, max_tokens: int) -> dict:
    """Mean next-token loss over consecutive windows of the stream (each token a target once)."""
    windows = min(stream.samples, max(1, max_tokens // seq_len))
    nll, count = 0.0, 0
    buf = np.empty((batch_size, seq_len + 1), dtype=np.int64)
    for first in range(0, windows, batch_size):
        n = min(batch_size, windows - first)
        for j in range(n):
            stream.read((first + j) * seq_len, seq_len + 1, buf[j])
        batch = torch.from_numpy(buf[:n])
        logits = model(batch[:, :-1])
        nll += F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum").item()
        count += n * seq_len
    return {"nll_sum": nll, "tokens": count, "windows": windows}


def scored_text(stream: TokenStream, tokenizer, tokens: int) -> bytes:
    """The UTF-8 text the scored targets decode to: stream tokens ``1 … tokens`` (``score`` reads
    consecutive windows, so token 0 is context only); special tokens decode to nothing."""
    ids = np.empty(tokens + 1, dtype=np.int64)
    stream.read(0, tokens + 1, ids)
    return tokenizer.decode(ids[1:].tolist(), skip_special_tokens=True).encode()


@torch.no_grad()
def probe(model: Transformer, tokenizer, prompts: list[str], new_tokens: int) -> list[dict]:
    """Greedy continuations of the given prompts (``eval.probe_prompts``), ``new_tokens`` each."""
    out = []
    for prompt in prompts:
        ids = complete(model, tokenizer.encode(prompt).ids, new_tokens)
        out.append({"prompt": prompt, "completion": tokenizer.decode(ids)})
    return out


def checkpoint_identity(step_url: str) -> dict | None:
    """What makes a checkpoint itself: its run folder, step, manifest fingerprint and every file's
    recorded size and checksum. None if it is no longer committed (retention removed it)."""
    step_url = storage.normalize_url(step_url)
    if verify_checkpoint(step_url, checksums=False):
        return None
    manifest = contract.read_manifest(step_url)
    files = contract.canonical_json([dataclasses.asdict(s) for s in manifest.shards])
    return {
        "run": run_dir_of(step_url),
        "step": manifest.meta["step"] if "step" in manifest.meta else step_of(step_url),
        "fingerprint": manifest.fingerprint,
        "files": hashlib.sha256(files.encode()).hexdigest(),
    }


def split_weights(names: list[str], mixture: dict[str, float]) -> dict[str, float]:
    """Normalized weights of the scored splits: the run's training mixture, else equal shares."""
    raw = {n: float(mixture.get(n, 0.0)) for n in names} if mixture and all(n in mixture for n in names) \
        else {n: 1.0 for n in names}
    total = sum(raw.values())
    return {n: w / total for n, w in raw.items()}


def score_split(model: Transformer, tokens_url: str, tokenizer, seq_len: int, cfg: EvalConfig) -> dict:
    """One validation split: loss, perplexity and bits per byte, the compressors' bits per byte on the
    same bytes, and samples continuing its first documents."""
    stream = TokenStream(tokens_url, cfg.split, seq_len, cache_dir=None)
    try:
        scored = score(model, stream, seq_len, cfg.batch_size, cfg.max_tokens)
        text = scored_text(stream, tokenizer, scored["tokens"])
        samples = validation_samples(model, tokenizer, stream, cfg.samples, seq_len)
    finally:
        stream.close()
    loss = scored["nll_sum"] / scored["tokens"]
    return {
        "data": tokens_url,
        "val_loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": scored["nll_sum"] / (math.log(2) * max(1, len(text))),
        "baselines": compressed_bits_per_byte(text),
        "tokens_scored": scored["tokens"],
        "bytes_scored": len(text),
        "samples": samples,
    }


def evaluate_checkpoint(checkpoint_url: str, data: dict[str, str] | None, cfg: EvalConfig) -> dict:
    """Validation loss, perplexity and bits per byte of a checkpoint on every validation split.

    ``data`` maps a split name to a tokens dataset (default: every dataset the run trained on, by
    its name there). Each split is scored on its own; the top-level figures are their
    mixture-weighted total (the run's training mixture, or equal weights).
    """
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _evaluate(checkpoint_url, data, cfg)
    finally:
        torch.set_num_threads(threads)


def _evaluate(checkpoint_url: str, data: dict[str, str] | None, cfg: EvalConfig) -> dict:
    from tasks.tokenizer_files import load_tokenizer

    start = time.perf_counter()
    step_url = resolve(checkpoint_url)
    model, meta = load_model(step_url)
    data = dict(sorted((data or meta["data"]).items()))
    seq_len = cfg.seq_len or meta["seq_len"]
    tokenizer = load_tokenizer(next(iter(data.values())))
    splits = {name: score_split(model, url, tokenizer, seq_len, cfg) for name, url in data.items()}
    train_cfg = (contract.read_manifest(step_url).lineage.get("config") or {})
    weights = split_weights(list(splits), (train_cfg.get("data") or {}).get("mixture") or {})
    for name, result in splits.items():
        result["weight"] = weights[name]
    loss = sum(weights[n] * s["val_loss"] for n, s in splits.items())
    return {
        "checkpoint": step_url,
        "run": run_dir_of(step_url),
        "step": meta["step"],
        "tokens": meta.get("tokens"),
        "data": data,
        "split": cfg.split,
        "val_loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": sum(weights[n] * s["bits_per_byte"] for n, s in splits.items()),
        "baselines": {c: sum(weights[n] * s["baselines"][c] for n, s in splits.items()) for c in COMPRESSORS},
        "tokens_scored": sum(s["tokens_scored"] for s in splits.values()),
        "bytes_scored": sum(s["bytes_scored"] for s in splits.values()),
        "splits": splits,
        "probes": probe(model, tokenizer, cfg.probe_prompts, cfg.probe_tokens) if cfg.probe_prompts else [],
        "seconds": round(time.perf_counter() - start, 2),
        "config": asdict(cfg),
    }
