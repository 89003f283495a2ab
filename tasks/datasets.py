"""The dataset contract shared by every stage (docs/design.md §2).

A dataset is a folder at any fsspec URL holding shards and one ``manifest.json``. The manifest is
written last: a dataset is complete iff its manifest exists. Shards are written under a temporary
name and moved into place, then a small ``<shard>.done.json`` marker records the shard's info and
stats, so a retried stage skips every shard whose marker matches the bytes on disk and redoes
only what is missing.

Vocabulary: a *stage* writes one dataset from its inputs; a *shard* is one file of a dataset; a
*fingerprint* names a dataset's content before it is computed (inputs + config + code version).

Integrity: every shard's size and checksum are in the manifest, and every reader verifies them as
it reads (``open_shard``, ``read_shard``, ``verify_local_file``): a corrupt shard is an error naming
it, never silently used. Checksums are ``<algorithm>:<hex>``; new shards use xxh3-128, which hashes
about 10x faster than sha256 here (17 vs 1.75 GB/s, bench/verify.py), so verifying costs a few
percent of a read; manifests written with ``sha256`` still verify. The hash guards against
accidents (bit rot, truncation, an overwritten file), not against someone who can write the folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import io
import json
import logging
import os
import platform
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import fsspec
import xxhash

from tasks.objectstore import remote_options  # and its import sets s3 defaults: no listings cache, bounded retries

MANIFEST = "manifest.json"
DONE_SUFFIX = ".done.json"
FINGERPRINT_CHARS = 16
CHECKSUM = "xxh3_128"  # the algorithm of new checksums (why: see the module docstring)
_HASHES: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_CHUNK = 4 << 20

log = logging.getLogger(__name__)


class DatasetError(Exception):
    """A dataset is missing, incomplete or corrupt; the message says which and where."""


class ManifestError(DatasetError, ValueError):
    """A ``manifest.json`` that cannot be parsed (truncated, hand-edited, another tool's)."""


# --------------------------------------------------------------------------------------------
# Stats: additive counters, so per-shard stats merge into the stage's stats by addition.


class Stats(dict):
    """Named counters (``str -> int | float``). ``a + b`` adds counters key by key.

    One vocabulary for every stage, so summaries and artifacts need no per-stage cases:
    ``in`` (records the stage read), ``out`` (records it wrote), ``dropped.<reason>`` (removed on
    purpose), ``failed.<reason>`` (lost to an error); reason names are API (``gopher_short_doc``).
    A stage made of steps keeps each step's counters, in the same vocabulary, under
    ``funnel.<step>.`` (``funnel.lang.in``, ``funnel.lang.dropped.lang_not_kept``) and sums the
    drops and failures at the top; ``tasks.counters`` merges and displays them. Anything else is
    a namespaced measurement (``tokens.train``, ``time.shard_s``).
    """

    def add(self, key: str, value: int | float = 1) -> None:
        self[key] = self.get(key, 0) + value

    def __add__(self, other: Mapping[str, int | float] | int) -> "Stats":
        out = Stats(self)
        if isinstance(other, int) and other == 0:  # sum() starts from 0
            return out
        for key, value in other.items():
            out.add(key, value)
        return out

    __radd__ = __add__

    def __iadd__(self, other: Mapping[str, int | float]) -> "Stats":
        for key, value in other.items():
            self.add(key, value)
        return self

    def with_prefix(self, prefix: str) -> dict[str, int | float]:
        return {k[len(prefix):]: v for k, v in sorted(self.items()) if k.startswith(prefix)}


# --------------------------------------------------------------------------------------------
# Manifest


@dataclasses.dataclass
class ShardInfo:
    """One shard of a dataset: ``rows`` counts records (documents, tokens, …; see ``unit``)."""

    name: str
    rows: int
    bytes: int
    checksum: str  # "<algorithm>:<hex>"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ShardInfo":
        """Also reads manifests from before checksums named their algorithm (``sha256`` field)."""
        d = dict(d)
        if "sha256" in d:
            d["checksum"] = "sha256:" + d.pop("sha256")
        return cls(**d)


@dataclasses.dataclass
class ShardResult:
    """What processing one shard yields: the shards it wrote and its stats."""

    shards: list[ShardInfo]
    stats: Stats

    def to_json(self) -> dict[str, Any]:
        return {"shards": [dataclasses.asdict(s) for s in self.shards], "stats": dict(self.stats)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ShardResult":
        return cls([ShardInfo.from_dict(s) for s in d["shards"]], Stats(d["stats"]))


@dataclasses.dataclass
class Manifest:
    kind: str
    fingerprint: str
    shards: list[ShardInfo]
    stats: dict[str, int | float]
    lineage: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        d = json.loads(text)
        d["shards"] = [ShardInfo.from_dict(s) for s in d["shards"]]
        return cls(**d)


# --------------------------------------------------------------------------------------------
# Fingerprints and URLs


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint(stage: str, config: Any, inputs: list[str], code_version: str) -> str:
    """Hash of (stage, input fingerprints, config, code version): names the output before it exists."""
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    blob = canonical_json({"stage": stage, "inputs": inputs, "config": config, "code": code_version})
    return hashlib.sha256(blob.encode()).hexdigest()[:FINGERPRINT_CHARS]


def code_version(*packages: str) -> str:
    """Hash of the source of the given packages (dotted names), plus the shared core (``tasks/*.py``).

    Editing a stage's code, or the core every stage reads through (model, checkpoints, tokens,
    this contract), changes its fingerprint, so stale outputs are never reused.
    """
    import importlib

    digest = hashlib.sha256()
    for core in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(core.name.encode())
        digest.update(core.read_bytes())
    for name in packages:
        module = importlib.import_module(name)
        root = Path(module.__file__).parent if module.__file__.endswith("__init__.py") else Path(module.__file__)
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for f in files:
            digest.update(str(f.relative_to(root.parent)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def normalize_url(url: str) -> str:
    """Make a bare local path an absolute ``file://`` URL; leave other URLs alone."""
    url = str(url)
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/")


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *[p.strip("/") for p in parts]])


def stage_url(root: str, stage: str, fp: str) -> str:
    """``<root>/<stage>/<fingerprint>``: the same inputs and config always land in the same place."""
    return join(normalize_url(root), stage, fp)


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    url = normalize_url(url)
    fs, path = fsspec.core.url_to_fs(url, **remote_options(url))
    return fs, path


# --------------------------------------------------------------------------------------------
# Writing


def _hasher(checksum_or_algorithm: str):
    algorithm = checksum_or_algorithm.split(":", 1)[0]
    if algorithm not in _HASHES:
        raise DatasetError(f"unknown checksum algorithm {algorithm!r}; smelt knows {sorted(_HASHES)}")
    return _HASHES[algorithm]()


def file_checksum(fs: fsspec.AbstractFileSystem, path: str, algorithm: str = CHECKSUM) -> str:
    """``<algorithm>:<hex>`` of a file (``algorithm`` may also be a checksum: its algorithm is used)."""
    h = _hasher(algorithm)
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"{algorithm.split(':', 1)[0]}:{h.hexdigest()}"


def bytes_checksum(blob: bytes, algorithm: str = CHECKSUM) -> str:
    """``<algorithm>:<hex>`` of bytes in memory (``algorithm`` may also be a checksum)."""
    h = _hasher(algorithm)
    h.update(blob)
    return f"{algorithm.split(':', 1)[0]}:{h.hexdigest()}"


def shard_problem(fs: fsspec.AbstractFileSystem, path: str, shard: ShardInfo) -> str | None:
    """Why the file at ``path`` is not ``shard`` (missing, size, checksum), or None if it is."""
    if not fs.exists(path):
        return "is missing"
    if (size := int(fs.size(path))) != shard.bytes:
        return f"is {size} bytes, the manifest says {shard.bytes}"
    if file_checksum(fs, path, shard.checksum) != shard.checksum:
        return "does not match its manifest checksum"
    return None


@contextlib.contextmanager
def atomic_write(url: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``url``; move it into place only if the block succeeds."""
    fs, path = filesystem(url)
    parent, name = path.rsplit("/", 1)
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:8]}-{name}"
    try:
        with fs.open(tmp, mode) as f:
            yield f
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        raise


def write_shard(dataset_url: str, name: str, write: Callable[[IO], int], **extra: Any) -> ShardInfo:
    """Write one shard atomically. ``write(f)`` writes the bytes and returns the row count.

    Never clobbers: a shard that a complete dataset's manifest lists may only be rewritten with
    identical bytes (a stage redoing its own work); other content is refused before the move.
    """
    fs, path = filesystem(join(dataset_url, name))
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:8]}-{path.rsplit('/', 1)[1]}"
    try:
        with fs.open(tmp, "wb") as f:
            rows = write(f)
        info = ShardInfo(name=name, rows=int(rows), bytes=int(fs.size(tmp)), checksum=file_checksum(fs, tmp), extra=extra)
        if (existing := read_manifest(dataset_url)) is not None:
            listed = {s.name: s.checksum for s in existing.shards}
            if name in listed and listed[name] != file_checksum(fs, tmp, listed[name]):
                raise DatasetError(_clobber_message(dataset_url, existing, f"writing {name} into it would change it"))
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        raise
    return info


def _clobber_message(url: str, existing: "Manifest", what: str) -> str:
    return (f"{normalize_url(url)} already holds a complete {existing.kind!r} dataset "
            f"(fingerprint {existing.fingerprint}); {what}: choose another output URL or delete that dataset")


def _done_url(dataset_url: str, key: str) -> str:
    return join(dataset_url, "_done", key + DONE_SUFFIX)


def finished_shard(dataset_url: str, key: str) -> ShardResult | None:
    """The recorded result of work item ``key`` if all its shards exist with matching checksums."""
    fs, path = filesystem(_done_url(dataset_url, key))
    if not fs.exists(path):
        return None
    result = ShardResult.from_json(json.loads(fs.cat_file(path)))
    for shard in result.shards:
        sfs, spath = filesystem(join(dataset_url, shard.name))
        if (problem := shard_problem(sfs, spath, shard)) is not None:
            log.warning("redoing %s of %s: shard %s %s", key, dataset_url, shard.name, problem)
            return None
    return result


def run_shard(dataset_url: str, key: str, work: Callable[[], ShardResult]) -> ShardResult:
    """Shard-level idempotency: reuse the finished result of ``key`` or run ``work`` and record it.

    The marker is written after the shards are in place, so a crash leaves either no marker
    (the work is redone) or a marker whose checksums verify.
    """
    done = finished_shard(dataset_url, key)
    if done is not None:
        done.stats.add("shards_reused")
        return done
    result = work()
    with atomic_write(_done_url(dataset_url, key), "w") as f:
        f.write(json.dumps(result.to_json(), sort_keys=True))
    return result


def software_versions() -> dict[str, str]:
    """The versions of what shapes a dataset's bytes, for its lineage (looked up once per process)."""
    return dict(_software_versions())


@functools.cache
def _software_versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("smelt", "torch", "dask", "prefect", "pyarrow", "tokenizers", "datasketch", "trafilatura",
                 "resiliparse", "fastwarc", "fasttext"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def commit(
    dataset_url: str,
    kind: str,
    fp: str,
    shards: list[ShardInfo],
    stats: Mapping[str, int | float],
    inputs: list["Manifest | str"] | None = None,
    config: Any = None,
    meta: dict[str, Any] | None = None,
) -> Manifest:
    """Write ``manifest.json`` last, making the dataset complete.

    Refused where a complete dataset of another kind or fingerprint lives: outputs never clobber.
    """
    if (existing := read_manifest(dataset_url)) is not None and (existing.kind, existing.fingerprint) != (kind, fp):
        raise DatasetError(_clobber_message(dataset_url, existing, f"a {kind!r} dataset (fingerprint {fp}) may not replace it"))
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    lineage = {
        "inputs": [
            {"url": i.meta.get("url", ""), "fingerprint": i.fingerprint, "kind": i.kind}
            if isinstance(i, Manifest)
            else {"url": str(i)}
            for i in (inputs or [])
        ],
        "config": config,
        "software": software_versions(),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    meta = {"url": normalize_url(dataset_url), **(meta or {})}
    manifest = Manifest(kind, fp, sorted(shards, key=lambda s: s.name), dict(sorted(stats.items())), lineage, meta)
    with atomic_write(join(dataset_url, MANIFEST), "w") as f:
        f.write(manifest.to_json())
    return manifest


# --------------------------------------------------------------------------------------------
# Reading


def read_manifest(url: str) -> Manifest | None:
    """The manifest at ``url``, or None if the dataset is not complete."""
    fs, path = filesystem(join(url, MANIFEST))
    if not fs.exists(path):
        return None
    try:
        manifest = Manifest.from_json(fs.cat_file(path).decode())
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ManifestError(f"{join(normalize_url(url), MANIFEST)} is unreadable ({type(e).__name__}: {e}); "
                            "the dataset is corrupt: re-run the stage that wrote it") from None
    manifest.meta["url"] = normalize_url(url)  # a dataset may be moved; its location is where we read it
    return manifest


def finished_dataset(url: str, fp: str) -> Manifest | None:
    """The complete, verified dataset at ``url`` if it is the one fingerprint ``fp`` names, else None.

    A complete dataset with another fingerprint is an error: writing over it would mix two datasets.
    One whose shards fail verification is not complete: its manifest is removed (the stage that
    owns it then redoes the bad shards, reusing the good ones through their markers).
    """
    manifest = read_manifest(url)
    if manifest is not None and manifest.fingerprint != fp:
        raise DatasetError(
            f"{normalize_url(url)} already holds a dataset with fingerprint {manifest.fingerprint}, not {fp}: "
            "choose another output URL or delete it"
        )
    if manifest is not None and (bad := verify(manifest)):
        log.warning("%s is not reused: shards %s fail verification; recomputing", manifest.meta["url"], ", ".join(bad))
        fs, path = filesystem(join(url, MANIFEST))
        fs.rm(path)
        return None
    return manifest


def open_dataset(url: str, kind: str | None = None) -> Manifest:
    """The manifest of a complete dataset, or a clear error naming what is wrong."""
    url = normalize_url(url)
    fs, path = filesystem(url)
    if not fs.exists(path):
        raise DatasetError(f"no dataset at {url}: the path does not exist")
    manifest = read_manifest(url)
    if manifest is None:
        raise DatasetError(f"dataset at {url} is incomplete: it has no {MANIFEST} (was its stage interrupted?)")
    if kind is not None and manifest.kind != kind:
        raise DatasetError(f"dataset at {url} holds {manifest.kind!r}, expected {kind!r}")
    return manifest


def shard_url(manifest: Manifest, shard: ShardInfo | str) -> str:
    return join(manifest.meta["url"], shard if isinstance(shard, str) else shard.name)


def verify(manifest: Manifest) -> list[str]:
    """Names of shards that are missing or whose size or checksum differs from the manifest."""
    bad = []
    for shard in manifest.shards:
        fs, path = filesystem(shard_url(manifest, shard))
        if (problem := shard_problem(fs, path, shard)) is not None:
            log.warning("shard %s of %s %s", shard.name, manifest.meta["url"], problem)
            bad.append(shard.name)
    return bad


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
        self._f = fs.open(path, "rb")
        self._hash = _hasher(shard.checksum)
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
            chunk = self._f.read(min(_CHUNK, end - self._hashed))
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


# --------------------------------------------------------------------------------------------
# Record formats shared between stages.
#
# documents (kind "documents"): Parquet shards named ``docs-NNNNN.parquet`` with DOCUMENT_COLUMNS.
#   ``meta`` is a JSON object string for source-specific fields (code: repo, path, license, language;
#   web: warc file, record offset) so the schema stays fixed.
# tokens (kind "tokens"): flat little-endian ``uint16``/``uint32`` arrays ``<split>-NNNNN.bin`` with a
#   document index ``<split>-NNNNN.idx`` (int64 start offsets of each document, ``.npy`` format);
#   EOS ends every document. Shard ``extra``: split, tokens, docs, dtype. Manifest ``meta``:
#   dtype, vocab_size, eos_id, bos_id, pad_id, and ``tokenizer.json`` is stored in the dataset.
# checkpoint (kind "checkpoint"): a torch.distributed.checkpoint folder ``step-NNNNNNNN/`` whose
#   ``manifest.json`` (written last) lists the DCP files with sizes and checksums.

DOCUMENT_COLUMNS: dict[str, str] = {
    "id": "string",
    "url": "string",
    "source": "string",  # "web" | "code"
    "lang": "string",
    "lang_score": "float",
    "quality_score": "float",  # NaN when no classifier ran
    "text": "string",
    "meta": "string",
}


def document_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "float": pa.float32()}
    return pa.schema([(name, types[t]) for name, t in DOCUMENT_COLUMNS.items()])


def raw_input_fingerprints(urls: list[str]) -> list[str]:
    """Fingerprints of raw input files (not smelt datasets): URL, size and modification stamp.

    Reading whole crawl files to hash them would cost as much as ingesting them; size plus the
    store's mtime/ETag changes whenever the content does in practice.
    """
    out = []
    for url in urls:
        fs, path = filesystem(url)
        info = fs.info(path)
        blob = canonical_json([normalize_url(url), info.get("size"), file_stamp(info)])
        out.append(hashlib.sha256(blob.encode()).hexdigest()[:FINGERPRINT_CHARS])
    return out


def file_stamp(info: Mapping[str, Any]) -> str:
    """A file's modification stamp from its fsspec ``info``: ETag, else mtime, else creation time."""
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("created"))
