"""WARC and WET files → Documents, every record accounted for: ``in`` = ``out`` + every
``dropped.read_*`` and ``failed.read_*`` (the counters are listed in ``tasks/ingest/readers.py``).

Records are framed by smelt (``warc_framer``) and parsed by ``warc_records``. With
``reader.warc_engine = "fastwarc"`` a .gz archive is inflated by FastWARC's gzip reader, checked
member by member (``_read_fast_gzip``); at any doubt smelt's own decompression reads on from the
last record given out (``_read_framed``), so both engines count every fault alike. Either way a
record from gzip or zstd data goes out only once its member's (frame's) checksum has held.
"""

from __future__ import annotations

import io
import logging
import struct
import zlib
from collections.abc import Callable, Generator, Iterator
from typing import Any

import fsspec

from tasks.compression import READ_CHUNK, UNVERIFIED_HOLD_CHARS, compression_name, decompressed_chunks, is_compressed
from tasks.counters import Stats
from tasks.objectstore import remote_options
from tasks.documents import Document
from tasks.ingest.config import ReaderConfig
from tasks.ingest.warc_framer import WARC_MAGIC, Framed, WarcFramer
from tasks.ingest.warc_records import framed_document

log = logging.getLogger(__name__)


_HEAD_SLACK = 1 << 16  # bytes of HTTP head and framing held beyond max_payload_bytes


