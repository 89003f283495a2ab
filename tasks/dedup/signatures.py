"""Phase 1, one work item per input shard: texts → exact keys, MinHash signatures, shingle hashes
and the shard's shuffle records.

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

from tasks import contract
from tasks.contract import ShardResult
from tasks.counters import Stats
from tasks.dedup.config import DedupConfig
from tasks.dedup.exact import exact_keys
from tasks.dedup.lsh import band_keys
from tasks.dedup.minhash import MinHasher, shard_shingle_hashes
from tasks.dedup.normalize import Words
from tasks.dedup.plan import DedupPlan, document_batches, write_npy
from tasks.dedup.shuffle import EXACT_BAND, RECORD, write_partitioned
from tasks.dedup.verify import doc_key


@dataclasses.dataclass
class ShardHashes:
    """What phase 1 computes for one shard's texts."""

    signatures: np.ndarray  # (D, P)
    exact: np.ndarray  # (D, 2) uint64 exact keys
    shingles: np.ndarray  # concatenated shingle hashes in document order (verify = "jaccard" only)
    offsets: np.ndarray  # (D + 1,) document d's shingles are shingles[offsets[d]:offsets[d+1]]
    null_texts: int  # texts that were missing (treated as empty)

    @property
    def has_shingles(self) -> np.ndarray:
        return self.offsets[1:] > self.offsets[:-1]


def hash_texts(batches: Iterable, cfg: DedupConfig) -> ShardHashes:
    """Normalise, key, shingle and sign texts (pyarrow string arrays), one batch at a time.

    The shingle hashes are kept as they come, repeats included: verification counts distinct
    values, so sorting each document's set here would only repeat work (it was 7% of the stage).
    """
    hasher = MinHasher(cfg.num_perm, cfg.seed, cfg.scheme, cfg.signature_batch)
    hash_dtype = np.uint32 if hasher.bits == 32 else np.uint64
    # Each list starts with an empty array so a shard without documents concatenates cleanly.
    signatures = [np.zeros((0, cfg.num_perm), hasher.dtype)]
    exact = [np.zeros((0, 2), np.uint64)]
    counts = [np.zeros(0, np.int64)]
    shingles = [np.zeros(0, hash_dtype)]
    nulls = 0
    for texts in batches:
        nulls += texts.null_count
        words = Words.of_arrow(texts)
        exact.append(exact_keys(words.normalized()))
        hashes, offsets = shard_shingle_hashes(words, cfg.ngram, hasher.bits)
        signatures.append(hasher.signatures(hashes, offsets))
        counts.append(np.diff(offsets))
        if cfg.verify == "jaccard":
            shingles.append(hashes)
    per_doc = np.concatenate(counts)
    offsets = np.zeros(len(per_doc) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=offsets[1:])
    return ShardHashes(np.concatenate(signatures), np.concatenate(exact), np.concatenate(shingles), offsets, nulls)


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
        batches = (b.column(0) for b in document_batches(plan, shard, ["text"], plan.cfg.text_batch))
        hashed = hash_texts(batches, plan.cfg)
        records = shuffle_records(shard, hashed, plan.bands, plan.rows)
        written = [
            write_npy(url, f"sigs-{shard:05d}.npy", hashed.signatures),
            contract.write_shard(
                url, f"records-{shard:05d}.shf", lambda f: write_partitioned(f, records, plan.num_buckets)
            ),
        ]
        if plan.cfg.verify == "jaccard":
            written.append(write_npy(url, f"shingles-{shard:05d}.npy", hashed.shingles))
            written.append(write_npy(url, f"shingles-{shard:05d}.offsets.npy", hashed.offsets))
        stats = Stats({
            "dedup.null_text": hashed.null_texts,
            "dedup.no_shingles": int(len(hashed.has_shingles) - hashed.has_shingles.sum()),
        })
        return ShardResult(written, stats)

    return contract.run_shard(url, f"shard-{shard:05d}", work)
