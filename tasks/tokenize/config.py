"""Tokenize stage config: every size and threshold with its published default (no heavy imports).

Two sections for two stages, so each stage's fingerprint covers what changes its output:
``[tokenizer]`` trains the vocabulary (and names its special tokens), ``[tokenize]`` encodes
documents with it (changing the encode batch size never retrains the tokenizer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class SpecialTokens:
    """Names of the special tokens: a tokenizer trained here creates them (ids 0, 1, 2); encoding
    looks them up in whichever tokenizer it is given."""

    bos_token: str = "<|bos|>"
    eos_token: str = "<|eos|>"
    pad_token: str = "<|pad|>"

    def __post_init__(self) -> None:
        if len({self.bos_token, self.eos_token, self.pad_token}) != 3:
            raise ValueError("tokenizer.bos_token, eos_token and pad_token must be three different strings")


@dataclass
class TokenizerConfig(SpecialTokens):
    """Byte-level BPE training, plus the special tokens' names (``SpecialTokens``).

    The defaults suit the sample crawl (a 4,096-token vocabulary trains in seconds); a production
    run sets ``vocab_size`` to 32k–128k and ``sample_docs`` to a few million.
    """

    vocab_size: int = 4096
    min_frequency: int = 2  # a pair must occur this often to be merged
    sample_docs: int = 20000  # documents streamed into tokenizer training (a seeded, spread-out sample)
    sample_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 256 + 3:
            raise ValueError(f"tokenizer.vocab_size ({self.vocab_size}) must be at least 259: 256 bytes plus BOS, EOS, PAD")
        if self.sample_docs < 1 or self.min_frequency < 1:
            raise ValueError("tokenizer.sample_docs and tokenizer.min_frequency must be at least 1")

    def special(self) -> SpecialTokens:
        """The special tokens' names alone: what encoding needs of this section."""
        return SpecialTokens(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SpecialTokens)})


@dataclass
class TokenizeConfig:
    """Encoding documents into token shards with a held-out validation split."""

    add_bos: bool = False  # also start every document with BOS (EOS always ends one)
    batch_docs: int = 1024  # documents per encode_batch call (and per Parquet read batch)
    val_fraction: float = 0.05  # share of documents, chosen by a hash of the document id, held out
    val_seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"tokenize.val_fraction ({self.val_fraction}) must be in [0, 1)")
        if self.batch_docs < 1:
            raise ValueError("tokenize.batch_docs must be at least 1")
