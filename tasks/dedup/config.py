"""Dedup settings, every threshold and size with its published default (no heavy imports here)."""

from __future__ import annotations

import dataclasses

SCHEMES = ("affine32", "affine64", "legacy")
VERIFY_MODES = ("jaccard", "signature", "none")


@dataclasses.dataclass
class DedupConfig:
    """Exact + MinHash LSH near-duplicate removal.

    ``bands``/``rows`` of 0 mean "choose them": the (bands, rows) that minimise the weighted
    false-positive/false-negative areas (as datasketch does) among those whose probability of
    making a pair at exactly ``threshold`` a candidate is at least ``1 - max_miss_at_threshold``.
    The area objective alone lets real duplicates slip: datasketch's choice for 0.8 (9 × 13)
    catches a pair at Jaccard 0.8 only 40% of the time. Candidates are verified afterwards, so
    extra candidates cost only verification time.
    """

    threshold: float = 0.8  # Jaccard similarity of word-shingle sets at which documents are duplicates
    ngram: int = 5  # words per shingle
    num_perm: int = 128  # MinHash permutations
    seed: int = 1  # permutation seed (datasketch's ``seed``)
    scheme: str = "affine32"  # datasketch 2.x permutation scheme: affine32 | affine64 | legacy
    bands: int = 0  # LSH bands; 0 = choose from threshold and weights
    rows: int = 0  # rows (signature values) per band; 0 = choose
    false_positive_weight: float = 0.5
    false_negative_weight: float = 0.5
    max_miss_at_threshold: float = 0.005  # allowed P(not a candidate) for a pair exactly at threshold
    verify: str = "jaccard"  # jaccard: exact Jaccard of shingle sets | signature: estimated | none
    num_buckets: int = 0  # shuffle partitions; 0 = enough that each holds about records_per_bucket
    records_per_bucket: int = 2_000_000  # band-key records grouped in memory by one work item
    max_bucket_fanout: int = 32  # in a band bucket, each document is compared with at most this many others
    signature_batch: int = 8192  # shingles permuted per NumPy batch (P × batch values: 4 MB at 128 × uint32; measured fastest)
    text_batch: int = 512  # documents read, normalised and shingled together (small arrays are reused, not faulted in anew)
    clusters_per_shard: int = 100_000  # rows per shard of the clusters dataset
    keep_work: bool = False  # keep ``_work/`` (signatures, band keys, edges) after the stage commits

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"dedup.threshold must be in (0, 1], got {self.threshold}")
        if self.ngram < 1:
            raise ValueError(f"dedup.ngram must be at least 1, got {self.ngram}")
        if self.num_perm < 2:
            raise ValueError(f"dedup.num_perm must be at least 2, got {self.num_perm}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"dedup.scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"dedup.verify must be one of {', '.join(VERIFY_MODES)}, got {self.verify!r}")
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError("set both dedup.bands and dedup.rows, or neither (0 = choose from the threshold)")
        if self.bands < 0 or self.rows < 0 or self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"dedup.bands × dedup.rows must be at most dedup.num_perm ({self.num_perm}), "
                f"got {self.bands} × {self.rows}"
            )
        if self.false_positive_weight < 0 or self.false_negative_weight < 0:
            raise ValueError("dedup.false_positive_weight and dedup.false_negative_weight must be non-negative")
        if not 0.0 < self.max_miss_at_threshold < 1.0:
            raise ValueError(f"dedup.max_miss_at_threshold must be in (0, 1), got {self.max_miss_at_threshold}")
        if self.num_buckets < 0:
            raise ValueError("dedup.num_buckets must be non-negative (0 = derived from the corpus size)")
        for name in ("records_per_bucket", "max_bucket_fanout", "signature_batch", "text_batch", "clusters_per_shard"):
            if getattr(self, name) < 1:
                raise ValueError(f"dedup.{name} must be at least 1")
