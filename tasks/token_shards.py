"""Token shards, the one reader and writer that tokenize, train and eval share (format in ``tasks/contract.py``).

``<split>-NNNNN.bin`` is a flat little-endian ``uint16``/``uint32`` token array and
``<split>-NNNNN.idx`` the ``.npy`` int64 start offset of each document in it; EOS ends every
document. Both shards carry ``extra`` = split, tokens, docs, dtype (of the ``.bin``).
``ShardInfo.rows`` counts tokens, so the ``.idx`` shard has ``rows = 0`` and ``Manifest.rows`` is
the dataset's token count. Every read is verified against the manifest.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import uuid
from collections.abc import Iterator

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from tasks import contract, storage, verified_reads

log = logging.getLogger(__name__)


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``, little-endian either way."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def write_token_shard(dataset_url: str, stem: str, split: str, tokens: np.ndarray, starts: np.ndarray) -> list[contract.ShardInfo]:
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
        contract.write_shard(dataset_url, f"{stem}.bin", write_tokens, **extra),
        contract.write_shard(dataset_url, f"{stem}.idx", write_index, **extra),
    ]


def read_token_shard(manifest: contract.Manifest, bin_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, starts) of one ``.bin`` shard and its index, read whole and verified."""
    tokens = np.frombuffer(verified_reads.read_shard(manifest, bin_name), dtype=np.dtype(manifest.meta["dtype"]).newbyteorder("<"))
    starts = np.load(io.BytesIO(verified_reads.read_shard(manifest, bin_name[: -len(".bin")] + ".idx")))
    return tokens, starts


def iter_token_documents(manifest: contract.Manifest, split: str) -> Iterator[np.ndarray]:
    """Each document's tokens (ending in EOS) of one split, in shard order."""
    for shard in manifest.shards:
        if shard.name.endswith(".bin") and shard.extra.get("split") == split:
            tokens, starts = read_token_shard(manifest, shard.name)
            yield from np.split(tokens, starts[1:])


def _fetch(manifest: contract.Manifest, shard: contract.ShardInfo, local: str) -> None:
    """Copy a remote shard to ``local``, hashing it on the way (one pass), through a unique temporary
    name and an atomic rename, so ranks sharing a node may race safely."""
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = f"{local}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with verified_reads.open_shard(manifest, shard) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 4 << 20)
        os.replace(tmp, local)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    log.info("cached %s (%d bytes) at %s", shard.name, shard.bytes, local)


def local_token_shard(manifest: contract.Manifest, shard: contract.ShardInfo, cache_dir: str | None) -> str:
    """A local path holding the shard's verified bytes, ready to memory-map: the file itself, or a copy
    in the cache (``<cache_dir>/<fingerprint>/``).

    Local files and cached copies are hashed once here (a sequential pass, about 17 GB/s with
    xxh3); a cached copy that fails is fetched again, a dataset file that fails is an error.
    """
    fs, path = storage.filesystem(contract.shard_url(manifest, shard))
    if isinstance(fs, LocalFileSystem):
        verified_reads.verify_local_file(path, shard, manifest.meta["url"])
        return path
    root = cache_dir or os.environ.get("SMELT_CACHE_DIR") or os.path.expanduser("~/.cache/smelt/tokens")
    local = os.path.join(root, manifest.fingerprint, shard.name)
    if os.path.exists(local):
        try:
            verified_reads.verify_local_file(local, shard, manifest.meta["url"])
            return local
        except contract.DatasetError as e:
            log.warning("cached copy %s is bad (%s); fetching it again", local, e)
            os.remove(local)
    _fetch(manifest, shard, local)
    return local


def map_token_shard(path: str, dtype: np.dtype) -> np.ndarray:
    """A read-only array over a local token shard (a plain ndarray view slices several times faster
    than ``np.memmap``; the RSS that grows as pages are touched is reclaimable page cache)."""
    return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)


def lineage_name(bin_name: str) -> str:
    """The lineage shard the tokenize stage writes beside a token shard (``train-00003.bin`` ->
    ``train-00003.docs.parquet``: one row per document, tasks/tokenize/stage.py)."""
    return bin_name[: -len(".bin")] + ".docs.parquet"


def stream_shards(manifest: contract.Manifest, split: str) -> list[contract.ShardInfo]:
    """The ``.bin`` shards whose concatenation is a split's stream, in order (train's loader, smelt trace)."""
    return [s for s in manifest.shards
            if s.extra.get("split") == split and s.name.endswith(".bin") and int(s.extra.get("tokens", s.rows))]


class TokenStream:
    """The token stream of one split of one tokens dataset, read window by window.

    Train's loader draws windows from it in its own order; eval scores the held-out stream in
    order. ``samples`` counts whole windows of ``seq_len + 1`` tokens.
    """

    def __init__(self, url: str, split: str, seq_len: int, cache_dir: str | None) -> None:
        manifest = contract.open_dataset(url, kind="tokens")
        self.fingerprint = manifest.fingerprint
        self.meta = manifest.meta
        self.dtype = np.dtype(manifest.meta["dtype"]).newbyteorder("<")
        shards = stream_shards(manifest, split)
        tokens = [int(s.extra.get("tokens", s.rows)) for s in shards]
        self.total = sum(tokens)
        self.samples = max(0, (self.total - 1) // seq_len)
        if self.samples == 0:
            raise ValueError(
                f"tokens dataset {manifest.meta['url']} has {self.total} {split!r} tokens, fewer than one "
                f"sample of seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more data"
            )
        self.starts = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
        self._manifest, self._shards, self._cache_dir = manifest, shards, cache_dir
        self._arrays: list[np.ndarray | None] = [None] * len(shards)

    def _array(self, i: int) -> np.ndarray:
        # Verified and mapped on first use: a run over thousands of shards pays for those it reads.
        if self._arrays[i] is None:
            path = local_token_shard(self._manifest, self._shards[i], self._cache_dir)
            self._arrays[i] = map_token_shard(path, self.dtype)
        return self._arrays[i]

    def read(self, start: int, length: int, out: np.ndarray, shard: int | None = None) -> None:
        """Copy tokens ``[start, start + length)`` of the stream into ``out`` (crossing shards if needed)."""
        if start < 0 or start + length > self.total:
            raise IndexError(f"tokens [{start}, {start + length}) are outside the stream of {self.total}")
        i = int(np.searchsorted(self.starts, start, side="right")) - 1 if shard is None else shard
        filled = 0
        while filled < length:  # more than once only for a window that crosses a shard boundary
            offset = start + filled - int(self.starts[i])
            piece = self._array(i)[offset: offset + length - filled]
            out[filled: filled + len(piece)] = piece
            filled += len(piece)
            i += 1

    def read_windows(self, starts: np.ndarray, out: np.ndarray) -> None:
        """Fill row ``r`` of ``out`` with the tokens from stream position ``starts[r]`` on."""
        shards = np.searchsorted(self.starts, starts, side="right") - 1  # one vectorised lookup
        for row, (start, shard) in enumerate(zip(starts.tolist(), shards.tolist())):
            self.read(start, out.shape[1], out[row], shard)

    def close(self) -> None:
        self._arrays = [None] * len(self._arrays)
