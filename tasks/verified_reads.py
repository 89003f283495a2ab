"""Reading a dataset's shards verified against its manifest, as they are read: bytes, a stream, a Parquet
table, or a local copy. A corrupt shard is a ``DatasetError`` naming it, never silently used.
"""

from __future__ import annotations

import io

from tasks.checksums import CHUNK, ChecksumError, hasher
from tasks.contract import DatasetError, Manifest, ShardInfo, shard_problem, shard_url
from tasks.storage import filesystem


def _shard_error(url: str, shard: ShardInfo, problem: str) -> DatasetError:
    return DatasetError(f"shard {shard.name} of {url} {problem}: the dataset is corrupt; "
                        "re-run the stage that wrote it (or delete the dataset)")


class VerifiedReader(io.RawIOBase):
    """A read-only file that hashes a shard as it is read and raises ``DatasetError`` on a mismatch.

    Bytes are hashed once, in order: a forward seek (Parquet reads its footer first) hashes the
    skipped bytes on the way, so any reader that reaches the end has verified the whole shard
    before it gets the last bytes. Leaving the ``with`` block without an error hashes whatever
    was not read, so a partial reader still never passes a corrupt shard silently.
    """

    def __init__(self, url: str, shard: ShardInfo, dataset_url: str) -> None:
        super().__init__()
        self.shard, self._dataset_url = shard, dataset_url
        fs, path = filesystem(url)
        try:
            size = int(fs.size(path))
        except FileNotFoundError:
            raise _shard_error(dataset_url, shard, "is missing") from None
        if size != shard.bytes:
            raise _shard_error(dataset_url, shard, f"is {size} bytes, the manifest says {shard.bytes}")
        try:
            self._hash = hasher(shard.checksum)
        except ChecksumError as e:
            raise _shard_error(dataset_url, shard, f"names an {e}") from None
        self._f = fs.open(path, "rb")
        self._pos = self._hashed = 0
        self.verified = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.shard.bytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _feed(self, data: bytes) -> None:
        self._hash.update(data)
        self._hashed += len(data)
        if self._hashed >= self.shard.bytes and not self.verified:
            got = f"{self.shard.checksum.split(':', 1)[0]}:{self._hash.hexdigest()}"
            if got != self.shard.checksum or self._hashed != self.shard.bytes:
                raise _shard_error(self._dataset_url, self.shard, "does not match its manifest checksum")
            self.verified = True

    def _hash_until(self, end: int) -> None:
        self._f.seek(self._hashed)
        while self._hashed < end:
            chunk = self._f.read(min(CHUNK, end - self._hashed))
            if not chunk:
                raise _shard_error(self._dataset_url, self.shard, f"ends at byte {self._hashed}, the manifest says {self.shard.bytes}")
            self._feed(chunk)

    def read(self, size: int = -1) -> bytes:
        size = self.shard.bytes - self._pos if size is None or size < 0 else min(size, max(0, self.shard.bytes - self._pos))
        if size <= 0:
            return b""
        if self._pos > self._hashed:
            self._hash_until(self._pos)
        self._f.seek(self._pos)
        data = self._f.read(size)
        end = self._pos + len(data)
        if end > self._hashed:
            self._feed(data[self._hashed - self._pos:])
        if len(data) < size:
            raise _shard_error(self._dataset_url, self.shard, f"ends at byte {end}, the manifest says {self.shard.bytes}")
        self._pos = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def finish(self) -> None:
        """Hash what was not read; raises if the shard does not match its manifest."""
        if not self.verified:
            self._hash_until(self.shard.bytes)

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()

    def __exit__(self, exc_type, *rest) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            self.close()


def _shard_info(manifest: Manifest, shard: ShardInfo | str) -> ShardInfo:
    if isinstance(shard, ShardInfo):
        return shard
    for s in manifest.shards:
        if s.name == shard:
            return s
    raise DatasetError(f"dataset at {manifest.meta['url']} has no shard {shard!r} in its manifest")


def open_shard(manifest: Manifest, shard: ShardInfo | str) -> VerifiedReader:
    """Open one shard for reading, verified against the manifest as it is read (use as ``with``)."""
    info = _shard_info(manifest, shard)
    return VerifiedReader(shard_url(manifest, info), info, manifest.meta["url"])


def open_verified(url: str, shard: ShardInfo) -> VerifiedReader:
    """``open_shard`` for callers that pass a shard's URL and info around instead of its manifest."""
    return VerifiedReader(url, shard, url.rsplit("/", 1)[0])


def read_shard(manifest: Manifest, shard: ShardInfo | str) -> bytes:
    """The whole verified content of one (small) shard."""
    with open_shard(manifest, shard) as f:
        return f.read()


def read_parquet(url: str, shard: ShardInfo, columns: list[str] | None = None):
    """One verified Parquet shard as a table: hashed in one pass, then decoded from memory.

    Parquet reads its footer first and only the columns asked for; reading the compressed bytes
    whole (their size is bounded by the shard) keeps the check to one sequential pass.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_verified(url, shard) as f:
        blob = f.read()
    return pq.read_table(pa.BufferReader(blob), columns=columns)


def open_parquet(url: str, shard: ShardInfo):
    """A verified ``pyarrow.parquet.ParquetFile`` for streaming reads (row groups, batches)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_verified(url, shard) as f:
        blob = f.read()
    return pq.ParquetFile(pa.BufferReader(blob))


def verify_local_file(path: str, shard: ShardInfo, dataset_url: str) -> None:
    """Check a local copy (or memory-mapped file) of ``shard`` in one sequential pass."""
    from fsspec.implementations.local import LocalFileSystem

    if (problem := shard_problem(LocalFileSystem(), path, shard)) is not None:
        raise _shard_error(dataset_url, shard, problem)
