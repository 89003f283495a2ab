"""Tokenize stage config: every size and threshold with its published default (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenizeConfig:
    """Tokenizer training and token-shard writing.

    The defaults suit the sample crawl (a 4,096-token vocabulary trains in seconds); a production
    run sets ``vocab_size`` to 32k–128k and ``sample_docs`` to a few million.
    """

    # tokenizer training (byte-level BPE)
    vocab_size: int = 4096
    min_frequency: int = 2  # a pair must occur this often to be merged
    sample_docs: int = 20000  # documents streamed into tokenizer training (a seeded, spread-out sample)
    sample_seed: int = 0
    bos_token: str = "<|bos|>"
    eos_token: str = "<|eos|>"
    pad_token: str = "<|pad|>"
    # encoding
    add_bos: bool = False  # also start every document with BOS (EOS always ends one)
    batch_docs: int = 1024  # documents per encode_batch call (and per Parquet read batch)
    val_fraction: float = 0.05  # share of documents, chosen by a hash of the document id, held out
    val_seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + 3:
            raise ValueError(f"tokenize.vocab_size ({self.vocab_size}) must be at least 259: 256 bytes plus BOS, EOS, PAD")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"tokenize.val_fraction ({self.val_fraction}) must be in [0, 1)")
        if self.sample_docs < 1 or self.batch_docs < 1 or self.min_frequency < 1:
            raise ValueError("tokenize.sample_docs, tokenize.batch_docs and tokenize.min_frequency must be at least 1")
        if len({self.bos_token, self.eos_token, self.pad_token}) != 3:
            raise ValueError("tokenize.bos_token, eos_token and pad_token must be three different strings")
