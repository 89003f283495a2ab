"""A hash-partitioned shuffle on files, so grouping by key never needs the corpus in one process.

Each map work item writes ONE file holding its records ordered by bucket (``key mod buckets``)
behind a small header of bucket offsets; the reduce work item for bucket k reads just its slice
from every map output (two small reads plus one range read per file). This is the datatrove
layout with one file per shard instead of one per (shard, bucket), and it runs on any ``MapFn``:
the serial path and the Dask path are the same code.

File layout: ``b"SMELTSHF"``, uint64 bucket count B, B + 1 uint64 record offsets, then the
records (``RECORD`` dtype, little-endian).
"""

from __future__ import annotations

from typing import IO

import numpy as np

from tasks.storage import filesystem

MAGIC = b"SMELTSHF"
_HEADER = len(MAGIC) + 8

# key: what is grouped on (a band key, or the high half of an exact key);
# tag: the document's exact key (high half for band records, low half for exact records);
# doc: the document (input shard << 32 | row); band: band index, or EXACT_BAND.
RECORD = np.dtype([("key", "<u8"), ("tag", "<u8"), ("doc", "<u8"), ("band", "<u2")])
EXACT_BAND = np.iinfo(np.uint16).max


def bucket_of(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    return (keys % np.uint64(num_buckets)).astype(np.int64)


def write_partitioned(f: IO[bytes], records: np.ndarray, num_buckets: int) -> int:
    """Write ``records`` to ``f`` grouped by bucket (stable, so the bytes depend only on the input)."""
    buckets = bucket_of(records["key"], num_buckets)
    # A stable sort of small integers is a radix sort in NumPy (one pass, ~10× an argsort of int64).
    order = np.argsort(buckets.astype(np.uint16) if num_buckets <= 1 << 16 else buckets, kind="stable")
    offsets = np.zeros(num_buckets + 1, dtype="<u8")
    np.cumsum(np.bincount(buckets, minlength=num_buckets), out=offsets[1:])
    f.write(MAGIC)
    f.write(np.uint64(num_buckets).astype("<u8").tobytes())
    f.write(offsets.tobytes())
    f.write(records[order].astype(RECORD, copy=False).view(np.uint8).data)
    return len(records)


def read_bucket(url: str, bucket: int) -> np.ndarray:
    """The records of one bucket from one partitioned file."""
    fs, path = filesystem(url)
    with fs.open(path, "rb") as f:
        head = f.read(_HEADER)
        if head[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{url} is not a smelt shuffle file (bad magic)")
        num_buckets = int(np.frombuffer(head[len(MAGIC) :], dtype="<u8")[0])
        f.seek(_HEADER + 8 * bucket)
        start, end = np.frombuffer(f.read(16), dtype="<u8").astype(np.int64)
        f.seek(_HEADER + 8 * (num_buckets + 1) + start * RECORD.itemsize)
        data = f.read(int(end - start) * RECORD.itemsize)
    return np.frombuffer(data, dtype=RECORD)
