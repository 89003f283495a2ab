"""A small learnable tokens dataset for trainer tests, written in the tasks/contract.py record format.

Documents are arithmetic sequences mod ``vocab`` (random start, stride 1..4) ended by EOS, so a
tiny model's loss falls quickly and visibly.
"""

from __future__ import annotations

import io

import numpy as np

from tasks import contract, storage

EOS = 0


def make_corpus(url: str, *, tokens: int = 40_000, vocab: int = 256, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < tokens:
        length = int(rng.integers(20, 120))
        start, stride = int(rng.integers(1, vocab)), int(rng.integers(1, 5))
        body = 1 + (start + stride * np.arange(length)) % (vocab - 1)  # never EOS
        docs.append(np.append(body, EOS))
        total += length + 1
    stream = np.concatenate(docs).astype("<u2")
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]]).astype(np.int64)

    def write_bin(f):
        f.write(stream.tobytes())
        return len(stream)

    def write_idx(f):
        buf = io.BytesIO()
        np.save(buf, starts)
        f.write(buf.getvalue())
        return len(starts)

    shards = [
        contract.write_shard(url, "train-00000.bin", write_bin, split="train", tokens=len(stream), docs=len(docs),
                             dtype="uint16"),
        contract.write_shard(url, "train-00000.idx", write_idx, split="train", tokens=0, docs=len(docs),
                             dtype="int64"),
    ]
    meta = {"dtype": "uint16", "vocab_size": vocab, "eos_id": EOS, "bos_id": None, "pad_id": None}
    contract.commit(url, "tokens", f"corpus-{seed}", shards, {"tokens": len(stream), "docs": len(docs)}, meta=meta)
    return storage.normalize_url(url)


# The run the two-rank trainer tests start from: the tiny model sharded over two ranks (FSDP), a checkpoint every
# two steps; each test sets its own step count and faults.
TWO_RANKS = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8},
    "parallel": {"dp_shard": 2},
    "checkpoint": {"interval_steps": 2},
}

# The one-process run the resume tests start from (8 sequences of 16 tokens a step, no prefetch). The clip below the
# natural gradient norm makes every step depend on the restored optimizer and on the global norm being right across
# shards and stages.
RESUME_RUN = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
}
