"""Streaming decompression of input files that notices what Python's, fsspec's and warcio's readers pass
silently; one decoder loop (``frames``) for gzip, bz2, xz and zstd.

A truncated stream raises ``EOFError`` after every byte decoded before the cut; corrupt data shows as
``GAP`` in a chunk stream (``CorruptData`` from a file-like one), and decoding resumes at the next
member's magic, so a reader can count the records lost with that member alone. ``MEMBER_END`` marks
where a member (stream, frame) ended with its checksum held, so readers can hold documents until the
data they came from is verified. Output is capped per call (zstd, whose decoder takes no cap, by feeding it
a block at a time), so neither one record nor a small input that inflates to gigabytes sits in memory whole.
"""

from __future__ import annotations

import bz2
import contextlib
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any

import fsspec

from tasks.objectstore import remote_options


READ_CHUNK = 1 << 20
GAP = None  # in a chunk stream: corrupt compressed data was skipped here
MEMBER_END = object()  # in a chunk stream: a member (stream, frame) ended here, its checksum held
# Characters of documents a reader holds back (beyond one of the largest) until the member they came from
# has passed its checksum; past that, one huge member's documents go out before its end is checked.
UNVERIFIED_HOLD_CHARS = 16 << 20
SUFFIX_COMPRESSION = ((".gz", "gzip"), (".bz2", "bz2"), (".xz", "xz"), (".zst", "zstd"))


def compression_name(url: str) -> str:
    """How ``url`` is compressed, by its name (gzip, bz2, xz, zstd; "none"), as counter names spell it."""
    name = url.lower()
    return next((kind for suffix, kind in SUFFIX_COMPRESSION if name.endswith(suffix)), "none")


def is_compressed(url: str) -> bool:
    """Whether ``open_input`` and ``decompressed_chunks`` inflate ``url``, so checksums come after the data."""
    return compression_name(url) != "none"


class CorruptData(Exception):
    """Compressed data that does not decode, or fails its checksum."""


# The first bytes of each stream format that smelt inflates itself (tarfile's own gzip stream checks no
# CRC, and no format's trailer is read when tarfile stops at the archive's end marker).
STREAM_MAGIC = {"gzip": b"\x1f\x8b\x08", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}


def sniff_compression(raw: IO[bytes]) -> str | None:
    """The stream format ``raw`` starts with (a key of ``STREAM_MAGIC``), or None; ``raw`` is rewound."""
    head = raw.read(max(len(magic) for magic in STREAM_MAGIC.values()))
    raw.seek(0)
    return next((kind for kind, magic in STREAM_MAGIC.items() if head.startswith(magic)), None)


@contextlib.contextmanager
def open_input(url: str) -> Iterator[IO[bytes]]:
    """A binary stream of ``url``'s uncompressed bytes (``checked_stream`` when ``is_compressed``)."""
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        if is_compressed(url):
            with checked_stream(raw, compression_name(url)) as stream:
                yield stream
        else:
            yield raw


def checked_stream(raw: IO[bytes], kind: str) -> io.BufferedReader:
    """``raw`` inflated (``kind``: gzip, bz2, xz or zstd) stream after stream, each to its end with its
    checksum checked: corrupt data raises ``CorruptData``, a truncation ``EOFError`` after every byte
    decoded before it (not gzip.GzipFile: it drops the lines it had decoded when it meets a truncation;
    not zstandard's stream_reader: it passes a truncation; not tarfile's streams: gzip's checks no CRC,
    and none reads past the tar end marker to its stream's trailer)."""
    return io.BufferedReader(ChunkReader(frames(raw, kind)), buffer_size=READ_CHUNK)


class ChunkReader(io.RawIOBase):
    """A binary stream over decoded chunks: ``GAP`` raises ``CorruptData``."""

    def __init__(self, chunks: Iterator[bytes | None]):
        self._chunks, self._out = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk = next(self._chunks, b"")
            if chunk is GAP:
                raise CorruptData("corrupt compressed data")
            if not chunk:
                return 0
            self._out = memoryview(chunk)
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


