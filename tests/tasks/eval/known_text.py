"""A held-out split of known documents, tokenized by a real byte-level BPE tokenizer, for eval tests."""

from __future__ import annotations

import numpy as np

from tasks import contract
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.tokenize.config import TokenizerConfig
from tasks.tokenize.tokenizer import build_tokenizer
from tasks.token_shards import write_token_shard

DOCS = ["The cat sat on the mat, and then the cat ran under the big red tree. " * 6,
        "def main(argv):\n    return run(argv[1:], verbose=True)\n" * 5,
        "A quick brown fox jumps over the lazy dog; the dog does not move at all. " * 6]


def known_tokens(url: str, docs: list[str] = DOCS):
    """(tokenizer, token stream): a tokens dataset at ``url`` whose val split is ``docs``, each ended
    by EOS, as the tokenize stage writes it."""
    tokenizer = build_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), iter([DOCS]))
    eos = tokenizer.token_to_id("<|eos|>")
    ids = [tokenizer.encode(doc).ids + [eos] for doc in docs]
    stream = np.concatenate([np.array(d, dtype="<u2") for d in ids])
    starts = np.cumsum([0] + [len(d) for d in ids[:-1]])
    shards = write_token_shard(url, "val-00000", "val", stream, starts)
    meta = {"dtype": "uint16", "vocab_size": tokenizer.get_vocab_size(), "eos_id": eos, "bos_id": None, "pad_id": None}
    contract.commit(url, "tokens", "known-text", shards, {"tokens": len(stream)}, meta=meta)
    return tokenizer, stream


def small_model(vocab: int, seed: int = 0) -> Transformer:
    model = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=vocab,
                                    max_seq_len=64))
    model.init_weights(seed=seed)
    return model.eval()
