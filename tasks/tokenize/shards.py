"""Document shards into the tokenize stage, and how encoded documents become one token array.

Token shards themselves are read and written by ``tasks/token_shards.py``, shared with train and eval.
Every document shard is verified against its manifest as it is read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks import contract, verified_reads


def document_shards(inputs: list[contract.Manifest]) -> list[tuple[contract.Manifest, contract.ShardInfo]]:
    """Every Parquet shard of the documents datasets, in input then shard order (the stage's order)."""
    out = []
    for manifest in inputs:
        if manifest.kind != "documents":
            raise contract.DatasetError(
                f"dataset at {manifest.meta.get('url')} holds {manifest.kind!r}; tokenize reads 'documents' datasets"
            )
        out.extend((manifest, s) for s in manifest.shards if s.name.endswith(".parquet"))
    return out


def iter_document_batches(url: str, shard: contract.ShardInfo, columns: list[str], batch_size: int) -> Iterator[pa.RecordBatch]:
    """Stream one verified Parquet shard in batches of at most ``batch_size`` rows, reading only ``columns``."""
    yield from verified_reads.open_parquet(url, shard).iter_batches(batch_size=batch_size, columns=columns)


def iter_row_groups(url: str, shard: contract.ShardInfo) -> Iterator[tuple[pq.ParquetFile, int]]:
    """The verified Parquet file and each row-group number, so callers can read columns selectively."""
    parquet = verified_reads.open_parquet(url, shard)
    for group in range(parquet.num_row_groups):
        yield parquet, group


def join_documents(encoded: list[list[int]], eos_id: int, bos_id: int | None, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Flatten encoded documents into one token array, EOS after each (BOS before, if given).

    Returns (tokens, starts): ``starts[i]`` is where document ``i`` begins in ``tokens``.
    """
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(lengths.sum()))
    ends = np.cumsum(lengths)
    tokens = np.insert(flat, ends, eos_id)  # one EOS after each document
    if bos_id is not None:
        tokens = np.insert(tokens, ends - lengths + np.arange(len(encoded)), bos_id)
        lengths = lengths + 1
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
    return tokens, starts
