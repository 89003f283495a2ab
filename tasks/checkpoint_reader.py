"""Reading checkpoints: the one reader every stage shares (train's resume, export, eval, the flows).

Layout: ``<run_dir>/checkpoints/step-NNNNNNNN/`` holds DCP's files (``__<rank>_<n>.distcp`` and
``.metadata``) and smelt's ``manifest.json`` (tasks.contract, kind ``checkpoint``),
written last once every rank's files are on storage (``tasks/train/checkpoint_writer.py`` writes them). A
checkpoint is *committed* iff its manifest exists and *good* iff every file it lists has the
recorded size and checksum. LATEST is the newest good checkpoint, found by verifying, never read
from a pointer file, so a half-written or corrupted checkpoint is reported and skipped.

Nothing unpickles: ``.metadata`` is read by an unpickler that admits only DCP's own classes, and
non-tensor values are stored as JSON (``encode_object`` / ``decode_object``, see "Nothing
unpickles" below); ``load_state`` is the one reader of DCP files (resume, rollback, export, eval),
``load_consolidated`` gives one process the full model weights whatever mesh saved them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import pickle
import warnings
from collections.abc import Iterator, Mapping
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from tasks import branches, contract, storage
from tasks.checksums import file_checksum
from tasks.objectstore import remote_options
from tasks.checkpoint_layout import (  # noqa: F401 - the layout is read through this module too
    CHECKPOINTS_DIR, checkpoints_url, relative_step, run_dir_of, step_dirs, step_of, step_url)
from tasks.lease import EPOCH_KEY, commit_superseded

log = logging.getLogger(__name__)



@contextlib.contextmanager
def single_process_quietly() -> Iterator[None]:
    """Around DCP's save and load calls: DCP warns on every single-process one even when asked for it
    (no_dist=True); here a single process without torch.distributed is a supported setup (laptop runs,
    eval, export), not a mistake. Scoped to the calls, so importing smelt changes no warning filter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield

KIND = "checkpoint"
DCP_METADATA = ".metadata"


def storage_reader(url: str) -> dcp.StorageReader:
    """A DCP reader for ``url`` that reads ``.metadata`` with the restricted unpickler below."""
    url = storage.normalize_url(url)
    if url.startswith("file://"):
        return _FileSystemReader(storage.filesystem(url)[1])
    return _FsspecReader(url, **remote_options(url))


# --------------------------------------------------------------------------------------------
# Nothing unpickles. DCP stores three kinds of serialized objects; each is read without running code:
# - ``.metadata``: a pickle of DCP's own dataclasses. Read by an unpickler that admits only those
#   classes, torch dtypes, torch.Size, layouts and paths (what torch 2.13 writes).
# - tensor items in ``__<rank>_<n>.distcp``: DCP itself reads them with torch.load(weights_only=True).
# - non-tensor items (optimizer param groups, step counters, the loader's position): DCP would
#   torch.save / torch.load(weights_only=False) them; our planners store them as tagged JSON instead.


class UnsafeCheckpointError(contract.DatasetError):
    """A checkpoint file holds something smelt will not deserialize (a pickle payload, or a foreign format)."""


