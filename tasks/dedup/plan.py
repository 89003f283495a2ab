"""The dedup plan every work item gets, and the files the phases share (docs/design.md §3).

The plan holds plain values only (it pickles to Dask workers): the input shards in one global
order, the bands × rows, the bucket count, and where each phase keeps its files —
``<output>/_work/<phase>/``. Documents are read through the dataset contract (each shard verified
against its manifest) and streamed by row group, so no phase holds a whole input shard's texts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import IO

import numpy as np

from tasks import contract, storage, verified_reads
from tasks.contract import Manifest, ShardInfo
from tasks.dedup.config import DedupConfig
from tasks.dedup.lsh import choose_bands
from tasks.dedup.store import write_npy_to
from tasks.dedup.verify import SignatureStore

EDGE = np.dtype([("a", "<u8"), ("b", "<u8"), ("similarity", "<f4"), ("exact", "u1")])
DROP = np.dtype([("row", "<u4"), ("reason", "u1")])
EXACT, NEAR = 1, 2
REASONS = {EXACT: "exact_duplicate", NEAR: "near_duplicate"}  # counted as dropped.<reason>


@dataclasses.dataclass(frozen=True)
class DedupPlan:
    """Everything a work item needs, as plain values."""

    output_url: str
    shard_urls: tuple[str, ...]
    shard_infos: tuple[ShardInfo, ...]
    cfg: DedupConfig
    bands: int
    rows: int
    num_buckets: int

    @property
    def work_root(self) -> str:
        return storage.join(self.output_url, "_work")

    def work(self, phase: str, name: str = "") -> str:
        return storage.join(self.work_root, phase, name) if name else storage.join(self.work_root, phase)

    def store(self) -> SignatureStore:
        n = len(self.shard_urls)
        shingles = [self.work("signatures", f"shingles-{s:05d}") for s in range(n)]
        return SignatureStore(
            [self.work("signatures", f"sigs-{s:05d}.npy") for s in range(n)],
            shingles if self.cfg.verify == "jaccard" else None,
        )


def make_plan(inputs: Sequence[Manifest], output_url: str, cfg: DedupConfig) -> DedupPlan:
    """Choose bands, rows and bucket count; list the input shards in a fixed global order."""
    shards = [(m, s) for m in inputs for s in m.shards]
    if len(shards) >= 1 << 31:
        raise ValueError(f"dedup supports fewer than 2^31 input shards, got {len(shards)}; merge shards first")
    if any(s.rows >= 1 << 32 for _, s in shards):
        raise ValueError("an input shard has 2^32 rows or more; split it into smaller shards")
    if cfg.bands:
        bands, rows = cfg.bands, cfg.rows
    else:
        bands, rows = choose_bands(
            cfg.threshold, cfg.num_perm, cfg.false_positive_weight, cfg.false_negative_weight, cfg.max_miss_at_threshold
        )
    total_records = sum(s.rows for _, s in shards) * (bands + 1)
    num_buckets = cfg.num_buckets or max(1, math.ceil(total_records / cfg.records_per_bucket))
    return DedupPlan(
        output_url=storage.normalize_url(output_url),
        shard_urls=tuple(contract.shard_url(m, s) for m, s in shards),
        shard_infos=tuple(s for _, s in shards),
        cfg=cfg,
        bands=bands,
        rows=rows,
        num_buckets=num_buckets,
    )


def document_batches(plan: DedupPlan, shard: int, columns: list[str] | None, batch_rows: int) -> Iterator:
    """The input shard's rows as pyarrow record batches of at most ``batch_rows``, in order
    (the shard verified against its manifest first)."""
    parquet = verified_reads.open_parquet(plan.shard_urls[shard], plan.shard_infos[shard])
    yield from parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False)  # one core per work item


def read_documents(plan: DedupPlan, shard: int, columns: list[str]):
    """The given columns of one verified input shard as a table (small columns only: ids, scores)."""
    return verified_reads.open_parquet(plan.shard_urls[shard], plan.shard_infos[shard]).read(columns=columns)


def write_npy(dataset_url: str, name: str, array: np.ndarray) -> ShardInfo:
    def write(f: IO[bytes]) -> int:
        write_npy_to(f, array)
        return len(array)

    return contract.write_shard(dataset_url, name, write)


def write_parquet(table, f: IO[bytes]) -> int:
    import pyarrow.parquet as pq

    pq.write_table(table, f, compression="zstd")
    return table.num_rows
