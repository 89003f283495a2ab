"""Streaming decompression of crawl files that notices what Python's and warcio's readers pass silently.

A truncated gzip or zstd stream raises ``EOFError`` after every byte decoded before the cut; a
corrupt gzip member is skipped (``GAP`` in the chunk stream) and decoding resumes at the next
member header, so the WARC framer can count the records lost with it. Output is capped per call,
so one record never sits in memory whole.
"""

from __future__ import annotations

import contextlib
import io
import struct
import zlib
from collections.abc import Iterator
from typing import IO, Any

import fsspec

from tasks.datasets import remote_options


READ_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b\x08"
GAP = None  # in a chunk stream: corrupt compressed data was skipped here
MEMBER_END = object()  # in ``decompressed_chunks``: a gzip member ended here, its CRC and length held
# Characters of documents a reader holds back (beyond one of the largest) until the gzip member they came
# from has passed its checksum; past that, one huge member's documents go out before its end is checked.
UNVERIFIED_HOLD_CHARS = 16 << 20


def is_compressed(url: str) -> bool:
    """Whether ``open_input`` inflates ``url`` (named .gz or .zst), so checksums come after the data."""
    return url.lower().endswith((".gz", ".zst"))


def compression_name(url: str) -> str:
    """How a file is compressed, for counter names: zstd for .zst, else gzip."""
    return "zstd" if url.lower().endswith(".zst") else "gzip"


@contextlib.contextmanager
def open_input(url: str) -> Iterator[IO[bytes]]:
    """A binary stream of ``url``'s uncompressed bytes; truncated gzip/zstd raise ``EOFError``."""
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        name = url.lower()
        if name.endswith(".gz"):
            with checked_gzip(raw) as stream:
                yield stream
        elif name.endswith(".zst"):
            with io.BufferedReader(ZstdReader(raw), buffer_size=READ_CHUNK) as stream:
                yield stream
        else:
            yield raw


def checked_gzip(raw: IO[bytes]) -> io.BufferedReader:
    """``raw`` inflated member by member with every CRC and length checked: corrupt data raises
    ``zlib.error``, a truncation ``EOFError`` (not gzip.GzipFile: it drops the lines it had decoded
    when it meets a truncation; not tarfile's gzip stream: it checks no CRC)."""
    return io.BufferedReader(ChunkReader(gzip_members(raw)), buffer_size=READ_CHUNK)


class ChunkReader(io.RawIOBase):
    """A binary stream over ``gzip_members``: corrupt data raises ``zlib.error`` where it starts,
    truncation raises ``EOFError`` after every byte decoded before it."""

    def __init__(self, chunks: Iterator[bytes | None]):
        self._chunks, self._out = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk = next(self._chunks, b"")
            if chunk is GAP:
                raise zlib.error("corrupt gzip data")
            if not chunk:
                return 0
            self._out = memoryview(chunk)
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


class ZstdReader(io.RawIOBase):
    """Streaming zstd decompression that, unlike ``zstandard.stream_reader``, notices truncation.

    Frames are decoded one after another (``zstd`` concatenates them); input that ends inside a
    frame raises ``EOFError`` like Python's gzip reader does.
    """

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw = raw
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._frame = self._new()
        self._in_frame = False
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk = self._raw.read(READ_CHUNK)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                return 0
            self._out = memoryview(self._decompress(chunk))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._in_frame = True
            out.append(self._frame.decompress(chunk))
            chunk = b""
            if self._frame.eof:  # the frame ended inside this chunk: the rest starts the next frame
                chunk, self._frame, self._in_frame = self._frame.unused_data, self._new(), False
        return b"".join(out)


