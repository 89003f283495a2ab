"""The one decoder loop for gzip, bz2, xz and zstd (``tasks/compression.py``), on concatenated streams."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma

import pytest
import zstandard

from tasks.compression import GAP, MEMBER_END, READ_CHUNK, CorruptData, checked_stream, frames, sniff_compression

COMPRESS = {
    "gzip": lambda b: gzip.compress(b, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zstd": zstandard.ZstdCompressor(write_checksum=True).compress,
}
PARTS = [b"first part\n" * 300, b"second part\n" * 300, b"third part\n" * 300]


def decoded(data: bytes, kind: str) -> list:
    """The chunk stream of ``data``, text joined between markers: [b"...", MEMBER_END, GAP, ...]."""
    out: list = []
    for chunk in frames(io.BytesIO(data), kind, frame_ends=True):
        if chunk is GAP or chunk is MEMBER_END:
            out.append(chunk)
        elif out and isinstance(out[-1], bytes):
            out[-1] += chunk
        else:
            out.append(chunk)
    return out


@pytest.mark.parametrize("kind", COMPRESS)
def test_concatenated_streams_are_read_whole_each_end_marked(kind):
    """pbzip2 writes a bz2 stream per block, pigz and WARC files a gzip member per record, zstd a frame each."""
    data = b"".join(COMPRESS[kind](p) for p in PARTS)
    assert sniff_compression(io.BytesIO(data)) == kind
    assert decoded(data, kind) == [PARTS[0], MEMBER_END, PARTS[1], MEMBER_END, PARTS[2], MEMBER_END]
    assert checked_stream(io.BytesIO(data), kind).read() == b"".join(PARTS)


def test_xz_stream_padding_between_and_after_streams_is_passed_over():
    data = lzma.compress(PARTS[0]) + b"\0" * 8 + lzma.compress(PARTS[1]) + b"\0" * 4
    assert checked_stream(io.BytesIO(data), "xz").read() == PARTS[0] + PARTS[1]


@pytest.mark.parametrize("kind", COMPRESS)
def test_a_corrupt_stream_costs_only_itself_decoding_resumes_at_the_next_magic(kind):
    streams = [COMPRESS[kind](p) for p in PARTS]
    middle = bytearray(streams[1])
    middle[len(middle) // 2] ^= 0xFF
    data = streams[0] + bytes(middle) + streams[2]
    out = decoded(data, kind)
    assert out[:2] == [PARTS[0], MEMBER_END] and out[-2:] == [PARTS[2], MEMBER_END]
    assert out.count(GAP) == 1 and MEMBER_END not in out[2:-2]  # the broken stream is never taken as checked
    with pytest.raises(CorruptData):
        checked_stream(io.BytesIO(data), kind).read()


@pytest.mark.parametrize("kind", COMPRESS)
def test_a_truncation_raises_after_the_bytes_decoded_before_it(kind):
    data = b"".join(COMPRESS[kind](p) for p in PARTS[:2])
    reader = checked_stream(io.BytesIO(data[:-3]), kind)
    assert reader.read(len(PARTS[0])) == PARTS[0]
    with pytest.raises(EOFError):
        reader.read()


@pytest.mark.parametrize("kind", COMPRESS)
def test_output_is_capped_per_chunk_however_well_the_data_compresses(kind):
    """64 MiB of zeros is a few kB compressed: no decoded chunk may exceed one read chunk (zstd's decoder
    takes no cap: it is fed a block at a time)."""
    zeros = COMPRESS[kind](bytes(64 << 20))
    sizes = [len(c) for c in frames(io.BytesIO(zeros), kind) if c is not GAP]
    assert sum(sizes) == 64 << 20 and max(sizes) <= READ_CHUNK


def test_zstd_streamed_frames_and_a_skippable_frame_are_walked_block_by_block():
    # a streamed frame holds no content size and many blocks; a skippable frame (magic 0x184D2A5?) carries no data
    streamed = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    first = streamed.compress(PARTS[0] * 200) + streamed.flush()
    skippable = (0x184D2A53).to_bytes(4, "little") + (6).to_bytes(4, "little") + b"ignore"
    plain = zstandard.ZstdCompressor(write_checksum=False).compress(PARTS[1])
    data = first + skippable + plain + COMPRESS["zstd"](PARTS[2])
    chunks = list(frames(io.BytesIO(data), "zstd", frame_ends=True))
    assert GAP not in chunks and max(len(c) for c in chunks if c is not MEMBER_END) <= READ_CHUNK
    assert decoded(data, "zstd") == [PARTS[0] * 200, MEMBER_END, MEMBER_END, PARTS[1], MEMBER_END, PARTS[2],
                                     MEMBER_END]
    # the walk holds its place across reads however the input is cut: here 7 bytes at a time
    assert checked_stream(Trickle(data, 7), "zstd").read() == PARTS[0] * 200 + PARTS[1] + PARTS[2]


class Trickle(io.RawIOBase):
    """A stream that gives out at most ``step`` bytes per read."""

    def __init__(self, data: bytes, step: int):
        self._data, self._step = memoryview(data), step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._step, len(self._data))
        buffer[:n], self._data = self._data[:n], self._data[n:]
        return n
