"""Shards in and out of the tokenize stage: Parquet document batches in, token shards out.

Token shards follow the record format at the end of ``tasks/datasets.py``: ``<split>-NNNNN.bin`` is
a flat little-endian ``uint16``/``uint32`` token array and ``<split>-NNNNN.idx`` the ``.npy`` int64
start offset of each document in it; EOS ends every document. Both shards carry ``extra`` =
split, tokens, docs, dtype (of the ``.bin``). ``ShardInfo.rows`` counts tokens, so the ``.idx``
shard has ``rows = 0`` and ``Manifest.rows`` is the dataset's token count.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks import datasets


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``, little-endian either way."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


# --------------------------------------------------------------------------------------------
# documents in


def document_shards(inputs: list[datasets.Manifest]) -> list[tuple[datasets.Manifest, datasets.ShardInfo]]:
    """Every Parquet shard of the documents datasets, in input then shard order (the stage's order)."""
    out = []
    for manifest in inputs:
        if manifest.kind != "documents":
            raise datasets.DatasetError(
                f"dataset at {manifest.meta.get('url')} holds {manifest.kind!r}; tokenize reads 'documents' datasets"
            )
        out.extend((manifest, s) for s in manifest.shards if s.name.endswith(".parquet"))
    return out


def iter_document_batches(url: str, columns: list[str], batch_size: int) -> Iterator[pa.RecordBatch]:
    """Stream one Parquet shard in batches of at most ``batch_size`` rows, reading only ``columns``."""
    fs, path = datasets.filesystem(url)
    with fs.open(path, "rb") as f:
        yield from pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns)


def iter_row_groups(url: str) -> Iterator[tuple[pq.ParquetFile, int]]:
    """The open Parquet file and each row-group number, so callers can read columns selectively."""
    fs, path = datasets.filesystem(url)
    with fs.open(path, "rb") as f:
        parquet = pq.ParquetFile(f)
        for group in range(parquet.num_row_groups):
            yield parquet, group


# --------------------------------------------------------------------------------------------
# tokens out


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


def write_token_shard(dataset_url: str, stem: str, split: str, tokens: np.ndarray, starts: np.ndarray) -> list[datasets.ShardInfo]:
    """Write ``<stem>.bin`` and ``<stem>.idx`` atomically; returns their infos (idx last)."""
    dtype = np.dtype(tokens.dtype).newbyteorder("<")
    extra = {"split": split, "tokens": int(len(tokens)), "docs": int(len(starts)), "dtype": dtype.name}

    def write_tokens(f) -> int:
        f.write(np.ascontiguousarray(tokens, dtype=dtype).tobytes())
        return len(tokens)

    def write_index(f) -> int:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(starts, dtype="<i8"))
        f.write(buffer.getvalue())
        return 0

    return [
        datasets.write_shard(dataset_url, f"{stem}.bin", write_tokens, **extra),
        datasets.write_shard(dataset_url, f"{stem}.idx", write_index, **extra),
    ]


# --------------------------------------------------------------------------------------------
# tokens back (eval, tests, tools)


def read_token_shard(manifest: datasets.Manifest, bin_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, starts) of one ``.bin`` shard and its index, read whole through fsspec."""
    fs, path = datasets.filesystem(datasets.shard_url(manifest, bin_name))
    tokens = np.frombuffer(fs.cat_file(path), dtype=np.dtype(manifest.meta["dtype"]).newbyteorder("<"))
    ifs, ipath = datasets.filesystem(datasets.shard_url(manifest, bin_name[: -len(".bin")] + ".idx"))
    starts = np.load(io.BytesIO(ifs.cat_file(ipath)))
    return tokens, starts


def iter_token_documents(manifest: datasets.Manifest, split: str) -> Iterator[np.ndarray]:
    """Each document's tokens (ending in EOS) of one split, in shard order."""
    for shard in manifest.shards:
        if shard.name.endswith(".bin") and shard.extra.get("split") == split:
            tokens, starts = read_token_shard(manifest, shard.name)
            yield from np.split(tokens, starts[1:])
