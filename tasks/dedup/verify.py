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

from tasks.dedup.lsh import band_keys
from tasks.dedup.store import NpyFile, RaggedFile, ragged_index, read_npy

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
    # Each shard's shingle offsets once read (8 B per document): a bucket needs them for every read.
    _offsets: dict[int, np.ndarray] = dataclasses.field(default_factory=dict, repr=False, compare=False)

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

    def shingles(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, offsets): the shingle hashes of sorted documents (as ``np.unique`` returns
        them), concatenated; document i's are ``values[offsets[i]:offsets[i+1]]``."""
        if self.shingle_urls is None:
            raise ValueError("shingle sets were not stored; exact Jaccard needs dedup.verify = 'jaccard'")
        values, sizes = [np.zeros(0, np.uint32)], [np.zeros(0, np.int64)]
        for shard, _, rows in self._by_shard(docs):
            url = self.shingle_urls[shard]
            if shard not in self._offsets:
                self._offsets[shard] = read_npy(url + ".offsets.npy")
            v, n = RaggedFile(url, self._offsets[shard]).rows(rows)
            values.append(v)
            sizes.append(n)
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(sizes), out=offsets[1:])
        return np.concatenate(values), offsets


def first_equal_band(signatures: np.ndarray, a: np.ndarray, b: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Index of the first band where the signatures of documents ``a[i]`` and ``b[i]`` (rows of
    ``signatures``) agree, or -1 where none does.

    Compares band keys (bands values per pair instead of bands × rows), then confirms each pair's
    first equal key against the values themselves, so a key collision never counts as a band.
    """
    keys = band_keys(signatures, bands, rows)
    equal = keys[a] == keys[b]  # (pairs, bands)
    first = np.full(len(a), -1, dtype=np.int64)
    pending = np.flatnonzero(equal.any(axis=1))
    columns = np.arange(rows)
    while len(pending):
        band = equal[pending].argmax(axis=1)
        cols = band[:, None] * rows + columns
        same = (signatures[a[pending, None], cols] == signatures[b[pending, None], cols]).all(axis=1)
        first[pending[same]] = band[same]
        collided, band = pending[~same], band[~same]
        equal[collided, band] = False
        pending = collided[equal[collided].any(axis=1)]
    return first


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    return (sig_a == sig_b).mean(axis=1)


def exact_jaccard(values: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Jaccard similarity of the distinct values of documents ``a[i]`` and ``b[i]`` of a ragged
    array (document d's values are ``values[offsets[d]:offsets[d+1]]``, in any order, repeats
    allowed), vectorised over pairs: one sort of (pair, value, side) and counts of what differs."""
    n = len(a)
    if n == 0:
        return np.zeros(0)
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    sizes = np.concatenate([offsets[a + 1] - offsets[a], offsets[b + 1] - offsets[b]])
    taken = values[ragged_index(np.concatenate([offsets[a], offsets[b]]), sizes)]
    if values.dtype.itemsize <= 4:  # (pair, value, side) packed in 64 bits: one sort beats a lexsort
        label = np.arange(n + 1, dtype=np.uint64) << np.uint64(33)
        key = taken.astype(np.uint64)
        key <<= np.uint64(1)
        key |= np.repeat(np.concatenate([label[:-1], label[:-1] | np.uint64(1)]), sizes)
        key.sort()
        change = key[1:] ^ key[:-1]  # 0: a repeat; 1: the same value on the other side; more: a new value
        bounds = np.searchsorted(key, label)  # each pair's range of keys
        new_value = np.flatnonzero(np.r_[True, change != 0])
        on_both_sides = np.flatnonzero(change == 1) + 1
        distinct = np.diff(np.searchsorted(new_value, bounds))
        intersection = np.diff(np.searchsorted(on_both_sides, bounds))
    else:
        pair = np.repeat(np.tile(np.arange(n, dtype=np.int64), 2), sizes)
        side = np.repeat(np.repeat(np.array([0, 1], dtype=np.int8), n), sizes)
        order = np.lexsort((side, taken, pair))
        pair, taken, side = pair[order], taken[order], side[order]
        same_value = (pair[1:] == pair[:-1]) & (taken[1:] == taken[:-1])
        new_value = np.r_[True, ~same_value | (side[1:] != side[:-1])]
        pair, taken = pair[new_value], taken[new_value]
        both = (pair[1:] == pair[:-1]) & (taken[1:] == taken[:-1])
        intersection = np.bincount(pair[1:][both], minlength=n)
        distinct = np.bincount(pair, minlength=n)
    union = distinct - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


def similarity(
    store: SignatureStore, a: np.ndarray, b: np.ndarray, mode: str, chunk: int = 2048, read_chunk: int = 8192
) -> np.ndarray:
    """Similarity of document pairs as the verification mode measures it.

    ``read_chunk`` pairs at a time, their documents' shingles (or signatures) are read, each once
    and one read per shard; exact Jaccard then sorts ``chunk`` pairs' shingles at a time (~50 B of
    working memory per shingle). Both bound a bucket's memory however many pairs it has.
    """
    out = np.zeros(len(a))
    for lo in range(0, len(a), read_chunk):
        hi = min(lo + read_chunk, len(a))
        docs, inverse = np.unique(np.concatenate([a[lo:hi], b[lo:hi]]), return_inverse=True)
        ia, ib = np.split(inverse, 2)
        if mode != "jaccard":
            signatures = store.signatures(docs)
            out[lo:hi] = estimated_jaccard(signatures[ia], signatures[ib])
            continue
        values, offsets = store.shingles(docs)
        for start in range(0, hi - lo, chunk):
            part = slice(start, start + chunk)
            out[lo + start : lo + start + len(ia[part])] = exact_jaccard(values, offsets, ia[part], ib[part])
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
    ia, ib = np.split(inverse, 2)
    judged_here = first_equal_band(signatures, ia, ib, bands, rows) == band.astype(np.int64)
    a, b = a[judged_here], b[judged_here]
    if mode == "jaccard":
        sims = similarity(store, a, b, mode)
    else:
        sims = estimated_jaccard(signatures[ia[judged_here]], signatures[ib[judged_here]])
    keep = sims >= threshold if mode != "none" else np.ones(len(a), dtype=bool)
    return a[keep], b[keep], sims[keep], int(judged_here.sum())
