"""The dataset contract shared by every stage (DESIGN.md §2).

A dataset is a folder at any fsspec URL holding shards and one ``manifest.json``. The manifest is
written last: a dataset is complete iff its manifest exists. Shards are written under a temporary
name and moved into place, then a small ``<shard>.done.json`` marker records the shard's info and
stats, so a retried stage skips every shard whose marker matches the bytes on disk and redoes
only what is missing.

Vocabulary: a *stage* writes one dataset from its inputs; a *shard* is one file of a dataset; a
*fingerprint* names a dataset's content before it is computed (inputs + config + code version).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import fsspec

MANIFEST = "manifest.json"
DONE_SUFFIX = ".done.json"
FINGERPRINT_CHARS = 16


class DatasetError(Exception):
    """A dataset is missing, incomplete or corrupt; the message says which and where."""


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
    sha256: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ShardResult:
    """What processing one shard yields: the shards it wrote and its stats."""

    shards: list[ShardInfo]
    stats: Stats

    def to_json(self) -> dict[str, Any]:
        return {"shards": [dataclasses.asdict(s) for s in self.shards], "stats": dict(self.stats)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ShardResult":
        return cls([ShardInfo(**s) for s in d["shards"]], Stats(d["stats"]))


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
        d["shards"] = [ShardInfo(**s) for s in d["shards"]]
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
    """Hash of the source of the given packages (dotted names), plus this module's source.

    Editing a stage's code changes its fingerprint, so stale outputs are never reused.
    """
    import importlib

    digest = hashlib.sha256(Path(__file__).read_bytes())
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
    fs, path = fsspec.core.url_to_fs(normalize_url(url))
    return fs, path


# --------------------------------------------------------------------------------------------
# Writing


def file_sha256(fs: fsspec.AbstractFileSystem, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


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
    """Write one shard atomically. ``write(f)`` writes the bytes and returns the row count."""
    url = join(dataset_url, name)
    with atomic_write(url) as f:
        rows = write(f)
    fs, path = filesystem(url)
    return ShardInfo(name=name, rows=int(rows), bytes=int(fs.size(path)), sha256=file_sha256(fs, path), extra=extra)


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
        if not sfs.exists(spath) or file_sha256(sfs, spath) != shard.sha256:
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
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("smelt", "torch", "dask", "prefect", "pyarrow", "tokenizers", "datasketch", "trafilatura"):
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
    """Write ``manifest.json`` last, making the dataset complete."""
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
    manifest = Manifest.from_json(fs.cat_file(path).decode())
    manifest.meta["url"] = normalize_url(url)  # a dataset may be moved; its location is where we read it
    return manifest


def finished_dataset(url: str, fp: str) -> Manifest | None:
    """The complete dataset at ``url`` if it is the one fingerprint ``fp`` names; None if there is none.

    A complete dataset with another fingerprint is an error: writing over it would mix two datasets.
    """
    manifest = read_manifest(url)
    if manifest is not None and manifest.fingerprint != fp:
        raise DatasetError(
            f"{normalize_url(url)} already holds a dataset with fingerprint {manifest.fingerprint}, not {fp}: "
            "choose another output URL or delete it"
        )
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
    """Names of shards that are missing or whose checksum or size differs from the manifest."""
    bad = []
    for shard in manifest.shards:
        fs, path = filesystem(shard_url(manifest, shard))
        if not fs.exists(path) or fs.size(path) != shard.bytes or file_sha256(fs, path) != shard.sha256:
            bad.append(shard.name)
    return bad


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
        stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("created")
        blob = canonical_json([normalize_url(url), info.get("size"), str(stamp)])
        out.append(hashlib.sha256(blob.encode()).hexdigest()[:FINGERPRINT_CHARS])
    return out
