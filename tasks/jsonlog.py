"""JSON-lines logs (metrics, events) on any store, with or without append.

Local and memory filesystems append to ``<dir>/<name>``. Object stores have no append (s3fs
emulates it by rewriting the object on close, so nothing is visible until then, and two writers
lose each other's lines), so there a log is a folder ``<dir>/<name>.d/`` of objects, each one
written whole by one PUT:

- a ``Segment`` (metrics: many records from one writer) rewrites its current object with every
  record, so each record is durable once logged, and rolls to a new object every
  ``roll_records`` records, which bounds the bytes rewritten;
- ``append`` (events: one record from any process) writes one object per record.

Object names start with the wall clock in nanoseconds, so ``read`` returns records in the order
they were written, whichever mode wrote them.
"""

from __future__ import annotations

import json
import time
import uuid

from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from tasks import storage

ROLL_RECORDS = 200


def _appendable(fs) -> bool:
    return isinstance(fs, (LocalFileSystem, MemoryFileSystem))


def _object_name() -> str:
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.jsonl"


def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True) + "\n"


def append(dir_url: str, name: str, record: dict) -> None:
    """Add one record to the log ``name`` in ``dir_url``; safe from several processes."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(dir_url), name))
    if _appendable(fs):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "a") as f:
            f.write(_line(record))
    else:
        fs.pipe_file(f"{path}.d/{_object_name()}", _line(record).encode())


class Segment:
    """One writer's stream of records into the log ``name`` in ``dir_url`` (see the module docstring)."""

    def __init__(self, dir_url: str, name: str, roll_records: int = ROLL_RECORDS) -> None:
        self.fs, self.path = storage.filesystem(storage.join(storage.normalize_url(dir_url), name))
        self.roll_records = roll_records
        self._file = None
        self._lines: list[str] = []
        self._object = ""
        if _appendable(self.fs):
            self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
            self._file = self.fs.open(self.path, "a")

    def write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(_line(record))
            self._file.flush()
            return
        if not self._lines or len(self._lines) >= self.roll_records:
            self._lines, self._object = [], f"{self.path}.d/{_object_name()}"
        self._lines.append(_line(record))
        self.fs.pipe_file(self._object, "".join(self._lines).encode())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read(dir_url: str, name: str) -> list[dict]:
    """Every record of the log ``name`` in ``dir_url``, in write order ([] if there is none)."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(dir_url), name))
    blobs = [fs.cat_file(path)] if fs.exists(path) else []
    if fs.exists(path + ".d"):
        blobs += [fs.cat_file(p) for p in sorted(fs.find(path + ".d"))]
    return [json.loads(line) for blob in blobs for line in blob.decode().splitlines() if line.strip()]
