"""Phase 1, one work item per input shard: texts → exact keys, MinHash signatures, shingle sets and
the shard's shuffle records.

Texts stream in row groups of ``text_batch`` documents; each batch is normalised to bytes, keyed
and shingled as a whole (``minhash.shard_shingle_hashes``), so memory grows with the batch and
the shard's signatures (P values per document), never with the shard's text. Files, under
``_work/signatures/``: ``sigs-NNNNN.npy`` (D × P), ``shingles-NNNNN{,.offsets}.npy`` (for
``verify = "jaccard"``) and ``records-NNNNN.shf`` (exact and band-key records, shuffle.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from tasks import datasets
from tasks.datasets import ShardResult, Stats
from tasks.dedup.config import DedupConfig
from tasks.dedup.exact import exact_keys
from tasks.dedup.lsh import band_keys
from tasks.dedup.minhash import MinHasher, shard_shingle_hashes
from tasks.dedup.normalize import Words, spaced_bytes
from tasks.dedup.plan import DedupPlan, document_batches, write_npy
from tasks.dedup.shuffle import EXACT_BAND, RECORD, write_partitioned
from tasks.dedup.verify import doc_key


def _unique_sets(hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per document, its shingle hashes sorted and without repeats; returns (values, counts)."""
    n_docs = len(offsets) - 1
    doc = np.repeat(np.arange(n_docs, dtype=np.uint64), np.diff(offsets))
    if hashes.dtype == np.uint32:  # one sort of (doc, hash) packed in 64 bits beats a lexsort 4×
        packed = np.sort((doc << np.uint64(32)) | hashes.astype(np.uint64))
        values, doc = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32), packed >> np.uint64(32)
    else:
        order = np.lexsort((hashes, doc))
        values, doc = hashes[order], doc[order]
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = (values[1:] != values[:-1]) | (doc[1:] != doc[:-1])
    return values[keep], np.bincount(doc[keep].astype(np.int64), minlength=n_docs)


@dataclasses.dataclass
class ShardHashes:
    """What phase 1 computes for one shard's texts."""

    signatures: np.ndarray  # (D, P)
    exact: np.ndarray  # (D, 2) uint64 exact keys
    has_shingles: np.ndarray  # (D,) bool
    set_values: np.ndarray  # concatenated distinct shingle hashes (verify = "jaccard" only)
    set_offsets: np.ndarray  # (D + 1,)
    null_texts: int  # texts that were missing (treated as empty)


def hash_texts(batches: Iterable[list[str | None]], cfg: DedupConfig) -> ShardHashes:
    """Normalise, key, shingle and sign texts, one batch at a time."""
    hasher = MinHasher(cfg.num_perm, cfg.seed, cfg.scheme, cfg.signature_batch)
    hash_dtype = np.uint32 if hasher.bits == 32 else np.uint64
    # Each list starts with an empty array so a shard without documents concatenates cleanly.
    signatures = [np.zeros((0, cfg.num_perm), hasher.dtype)]
    exact = [np.zeros((0, 2), np.uint64)]
    counts, set_counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    set_values = [np.zeros(0, hash_dtype)]
    nulls = 0
    for texts in batches:
        nulls += sum(t is None for t in texts)
        words = Words.of([spaced_bytes(t or "") for t in texts])
        exact.append(exact_keys(words.normalized()))
        hashes, offsets = shard_shingle_hashes(words, cfg.ngram, hasher.bits)
        signatures.append(hasher.signatures(hashes, offsets))
        counts.append(np.diff(offsets))
        if cfg.verify == "jaccard":
            values, per_doc = _unique_sets(hashes, offsets)
            set_values.append(values)
            set_counts.append(per_doc)
    per_doc_counts = np.concatenate(counts)
    set_offsets = np.zeros(len(per_doc_counts) + 1, dtype=np.int64)
    if cfg.verify == "jaccard":
        np.cumsum(np.concatenate(set_counts), out=set_offsets[1:])
    return ShardHashes(np.concatenate(signatures), np.concatenate(exact), per_doc_counts > 0,
                       np.concatenate(set_values), set_offsets, nulls)


def shuffle_records(shard: int, hashed: ShardHashes, bands: int, rows_per_band: int) -> np.ndarray:
    """One exact record and one record per band for every document that has shingles."""
    rows = np.flatnonzero(hashed.has_shingles)
    docs = doc_key(shard, rows)
    exact = hashed.exact[rows]
    keys = band_keys(hashed.signatures[rows], bands, rows_per_band)  # (docs, bands)
    records = np.zeros(len(rows) * (bands + 1), dtype=RECORD)
    exact_part, band_part = records[: len(rows)], records[len(rows) :]
    exact_part["key"], exact_part["tag"] = exact[:, 0], exact[:, 1]
    exact_part["doc"], exact_part["band"] = docs, EXACT_BAND
    band_part["key"] = keys.ravel()
    band_part["tag"] = np.repeat(exact[:, 0], bands)
    band_part["doc"] = np.repeat(docs, bands)
    band_part["band"] = np.tile(np.arange(bands, dtype=np.uint16), len(rows))
    return records


def sign_shard(plan: DedupPlan, shard: int) -> ShardResult:
    """Phase 1 for input shard ``shard``."""
    url = plan.work("signatures")

    def work() -> ShardResult:
        batches = (b.column(0).to_pylist() for b in document_batches(plan, shard, ["text"], plan.cfg.text_batch))
        hashed = hash_texts(batches, plan.cfg)
        records = shuffle_records(shard, hashed, plan.bands, plan.rows)
        written = [
            write_npy(url, f"sigs-{shard:05d}.npy", hashed.signatures),
            datasets.write_shard(
                url, f"records-{shard:05d}.shf", lambda f: write_partitioned(f, records, plan.num_buckets)
            ),
        ]
        if plan.cfg.verify == "jaccard":
            written.append(write_npy(url, f"shingles-{shard:05d}.npy", hashed.set_values))
            written.append(write_npy(url, f"shingles-{shard:05d}.offsets.npy", hashed.set_offsets))
        stats = Stats({
            "dedup.null_text": hashed.null_texts,
            "dedup.no_shingles": int(len(hashed.has_shingles) - hashed.has_shingles.sum()),
        })
        return ShardResult(written, stats)

    return datasets.run_shard(url, f"shard-{shard:05d}", work)
