"""Exact-duplicate key: a 128-bit hash of the normalised text.

128 bits because at 10⁹ documents a 64-bit key would give a few percent chance of merging two
different documents somewhere in the corpus; 128 bits make that impossible in practice.
"""

from __future__ import annotations

import hashlib

import numpy as np


def exact_keys(normalized_texts: list[str]) -> np.ndarray:
    """``(n, 2)`` uint64 exact keys of already-normalised texts."""
    blob = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in normalized_texts)
    return np.frombuffer(blob, dtype="<u8").reshape(-1, 2).astype(np.uint64)