def decompressed_chunks(url: str, raw: IO[bytes]) -> Iterator[bytes | object | None]:
    """The uncompressed bytes of ``raw`` in chunks, with ``GAP`` and ``MEMBER_END`` markers when it is
    compressed (``is_compressed``); a truncated stream raises ``EOFError``."""
    if is_compressed(url):
        yield from frames(raw, compression_name(url), frame_ends=True)
    else:
        while chunk := raw.read(READ_CHUNK):
            yield chunk


def frames(raw: IO[bytes], kind: str, frame_ends: bool = False) -> Iterator[bytes | object | None]:
    """Decompress ``raw`` (``kind``: gzip, bz2, xz or zstd) member after member (frame after frame; a WARC
    holds one record per member). Corrupt data yields ``GAP`` once, and decoding resumes at the next
    member's magic in the compressed bytes; input that ends inside a member raises ``EOFError``; with
    ``frame_ends``, ``MEMBER_END`` follows each member whose checksum held. xz's stream padding (zero
    bytes between and after streams) is passed over. A zstd frame written without a checksum
    (zstandard's default; the zstd tool writes one) is only as good as its decoding."""
    magic, new, inflate, errors = _codec(kind)
    data, decoder, fresh, skipping = b"", None, False, False
    while True:
        if decoder is None and kind == "xz":
            data = data.lstrip(b"\0")
        if not data:
            data = raw.read(READ_CHUNK)
            if not data:
                if decoder is not None:
                    raise EOFError(f"{kind} stream ended inside a member (truncated file)")
                return
            fresh = decoder is None
        if decoder is None:
            decoder = new()
        try:
            for out in inflate(decoder, data):
                skipping = False
                yield out
        except errors:
            if not skipping:
                skipping = True
                yield GAP
            at = data.find(magic, 1 if fresh else 0)
            while at < 0:  # read on until the next member's magic
                more = raw.read(READ_CHUNK)
                if not more:
                    return
                data = data[1 - len(magic):] + more
                at = data.find(magic)
            data, decoder, fresh = data[at:], None, True
            continue
        if decoder.eof:
            data, decoder, fresh = decoder.unused_data, None, True
            if frame_ends:
                yield MEMBER_END
        else:
            data = b""


def _inflate_zlib(decoder: Any, data: bytes) -> Iterator[bytes]:
    """``data`` through a zlib decoder, output capped per call (one record never sits in memory whole)."""
    out = decoder.decompress(data, READ_CHUNK)
    while True:
        if out:
            yield out
        if decoder.eof:
            return
        if decoder.unconsumed_tail:
            out = decoder.decompress(decoder.unconsumed_tail, READ_CHUNK)
        elif len(out) == READ_CHUNK:  # input used up, output may still be pending
            out = decoder.decompress(b"", READ_CHUNK)
        else:
            return


def _inflate_buffered(decoder: Any, data: bytes) -> Iterator[bytes]:
    """``data`` through a bz2 or lzma decoder (which buffers unread input itself), output capped per call."""
    out = decoder.decompress(data, READ_CHUNK)
    while True:
        if out:
            yield out
        if decoder.eof or decoder.needs_input:
            return
        out = decoder.decompress(b"", READ_CHUNK)


ZSTD_BLOCK_MAX = 128 << 10  # the most one zstd block regenerates (RFC 8878 §3.1.1.2)


