"""Exact-duplicate key: a 128-bit hash (xxh3-128) of the normalised text.

128 bits because at 10⁹ documents a 64-bit key would give a few percent chance of merging two
different documents somewhere in the corpus; 128 bits make that impossible in practice. xxh3
rather than BLAKE2b: the key guards against accidents, not adversaries, and hashes ~5× faster.
"""

from __future__ import annotations

import numpy as np
import xxhash


def exact_keys(normalized_texts: list) -> np.ndarray:
    """``(n, 2)`` uint64 exact keys of normalised UTF-8 texts (bytes or views: ``normalize.Words.normalized``)."""
    blob = b"".join(map(xxhash.xxh3_128_digest, normalized_texts))
    return np.frombuffer(blob, dtype="<u8").reshape(-1, 2).astype(np.uint64)
