"""The dataset contract shared by every stage (docs/design.md §2): manifests, fingerprints, shard
writes, commits and the checks that a dataset is complete and whole.

A dataset is a folder at any fsspec URL holding shards and one ``manifest.json``. The manifest is
written last: a dataset is complete iff its manifest exists. Shards are written under a temporary
name and moved into place, then a small ``<shard>.done.json`` marker records the shard's info and
stats, so a retried stage skips every shard whose marker matches the bytes on disk and redoes
only what is missing.

Vocabulary: a *stage* writes one dataset from its inputs; a *shard* is one file of a dataset; a
*fingerprint* names a dataset's content before it is computed (inputs + config + code version).

Integrity: every shard's size and checksum (``tasks.checksums``) are in the manifest, and every reader
verifies them as it reads (``tasks.verified_reads``): a corrupt shard is an error naming it, never
silently used. URLs, filesystems and atomic writes are ``tasks.storage``'s; the counters are
``tasks.counters``'; the documents format is ``tasks.documents``'.

Formats of the datasets stages share:
- documents (kind "documents"): Parquet shards ``docs-NNNNN.parquet`` with ``tasks.documents``' schema.
- tokens (kind "tokens"): flat little-endian ``uint16``/``uint32`` arrays ``<split>-NNNNN.bin`` with a
  document index ``<split>-NNNNN.idx`` (int64 start offsets of each document, ``.npy`` format); EOS ends
  every document. Shard ``extra``: split, tokens, docs, dtype. Manifest ``meta``: dtype, vocab_size,
  eos_id, bos_id, pad_id, and ``tokenizer.json`` is stored in the dataset (``tasks.token_shards``).
- checkpoint (kind "checkpoint"): a torch.distributed.checkpoint folder ``step-NNNNNNNN/`` whose
  ``manifest.json`` (written last) lists the DCP files with sizes and checksums.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import logging
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import fsspec

from tasks.checksums import ChecksumError, file_checksum
from tasks.counters import Stats
from tasks.storage import atomic_write, filesystem, join, normalize_url, temporary_beside

MANIFEST = "manifest.json"
DONE_SUFFIX = ".done.json"
FINGERPRINT_CHARS = 16

log = logging.getLogger(__name__)


class DatasetError(Exception):
    """A dataset is missing, incomplete or corrupt; the message says which and where."""


class ManifestError(DatasetError, ValueError):
    """A ``manifest.json`` that cannot be parsed (truncated, hand-edited, another tool's)."""


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
# Fingerprints


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


def stage_url(root: str, stage: str, fp: str) -> str:
    """``<root>/<stage>/<fingerprint>``: the same inputs and config always land in the same place."""
    return join(normalize_url(root), stage, fp)


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


# --------------------------------------------------------------------------------------------
# Writing


def shard_problem(fs: fsspec.AbstractFileSystem, path: str, shard: ShardInfo) -> str | None:
    """Why the file at ``path`` is not ``shard`` (missing, size, checksum), or None if it is."""
    if not fs.exists(path):
        return "is missing"
    if (size := int(fs.size(path))) != shard.bytes:
        return f"is {size} bytes, the manifest says {shard.bytes}"
    try:
        if file_checksum(fs, path, shard.checksum) != shard.checksum:
            return "does not match its manifest checksum"
    except ChecksumError as e:
        return f"names an {e}"
    return None


def write_shard(dataset_url: str, name: str, write: Callable[[IO], int], **extra: Any) -> ShardInfo:
    """Write one shard atomically. ``write(f)`` writes the bytes and returns the row count.

    Never clobbers: a shard that a complete dataset's manifest lists may only be rewritten with
    identical bytes (a stage redoing its own work); other content is refused before the move.
    """
    fs, path = filesystem(join(dataset_url, name))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = temporary_beside(path)
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
