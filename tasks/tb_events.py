"""TensorBoard event files on any fsspec store (local, ``s3://``, ``memory://``), scalars only.

torch's ``SummaryWriter`` writes through TensorBoard's own file layer, which on ``s3://`` needs boto3
and elsewhere writes a local folder named ``s3:``. An event file is simple enough to write here: a
TFRecord stream (length, masked CRC-32C of the length, an ``Event`` protobuf, its masked CRC-32C)
that starts with a ``file_version`` event. Like ``tasks/jsonlog.py``, local and memory files are
appended to; on object stores each file is rewritten whole at every flush and a new file starts
every ``roll_records`` flushes, which bounds the bytes rewritten. TensorBoard reads every
``*tfevents*`` file of a folder in name order, so the rolled files read as one stream.
"""

from __future__ import annotations

import socket
import struct
import time

from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tasks import storage

ROLL_RECORDS = 200


def record(data: bytes) -> bytes:
    """One TFRecord: what TensorBoard's reader checks before it parses an event."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
    return record(Event(wall_time=wall_time, step=int(step), summary=summary).SerializeToString())


def file_name(wall_time: float, suffix: str = "") -> str:
    return f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}.{time.time_ns() % 10**9:09d}{suffix}"


class EventWriter:
    """Scalars into one TensorBoard run folder ``dir_url``; ``flush()`` makes what was written durable."""

    def __init__(self, dir_url: str, roll_records: int = ROLL_RECORDS, name: str | None = None) -> None:
        self.fs, self.dir = storage.filesystem(storage.normalize_url(dir_url))
        self.roll_records, self.fixed_name = roll_records, name
        self.appendable = isinstance(self.fs, (LocalFileSystem, MemoryFileSystem))
        self._pending: list[bytes] = []
        self._object: bytes = b""
        self._flushes = 0
        self._path = ""
        self._file = None

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self._pending.append(scalar_event(tag, value, step, time.time() if wall_time is None else wall_time))

    def session_start(self, step: int, wall_time: float | None = None) -> None:
        """Mark a restart at ``step``: TensorBoard drops the points of earlier files at this step and after
        (they were trained again, or never on the run's final trajectory)."""
        event = Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step),
                      session_log=SessionLog(status=SessionLog.START))
        self._pending.append(record(event.SerializeToString()))

    def scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        for tag, value in values.items():
            self.scalar(tag, value, step, wall_time)

    def _start_file(self) -> None:
        now = time.time()
        self._path = f"{self.dir}/{self.fixed_name or file_name(now)}"
        self._flushes = 0
        head = record(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        self.fs.makedirs(self.dir, exist_ok=True)  # a no-op under an object store's bucket
        if self.appendable:
            self._file = self.fs.open(self._path, "wb")
            self._file.write(head)
        else:
            self._object = head

    def flush(self) -> None:
        if not self._pending and self._path:
            return
        if not self._path or (not self.appendable and self._flushes >= self.roll_records):
            self._start_file()
        data, self._pending = b"".join(self._pending), []
        if self.appendable:
            self._file.write(data)
            self._file.flush()
        else:
            self._object += data
            self.fs.pipe_file(self._path, self._object)
        self._flushes += 1

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