def read_warc(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """HTML pages from WARC ``response`` records; ``text`` holds the HTML (``meta.format = "html"``)."""
    return _read_archive(url, cfg, stats, record_type="response")


def read_wet(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Plain text from WET ``conversion`` records (already extracted; ``meta.format = "text"``)."""
    return _read_archive(url, cfg, stats, record_type="conversion")


def _read_archive(url: str, cfg: ReaderConfig, stats: Stats, record_type: str) -> Iterator[Document]:
    """Documents of the ``record_type`` records of one WARC/WET file; every record is accounted for.

    Records are framed here (``WarcFramer``), not by warcio's iterator, so a bad record costs only
    itself: a lying or missing Content-Length, a malformed header block or a corrupt gzip member
    is counted and reading resumes at the next record. warcio or FastWARC (``reader.warc_engine``)
    then parses each framed record's HTTP head and body; both give the same documents and counts.
    ``in`` = ``out`` + every ``dropped.read_*`` and ``failed.read_*``.
    """
    start = 0  # where smelt's own decompression starts framing
    if cfg.warc_engine == "fastwarc" and url.lower().endswith(".gz"):
        start = yield from _read_fast_gzip(url, cfg, stats, record_type)
        if start is None:
            return
    yield from _read_framed(url, cfg, stats, record_type, start)


def _read_framed(url: str, cfg: ReaderConfig, stats: Stats, record_type: str, start: int) -> Iterator[Document]:
    """The records from ``start`` (those before it were given out already), through smelt's own
    decompression. From gzip or zstd data a record is given out once every member (frame) it lies in
    has passed its checksum (``WarcFramer.verified``; up to ``UNVERIFIED_HOLD_CHARS`` held); one that
    overlaps a corrupt member's output is dropped, counted ``failed.read_unverified_record``. A record
    cut by a truncation is given out as framed, and so is every record of a plain file."""
    hold = is_compressed(url)
    with _open_archive(url, cfg) as raw:
        framer = WarcFramer(decompressed_chunks(url, raw), cfg.max_payload_bytes + _HEAD_SLACK, compression_name(url), start)
        held: list[tuple[Framed, Document | None, Stats, list]] = []
        held_text = 0
        for record in framer:
            counts, warnings = Stats(), []
            doc = _account(url, record, cfg, counts, record_type, lambda *args: warnings.append(args))
            held.append((record, doc, counts, warnings))
            held_text += len(doc.text) if doc is not None else 0
            while held and (not hold or held[0][0].failure is not None
                            or _in_corrupt_span(held[0][0], framer.corrupt_spans)
                            or held[0][0].end + len(WARC_MAGIC) <= framer.verified
                            or held_text > UNVERIFIED_HOLD_CHARS + cfg.max_payload_bytes):
                held_text -= len(held[0][1].text) if held[0][1] is not None else 0
                yield from _settle(url, held.pop(0), framer.corrupt_spans, stats)
        for entry in held:  # the end: verified, or decoded before a truncation
            yield from _settle(url, entry, framer.corrupt_spans, stats)


def _settle(url: str, entry: tuple[Framed, Document | None, Stats, list], corrupt_spans: list[tuple[int, int]],
            stats: Stats) -> Iterator[Document]:
    """A held record given out, or dropped and counted when it overlaps a corrupt member's output."""
    record, doc, counts, warnings = entry
    if record.failure is None and _in_corrupt_span(record, corrupt_spans):
        _count_unverified(url, record, counts, stats)
    else:
        yield from _give_out(doc, counts, warnings, stats)


def _in_corrupt_span(record: Framed, spans: list[tuple[int, int]]) -> bool:
    return any(record.offset < gap and record.end > start for start, gap in spans)


def _count_unverified(url: str, record: Framed, counts: Stats, stats: Stats) -> None:
    """A record framed from a gzip member or zstd frame whose checksum then failed: never given out."""
    if counts.get("in"):
        stats.add("in")
        stats.add("failed.read_unverified_record")
        log.warning("%s: record at offset %d dropped: its compressed data failed its checksum", url, record.offset)
    else:  # a request or metadata record: seen, and nothing of it is read
        stats.add("other_records", counts.get("other_records", 0))


def _open_archive(url: str, cfg: ReaderConfig) -> Any:
    return fsspec.open(url, "rb", **remote_options(url, cfg.connect_timeout_s, cfg.read_timeout_s))


def _account(url: str, record: Framed, cfg: ReaderConfig, stats: Stats, record_type: str,
             warn: Callable[..., None] = log.warning) -> Document | None:
    """Count one framed record and make its document (None: none, with the reason counted)."""
    if record.failure is not None:
        stats.add("in")
        stats.add(f"failed.read_{record.failure}")
        warn("%s: record at offset %d skipped (%s); reading on from the next record", url, record.offset, record.failure)
        return None
    if record.warc_type != record_type:
        stats.add("other_records")
        return None
    stats.add("in")
    if record.body is None:
        stats.add("dropped.read_too_large")
        return None
    doc = framed_document(url, record, cfg, stats)
    if doc is not None:
        stats.add("out")
    return doc


def _read_fast_gzip(url: str, cfg: ReaderConfig, stats: Stats, record_type: str) -> Generator[Document, None, int | None]:
    """The records of a .gz archive inflated by FastWARC's gzip reader (twice as fast as zlib here),
    framed and counted as always; returns None when the file is done, else the offset from which
    smelt's own decompression must read on.

    FastWARC's reader raises on corrupt data but passes a truncated file silently, and what it
    gave out before a corrupt member's checksum failed may be wrong. So a record is given out (its
    document yielded, its counts added) only once the reader has moved past every gzip member it
    lies in (their checksums held), and the file's last member is proven complete
    (``VerifiedGzip.ends_complete``: a lone member by its trailer, else inflated again by zlib). At
    the first doubt (a corrupt member, an incomplete end, too much held back) the
    records not given out are dropped uncounted and the caller reads on from the end of the last
    one given out, with smelt's decompression, so every fault is counted exactly as without FastWARC.
    """
    from fastwarc.stream_io import GzipReader

    done = 0
    held: list[tuple[int, Document | None, Stats, list]] = []  # framed, not given out: (end, document, counts, warnings)
    held_text = 0
    with _open_archive(url, cfg) as raw:
        source = VerifiedGzip(GzipReader(raw))
        try:
            for record in WarcFramer(iter(source), cfg.max_payload_bytes + _HEAD_SLACK, "gzip"):
                counts, warnings = Stats(), []
                doc = _account(url, record, cfg, counts, record_type, lambda *args: warnings.append(args))
                held.append((record.end, doc, counts, warnings))
                held_text += len(doc.text) if doc is not None else 0
                while held and held[0][0] + len(WARC_MAGIC) <= source.verified:  # the framer looked that far
                    done, doc, counts, warnings = held.pop(0)
                    held_text -= len(doc.text) if doc is not None else 0
                    yield from _give_out(doc, counts, warnings, stats)
                if held_text > UNVERIFIED_HOLD_CHARS + cfg.max_payload_bytes:  # one huge member: nothing verified
                    return done
            if not source.ends_complete(raw):
                return done
        except OSError as e:
            if type(e) is not OSError:  # FastWARC's decoding errors are plain OSErrors; a network error is not data
                raise
            return done
    for _, doc, counts, warnings in held:
        yield from _give_out(doc, counts, warnings, stats)
    return None


def _give_out(doc: Document | None, counts: Stats, warnings: list, stats: Stats) -> Iterator[Document]:
    stats += counts
    for args in warnings:
        log.warning(*args)
    if doc is not None:
        yield doc


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