_METADATA_CLASSES = {
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # turns "torch.strided" into the layout object
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(f"{module}.{name}")


def read_dcp_metadata(stream: IO[bytes], where: str) -> Metadata:
    """DCP's ``.metadata`` without running code: anything but DCP's own classes is refused."""
    try:
        metadata = _MetadataUnpickler(stream).load()
    except UnsafeCheckpointError as e:
        raise UnsafeCheckpointError(f"{where} refers to {e}, which is not part of DCP's metadata; refusing to "
                                    "load it (the file was replaced or crafted)") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise UnsafeCheckpointError(f"{where} is not DCP metadata ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{where} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class _SafeMetadataReader:
    """Mixin for DCP's readers: ``.metadata`` through ``read_dcp_metadata``, read once and cached.

    No ``**kwargs``: DCP then never falls back to per-rank ``__<rank>.metadata`` files, which smelt never writes.
    """

    _cached: Metadata | None = None

    def read_metadata(self) -> Metadata:
        if self._cached is None:
            path = self._get_metadata_path()
            with self.fs.create_stream(path, "rb") as stream:
                metadata = read_dcp_metadata(stream, str(path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            self._cached = metadata
        return self._cached


class _FileSystemReader(_SafeMetadataReader, dcp.FileSystemReader):
    pass


class _FsspecReader(_SafeMetadataReader, FsspecReader):
    pass


_JSON_MAGIC = b"smelt-json-1\n"
_TUPLE = "__tuple__"


def _to_json(value: Any, fqn: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_to_json(v, fqn) for v in value]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and _TUPLE not in value:
        return {k: _to_json(v, fqn) for k, v in value.items()}
    raise TypeError(f"checkpoint state {fqn!r} holds a {type(value).__name__}; non-tensor state must be plain "
                    "numbers, strings, booleans, None, lists, tuples or string-keyed dicts (it is stored as JSON)")


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(_from_json(v) for v in value[_TUPLE])
        return {k: _from_json(v) for k, v in value.items()}
    return value


def encode_object(value: Any, fqn: str) -> bytes:
    return _JSON_MAGIC + json.dumps(_to_json(value, fqn)).encode()


def decode_object(data: bytes, fqn: str) -> Any:
    """A non-tensor checkpoint item; anything not written by ``encode_object`` is refused, never unpickled."""
    if not data.startswith(_JSON_MAGIC):
        raise UnsafeCheckpointError(f"checkpoint item {fqn!r} is not smelt's JSON (a pickled object from torch.save, "
                                    "or a crafted file); refusing to unpickle it")
    try:
        return _from_json(json.loads(data[len(_JSON_MAGIC):]))
    except ValueError as e:
        raise UnsafeCheckpointError(f"checkpoint item {fqn!r} is not valid JSON ({e})") from None


class LoadPlanner(DefaultLoadPlanner):
    """DCP's default load plan, with non-tensor values read by ``decode_object`` (never torch.load)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        obj = decode_object(value.getvalue(), fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def load_state(state_dict: dict, url: str, *, process_group=None, no_dist: bool = True) -> None:
    """``dcp.load`` of ``url`` into ``state_dict`` with nothing unpickled; refusals raise UnsafeCheckpointError.

    The one way smelt reads a checkpoint's DCP files (resume, rollback, export, eval).
    """
    reader = storage_reader(url)
    reader.read_metadata()  # refuses a crafted .metadata before DCP's collectives start
    try:
        with single_process_quietly():
            dcp.load(state_dict, storage_reader=reader, planner=LoadPlanner(), process_group=process_group,
                     no_dist=no_dist)
    except CheckpointException as e:
        for exc, _ in e.failures.values():
            if isinstance(exc, UnsafeCheckpointError):
                raise UnsafeCheckpointError(str(exc)) from None
            if isinstance(exc, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a tensor item
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise UnsafeCheckpointError(f"checkpoint {url}: a tensor file holds more than tensors, refusing "
                                            f"it ({first})") from None
        raise


def named_checkpoint(run_manifest: contract.Manifest) -> str:
    """The checkpoint a finished run's manifest names, resolved against where the run folder is now
    (runs finished before paths were relative recorded an absolute URL: used as is)."""
    ref = run_manifest.meta["checkpoint"]
    return storage.normalize_url(ref) if "://" in ref else storage.join(run_manifest.meta["url"], ref)


def resolve(url: str) -> str:
    """A verified step URL from a step URL, a finished run (the checkpoint it names) or a run folder (its newest good one).

    Raises DatasetError when the named checkpoint fails verification: a truncated or altered final
    checkpoint is never handed on as the run's result.
    """
    url = storage.normalize_url(url)
    manifest = contract.read_manifest(url)
    if manifest is not None and manifest.kind == KIND:
        step = url
    elif manifest is not None and "checkpoint" in manifest.meta:
        step = named_checkpoint(manifest)
    else:
        committed = list_committed(url)
        if not committed:
            raise contract.DatasetError(f"{url} is neither a committed checkpoint nor a run directory with one; "
                                        "pass a step-NNNNNNNN URL or the run directory")
        return committed[-1]["url"]  # list_committed verified it
    problems = verify_checkpoint(step)
    if problems:
        raise contract.DatasetError(f"checkpoint {step} fails verification: {'; '.join(problems)}")
    return step


def finished_run(run_dir_url: str) -> contract.Manifest | None:
    """The finished run's manifest if the checkpoint it names verifies; None if the run must (re)train.

    A finished run whose final checkpoint was truncated or altered is logged and reported unfinished:
    relaunching it resumes from the newest good checkpoint and writes the final one again.
    """
    manifest = contract.read_manifest(run_dir_url)
    if manifest is None or "checkpoint" not in manifest.meta:
        return manifest
    problems = verify_checkpoint(named_checkpoint(manifest))
    if problems:
        log.warning("finished run %s names a bad checkpoint (%s); training again from the newest good one",
                    manifest.meta["url"], "; ".join(problems))
        return None
    return manifest


def is_committed(url: str) -> bool:
    fs, path = storage.filesystem(storage.join(url, contract.MANIFEST))
    return fs.exists(path)


# --------------------------------------------------------------------------------------------
# Verification


def checkpoint_problems(url: str, part: int = 0, parts: int = 1, checksums: bool = True) -> list[str]:
    """Problems of one checkpoint; files are split ``part`` of ``parts`` so ranks share the hashing.

    A commit that a later lease epoch superseded (a stale trainer's, tasks/lease.py) is a problem too,
    judged by part 0."""
    url = storage.normalize_url(url)
    try:
        manifest = contract.read_manifest(url)
    except (ValueError, TypeError, KeyError) as e:  # truncated or hand-edited manifest.json
        return [f"{url}: unreadable {contract.MANIFEST} ({e})"]
    if manifest is None:
        return [f"{url}: no {contract.MANIFEST} (the save did not commit)"]
    if manifest.kind != KIND:
        return [f"{url}: manifest kind is {manifest.kind!r}, not {KIND!r}"]
    if DCP_METADATA not in {s.name for s in manifest.shards}:
        return [f"{url}: manifest does not list DCP's {DCP_METADATA}"]
    problems = []
    epoch = manifest.meta.get(EPOCH_KEY)
    if part == 0 and epoch is not None and (step := step_of(url)) is not None:
        if (why := commit_superseded(run_dir_of(url), epoch, step)) is not None:
            problems.append(f"{url}: superseded ({why})")
    for shard in manifest.shards[part::parts]:
        fs, path = storage.filesystem(storage.join(url, shard.name))
        if not fs.exists(path):
            problems.append(f"{url}/{shard.name}: missing")
        elif fs.size(path) != shard.bytes:
            problems.append(f"{url}/{shard.name}: {fs.size(path)} bytes, manifest says {shard.bytes}")
        elif checksums and file_checksum(fs, path, shard.checksum) != shard.checksum:
            problems.append(f"{url}/{shard.name}: checksum differs from the manifest")
    return problems


def verify_checkpoint(step_url: str, *, checksums: bool = True) -> list[str]:
    """Problems found in one ``step-NNNNNNNN`` checkpoint (empty: committed and intact).

    ``checksums=False`` checks the manifest, file presence and sizes only: cheap enough to poll.
    """
    return checkpoint_problems(step_url, checksums=checksums)


def _summary(step: int, url: str, meta: Mapping[str, Any], fingerprint: str) -> dict[str, Any]:
    return {
        "step": step,
        "url": url,
        "tokens": meta.get("tokens"),
        "loss": meta.get("loss"),
        "world_size": meta.get("world_size"),
        "config_fingerprint": fingerprint,
    }


def list_committed(run_dir_url: str, *, checksums: bool = True) -> list[dict[str, Any]]:
    """Verified checkpoints of a run, newest last: ``{step, url, tokens, loss, world_size, config_fingerprint}``.

    Bad checkpoints are logged and left out. With ``checksums`` (default) every file is hashed;
    pollers may pass False to check presence and sizes only.
    """
    out = []
    for step, url in step_dirs(run_dir_url).items():
        problems = verify_checkpoint(url, checksums=checksums)
        if problems:
            log.warning("checkpoint %s skipped: %s", url, "; ".join(problems))
            continue
        manifest = contract.read_manifest(url)
        out.append(_summary(step, url, manifest.meta, manifest.fingerprint))
    return out


def list_branches(run_dir_url: str, *, checksums: bool = True) -> list[dict[str, Any]]:
    """The run's superseded branches (``tasks/branches.py``), oldest first: each record with ``checkpoints``,
    its verified checkpoints as ``list_committed`` lists them, each marked ``superseded`` and with its ``branch``.
    ``list_committed`` of the run never returns them: they live under ``<run>/branches/<n>/``."""
    out = []
    for record in branches.read(run_dir_url):
        listed = list_committed(branches.branch_url(run_dir_url, record), checksums=checksums)
        out.append({**record, "checkpoints": [{**c, "branch": record["branch"], "superseded": True} for c in listed]})
    return out


# --------------------------------------------------------------------------------------------
# Consolidation


def model_entries(step_url: str) -> tuple[dict[str, Any], str, dict[str, TensorStorageMetadata]]:
    """A verified checkpoint's manifest meta, the prefix of its model keys, and the model tensors'
    metadata under the model's own FQNs (read from DCP's metadata file: no tensor is loaded)."""
    step_url = storage.normalize_url(step_url)
    problems = verify_checkpoint(step_url)
    if problems:
        raise contract.DatasetError(f"checkpoint {step_url} cannot be exported: {'; '.join(problems)}")
    manifest = contract.read_manifest(step_url)
    prefix = manifest.meta.get("model_prefix")
    if not prefix:
        raise contract.DatasetError(f"checkpoint {step_url} does not record where the model weights are "
                                    "(meta 'model_prefix'); save it under app_state['model'] or pass meta model_prefix")
    entries = storage_reader(step_url).read_metadata().state_dict_metadata
    model = {key[len(prefix):]: md for key, md in entries.items()
             if key.startswith(prefix) and isinstance(md, TensorStorageMetadata)}
    if not model:
        raise contract.DatasetError(f"checkpoint {step_url} holds no tensors under {prefix!r}")
    return manifest.meta, prefix, model


def load_consolidated(step_url: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full (unsharded) model weights of a verified checkpoint under the model's own FQNs, and its manifest meta.

    One process, no process group; the model config the trainer saved is ``meta["model"]``.
    """
    meta, prefix, entries = model_entries(step_url)
    weights = {prefix + key: torch.empty(md.size, dtype=md.properties.dtype) for key, md in entries.items()}
    load_state(weights, storage.normalize_url(step_url))
    return {key[len(prefix):]: tensor for key, tensor in weights.items()}, meta
