"""Verification: a candidate pair is kept only if its similarity reaches the threshold.

Modes (``DedupConfig.verify``): ``jaccard`` computes the exact Jaccard similarity of the two
documents' shingle-hash sets; ``signature`` estimates it as the share of equal MinHash values
(standard error √(s(1−s)/P), about 0.035 at s = 0.8 with 128 permutations, so pairs near the
threshold fall either way); ``none`` keeps every candidate (plain LSH, as datatrove does).

A pair that collides in several bands reaches several buckets; it is judged only where its
band is the *first* band in which the two signatures are equal, so each pair is counted and
verified once without a second shuffle. A pair with no equal band met only through a band-key
hash collision and is dropped.

Documents are addressed by ``doc = input shard << 32 | row``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tasks.dedup.store import NpyFile, RaggedFile

ROW_BITS = np.uint64(32)


def doc_key(shard: int, rows: np.ndarray) -> np.ndarray:
    return (np.uint64(shard) << ROW_BITS) | rows.astype(np.uint64)


def split_doc(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of document keys."""
    return (docs >> ROW_BITS).astype(np.int64), (docs & np.uint64(0xFFFFFFFF)).astype(np.int64)


@dataclasses.dataclass
class SignatureStore:
    """Signatures (and shingle sets, for ``jaccard``) of every input shard, read by document."""

    signature_urls: list[str]
    shingle_urls: list[str] | None = None

    def _by_shard(self, docs: np.ndarray):
        """(shard, positions in ``docs``, rows) for each shard the documents live in."""
        if len(docs) == 0:
            return
        shards, rows = split_doc(docs)
        order = np.argsort(shards, kind="stable")
        bounds = np.flatnonzero(np.r_[True, shards[order][1:] != shards[order][:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            where = order[lo:hi]
            yield int(shards[where[0]]), where, rows[where]

    def signatures(self, docs: np.ndarray) -> np.ndarray:
        """(len(docs), P) signatures, in the order of ``docs``."""
        parts = [(where, NpyFile(self.signature_urls[s]).rows(rows)) for s, where, rows in self._by_shard(docs)]
        if not parts:
            return np.zeros((0, 0), dtype=np.uint64)
        out = np.empty((len(docs), parts[0][1].shape[1]), dtype=parts[0][1].dtype)
        for where, values in parts:
            out[where] = values
        return out

    def shingle_sets(self, docs: np.ndarray) -> list[np.ndarray]:
        if self.shingle_urls is None:
            raise ValueError("shingle sets were not stored; exact Jaccard needs dedup.verify = 'jaccard'")
        out: list[np.ndarray] = [np.zeros(0)] * len(docs)
        for shard, where, rows in self._by_shard(docs):
            for i, values in zip(where, RaggedFile(self.shingle_urls[shard]).rows(rows)):
                out[i] = values
        return out


def first_equal_band(sig_a: np.ndarray, sig_b: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Index of the first band where each pair's signatures agree, or -1 where none does."""
    n = len(sig_a)
    banded_a = sig_a[:, : bands * rows].reshape(n, bands, rows)
    banded_b = sig_b[:, : bands * rows].reshape(n, bands, rows)
    equal = (banded_a == banded_b).all(axis=2)  # (pairs, bands)
    return np.where(equal.any(axis=1), equal.argmax(axis=1), -1)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    return (sig_a == sig_b).mean(axis=1)


def exact_jaccard(sets_a: list[np.ndarray], sets_b: list[np.ndarray]) -> np.ndarray:
    """Jaccard similarity of pairs of sorted, duplicate-free arrays, vectorised over pairs."""
    n = len(sets_a)
    if n == 0:
        return np.zeros(0)
    size_a = np.fromiter(map(len, sets_a), np.int64, n)
    size_b = np.fromiter(map(len, sets_b), np.int64, n)
    values = np.concatenate([v for pair in zip(sets_a, sets_b) for v in pair])
    pair = np.repeat(np.arange(n, dtype=np.uint64), size_a + size_b)
    if values.dtype == np.uint32:  # one sort of (pair, value) packed in 64 bits beats a lexsort
        packed = np.sort((pair << np.uint64(32)) | values.astype(np.uint64))
        values, pair = packed & np.uint64(0xFFFFFFFF), packed >> np.uint64(32)
    else:
        order = np.lexsort((values, pair))
        values, pair = values[order], pair[order]
    shared = (values[1:] == values[:-1]) & (pair[1:] == pair[:-1])
    pair = pair.astype(np.int64)
    intersection = np.bincount(pair[1:][shared], minlength=n)
    union = size_a + size_b - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


def similarity(store: SignatureStore, a: np.ndarray, b: np.ndarray, mode: str, chunk: int = 2048) -> np.ndarray:
    """Similarity of document pairs as the verification mode measures it.

    ``chunk`` pairs at a time: exact Jaccard sorts every shingle of a chunk's pairs (~50 B of
    working memory per shingle), so this bounds the memory of a bucket however many pairs it has.
    """
    out = np.zeros(len(a))
    for lo in range(0, len(a), chunk):
        pa, pb = a[lo : lo + chunk], b[lo : lo + chunk]
        if mode == "jaccard":
            out[lo : lo + chunk] = exact_jaccard(store.shingle_sets(pa), store.shingle_sets(pb))
        else:
            out[lo : lo + chunk] = estimated_jaccard(store.signatures(pa), store.signatures(pb))
    return out


def verify_pairs(
    store: SignatureStore,
    a: np.ndarray,
    b: np.ndarray,
    band: np.ndarray,
    *,
    bands: int,
    rows: int,
    threshold: float,
    mode: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(a, b, similarity) of pairs that pass, and the number of distinct candidates judged here."""
    if len(a) == 0:
        return a, b, np.zeros(0), 0
    docs, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    signatures = store.signatures(docs)
    sig_a, sig_b = signatures[inverse[: len(a)]], signatures[inverse[len(a) :]]
    judged_here = first_equal_band(sig_a, sig_b, bands, rows) == band.astype(np.int64)
    a, b = a[judged_here], b[judged_here]
    if mode == "jaccard":
        sims = similarity(store, a, b, mode)
    else:
        sims = estimated_jaccard(sig_a[judged_here], sig_b[judged_here])
    keep = sims >= threshold if mode != "none" else np.ones(len(a), dtype=bool)
    return a[keep], b[keep], sims[keep], int(judged_here.sum())