def decompressed_chunks(url: str, raw: IO[bytes]) -> Iterator[bytes | object | None]:
    """The uncompressed bytes of ``raw`` in chunks, with ``GAP`` and (gzip) ``MEMBER_END`` markers; a
    truncated gzip/zstd stream raises ``EOFError``."""
    name = url.lower()
    if name.endswith(".gz"):
        yield from gzip_members(raw, member_ends=True)
        return
    stream = io.BufferedReader(ZstdReader(raw), buffer_size=READ_CHUNK) if name.endswith(".zst") else raw
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def gzip_members(raw: IO[bytes], member_ends: bool = False) -> Iterator[bytes | object | None]:
    """Decompress gzip member after member (a WARC holds one record per member). Corrupt data
    yields ``GAP`` once, and decoding resumes at the next gzip header in the compressed bytes; with
    ``member_ends``, ``MEMBER_END`` follows each member whose checksum held."""
    data, decoder, fresh, skipping = b"", None, False, False
    while True:
        if not data:
            data = raw.read(READ_CHUNK)
            if not data:
                if decoder is not None:
                    raise EOFError("gzip stream ended inside a member (truncated file)")
                return
            fresh = decoder is None
        if decoder is None:
            decoder = zlib.decompressobj(31)
        try:
            out = decoder.decompress(data, READ_CHUNK)
            while True:  # output is capped per call, so one record never sits in memory whole
                if out:
                    skipping = False
                    yield out
                if decoder.eof:
                    break
                if decoder.unconsumed_tail:
                    out = decoder.decompress(decoder.unconsumed_tail, READ_CHUNK)
                elif len(out) == READ_CHUNK:  # input used up, output may still be pending
                    out = decoder.decompress(b"", READ_CHUNK)
                else:
                    break
        except zlib.error:
            if not skipping:
                skipping = True
                yield GAP
            at = data.find(GZIP_MAGIC, 1 if fresh else 0)
            while at < 0:  # read on until the next member header
                more = raw.read(READ_CHUNK)
                if not more:
                    return
                data = data[-2:] + more
                at = data.find(GZIP_MAGIC)
            data, decoder, fresh = data[at:], None, True
            continue
        if decoder.eof:
            data, decoder, fresh = decoder.unused_data, None, True
            if member_ends:
                yield MEMBER_END
        else:
            data = b""


class VerifiedGzip:
    """FastWARC's gzip reader as chunks, and how much of its output is verified (``verified``, an
    uncompressed offset): the members it has moved past had their checksums checked."""

    def __init__(self, reader: Any) -> None:
        self._reader, self._member, self._pos, self.verified = reader, 0, 0, 0
        self._crc: int | None = 0  # CRC-32 of all output while the file has been one gzip member; then None

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._reader.read(READ_CHUNK):
            before, self._pos = self._pos, self._pos + len(chunk)
            member = self._reader.frame_start_position()
            if member != self._member:  # the member that held byte ``before`` ended in this chunk
                self._member, self.verified, self._crc = member, before, None
            elif self._crc is not None:
                self._crc = zlib.crc32(chunk, self._crc)
            yield chunk

    def ends_complete(self, raw: IO[bytes]) -> bool:
        """Whether the last gzip member (from its compressed offset to the end of file) is whole.

        A file that is one member is whole when its last 8 bytes are the gzip trailer of what was
        read (CRC-32 and length): checked without inflating it a second time. Otherwise, or when
        they differ, the last member is inflated again by zlib."""
        return (self._crc is not None and self._trailer_matches(raw)) or self.last_member_inflates_whole(raw)

    def last_member_inflates_whole(self, raw: IO[bytes]) -> bool:
        """Whether zlib inflates the last member, from its compressed offset, to the end of file."""
        try:
            raw.seek(self._reader.frame_start_position() or 0)
        except (OSError, ValueError):
            return False
        decoder = zlib.decompressobj(31)
        try:
            while data := raw.read(READ_CHUNK):
                if decoder.eof:
                    return False  # bytes after the last member
                out = decoder.decompress(data, READ_CHUNK)  # output capped: the member may be the whole file
                while not decoder.eof and (decoder.unconsumed_tail or len(out) == READ_CHUNK):
                    out = decoder.decompress(decoder.unconsumed_tail, READ_CHUNK)
        except zlib.error:
            return False
        return decoder.eof and not decoder.unused_data

    def _trailer_matches(self, raw: IO[bytes]) -> bool:
        try:
            raw.seek(-8, io.SEEK_END)
            trailer = raw.read(8)
        except (OSError, ValueError):
            return False
        return len(trailer) == 8 and struct.unpack("<II", trailer) == (self._crc, self._pos & 0xFFFFFFFF)