class _ZstdFrame:
    """One zstd frame's decoder, fed a block at a time: zstandard's decompressobj takes no output cap, and a
    block regenerates at most ``ZSTD_BLOCK_MAX``, so a few bytes of run-length blocks cannot inflate to
    gigabytes in one call. It walks the frame's structure (header, block headers and sizes,
    checksum; a skippable frame's size) to find where each block ends; the decoder validates all of it, so
    a corrupt header that misleads the walk is still caught there, and at worst fed whole."""

    def __init__(self, decompressobj: Any):
        self._decoder = decompressobj
        self._head = b""  # the frame or block header being read
        self._state = "frame"  # frame | block | body (of a block, skippable frame or checksum) | end
        self._body = 0  # bytes of the current body still to pass
        self._last = self._checksum = False
        self.unused_data = b""

    @property
    def eof(self) -> bool:
        return self._decoder.eof

    def inflate(self, data: bytes) -> Iterator[bytes]:
        """``data`` through the decoder a block at a time, the output given out in chunks of at most
        ``READ_CHUNK``, and at the end of ``data`` or the frame, as the other formats' decoders give it:
        so a frame that fails its checksum before either gives out nothing."""
        held, size, start = [], 0, 0
        for end in self._block_ends(data):
            if end == start:  # a block ended at the end of ``data``
                continue
            if out := self._decoder.decompress(data[start:end]):
                held.append(out)
                size += len(out)
            start = end
            if self._decoder.eof:
                self.unused_data = self._decoder.unused_data + data[end:]
                break
            if size > READ_CHUNK - ZSTD_BLOCK_MAX:
                yield b"".join(held)
                held, size = [], 0
        if held:
            yield b"".join(held)

    def _block_ends(self, data: bytes) -> Iterator[int]:
        """The positions in ``data`` where a block (or the frame) ends, then its end."""
        i = 0
        while i < len(data) and self._state != "end":
            if self._state == "body":
                step = min(self._body, len(data) - i)
                i, self._body = i + step, self._body - step
                if not self._body:
                    self._end_of_body()
                    yield i
                continue
            self._head += data[i:i + 1]
            i += 1
            self._read_head()
        yield len(data)

    def _read_head(self) -> None:
        head = self._head
        if self._state == "frame":
            if len(head) < 5:
                return
            if 0x184D2A50 <= int.from_bytes(head[:4], "little") <= 0x184D2A5F:  # skippable frame: 4-byte size
                if len(head) == 8:
                    self._state, self._body, self._head = "body", int.from_bytes(head[4:], "little"), b""
                    self._last, self._checksum = True, False
                    if not self._body:
                        self._end_of_body()
                return
            descriptor = head[4]
            single_segment = descriptor >> 5 & 1
            content_size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
            size = 5 + (not single_segment) + (0, 1, 2, 4)[descriptor & 3] + content_size
            if len(head) == size:
                self._state, self._checksum, self._head = "block", bool(descriptor >> 2 & 1), b""
        elif self._state == "block" and len(head) == 3:
            header = int.from_bytes(head, "little")
            kind, size = header >> 1 & 3, header >> 3
            self._state, self._last, self._head = "body", bool(header & 1), b""
            self._body = 1 if kind == 1 else size  # a run-length block holds its one byte
            if not self._body:
                self._end_of_body()

    def _end_of_body(self) -> None:
        if not self._last:
            self._state = "block"
        elif self._checksum:
            self._state, self._body, self._checksum = "body", 4, False
        else:
            self._state = "end"


Codec = tuple[bytes, Callable[[], Any], Callable[[Any, bytes], Iterator[bytes]], tuple[type[Exception], ...]]


def _codec(kind: str) -> Codec:
    """Magic, decoder factory, inflate function and decoding errors of a stream format."""
    if kind == "gzip":
        return STREAM_MAGIC[kind], lambda: zlib.decompressobj(31), _inflate_zlib, (zlib.error,)
    if kind == "bz2":  # bz2 reports bad data as OSError("Invalid data stream")
        return STREAM_MAGIC[kind], bz2.BZ2Decompressor, _inflate_buffered, (OSError,)
    if kind == "xz":
        return STREAM_MAGIC[kind], lzma.LZMADecompressor, _inflate_buffered, (lzma.LZMAError,)
    if kind == "zstd":
        import zstandard  # imported when a zstd file is read, not for every format

        decompressor = zstandard.ZstdDecompressor()
        return (STREAM_MAGIC[kind], lambda: _ZstdFrame(decompressor.decompressobj()), _ZstdFrame.inflate,
                (zstandard.ZstdError,))
    raise ValueError(f"unknown compression {kind!r}")
