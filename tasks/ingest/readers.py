"""Readers: raw crawl files at any fsspec URL → a stream of ``Document``s.

Formats (chosen from the file name unless ``reader.format`` says): WARC response records (raw HTML,
``meta.format = "html"``, text extracted later), WET conversion records (plain text), JSONL and
Parquet with a ``text`` field (optional ``id``, ``url``, ``source``, ``meta``).

Everything streams: one record is in memory at a time and payloads over ``max_payload_bytes`` are
skipped without being held, so a 1 GB WARC file never sits in memory whole. Compression is
inferred from the name (``.gz``, ``.zst``) and decompressed here, not by warcio, whose decompressor
passes a truncated file silently; record offsets are therefore positions in the uncompressed
stream. With ``reader.warc_engine = "fastwarc"`` a .gz archive is inflated by FastWARC's gzip
reader (checked member by member, ``_read_fast_gzip``) and each record's HTTP head parsed by
FastWARC; either engine gives the same documents and counts.

Data faults are counted and skipped, never raised (DESIGN.md §3). Counters:
``in`` (candidate records: WARC responses, WET conversions, JSONL lines, Parquet rows),
``out`` (documents yielded), ``other_records`` (WARC request/metadata/… records),
``decoded_with_replacements`` (pages kept with a few undecodable bytes replaced),
``dropped.read_{non_html,http_status,empty,too_large,undecodable}``,
``failed.read_{truncated_gzip,truncated_zstd,corrupt_file,bad_record}``, ``bytes_in``.
Network and permission errors are not data faults: they raise, so the work item is retried.
"""

from __future__ import annotations

import codecs
import dataclasses
import contextlib
import gzip
import hashlib
import io
import json
import logging
import re
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import IO, Any

import fsspec

from tasks.datasets import Stats, filesystem, normalize_url, remote_options
from tasks.ingest.base import Document
from tasks.ingest.config import ReaderConfig

log = logging.getLogger(__name__)

# Longest suffix first: ".warc.wet.gz" is WET, not WARC.
FORMAT_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".warc.wet.gz", "wet"), (".wet.gz", "wet"), (".wet", "wet"),
    (".warc.gz", "warc"), (".warc", "warc"),
    (".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl", "jsonl"),
    (".json.gz", "jsonl"), (".ndjson", "jsonl"),
    (".parquet", "parquet"),
)
GLOB_CHARS = "*?["
META_CHARSET_RE = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
READ_CHUNK = 1 << 20


class InputError(ValueError):
    """An input URL that names nothing readable; the message names it."""


class RemoteReadError(OSError):
    """A remote input timed out or was cut short; an OSError, so the work item is retried."""


# --------------------------------------------------------------------------------------------
# Inputs


def input_format(url: str, configured: str = "auto") -> str | None:
    """The reader for ``url``: ``configured`` unless "auto", else from the file name (None: unknown)."""
    if configured != "auto":
        return configured
    name = url.lower().rsplit("/", 1)[-1]
    return next((fmt for suffix, fmt in FORMAT_SUFFIXES if name.endswith(suffix)), None)


def expand_inputs(urls: str | Sequence[str]) -> list[str]:
    """Input files as absolute URLs: globs expanded, folders listed (known formats only), order kept.

    A file named twice (overlapping globs) is read once. Raises ``InputError`` naming the first URL
    that matches nothing or cannot be read.
    """
    out: dict[str, None] = {}
    for url in [urls] if isinstance(urls, str) else list(urls):
        url = normalize_url(url)
        try:
            out.update(dict.fromkeys(_expand_one(url)))
        except (ImportError, OSError) as e:  # a missing s3fs/gcsfs, a refused connection, no permission
            raise InputError(f"cannot read input {url}: {e}") from e
        except ValueError as e:  # fsspec: "Protocol not known"
            if isinstance(e, InputError):
                raise
            raise InputError(f"cannot read input {url}: {e}") from e
        except Exception as e:  # the store's own errors (botocore's NoCredentialsError is no OSError)
            if type(e).__module__.split(".")[0] not in ("botocore", "aiobotocore", "google", "aiohttp"):
                raise
            raise InputError(f"cannot read input {url}: {e}") from e
    return list(out)


def _expand_one(url: str) -> list[str]:
    fs, path = filesystem(url)
    if url.startswith(("http://", "https://")):  # no listing over HTTP: a URL names one file
        if not fs.exists(url):
            raise InputError(f"input {url} does not exist (HTTP error or not found)")
        return [url]
    if any(ch in path for ch in GLOB_CHARS):
        found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
        if not found:
            raise InputError(f"input {url} matches no files")
    elif fs.isdir(path):
        found = sorted(p for p in fs.find(path) if input_format(p) is not None)
        if not found:
            raise InputError(f"input folder {url} holds no WARC, WET, JSONL or Parquet files")
    elif fs.exists(path):
        found = [path]
    else:
        raise InputError(f"input {url} does not exist")
    return [fs.unstrip_protocol(p) for p in found]


@contextlib.contextmanager
def open_input(url: str) -> Iterator[IO[bytes]]:
    """A binary stream of ``url``'s uncompressed bytes; truncated gzip/zstd raise ``EOFError``."""
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        name = url.lower()
        if name.endswith(".gz"):  # not gzip.GzipFile: it drops the lines it had decoded when it meets a truncation
            with io.BufferedReader(_ChunkReader(_gzip_members(raw)), buffer_size=READ_CHUNK) as stream:
                yield stream
        elif name.endswith(".zst"):
            with io.BufferedReader(ZstdReader(raw), buffer_size=READ_CHUNK) as stream:
                yield stream
        else:
            yield raw


class _ChunkReader(io.RawIOBase):
    """A binary stream over ``_gzip_members``: corrupt data raises ``zlib.error`` where it starts,
    truncation raises ``EOFError`` after every byte decoded before it."""

    def __init__(self, chunks: Iterator[bytes | None]):
        self._chunks, self._out = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk = next(self._chunks, b"")
            if chunk is _GAP:
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


def input_size(url: str) -> int:
    fs, path = filesystem(url)
    return int(fs.size(path) or 0)


def read_documents(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Documents of one input file, read with the reader its format calls for."""
    url = normalize_url(url)
    fmt = input_format(url, cfg.format)
    if fmt is None:
        raise InputError(f"cannot tell the format of {url} from its name; set reader.format to warc, wet, jsonl or parquet")
    stats.add("bytes_in", input_size(url))
    reader = {"warc": read_warc, "wet": read_wet, "jsonl": read_jsonl, "parquet": read_parquet}[fmt]
    try:
        yield from reader(url, cfg, stats)
    except TimeoutError as e:
        raise RemoteReadError(f"reading {url} timed out (reader.connect_timeout_s={cfg.connect_timeout_s}, "
                              f"reader.read_timeout_s={cfg.read_timeout_s}): {str(e) or type(e).__name__}") from e
    except Exception as e:
        if type(e).__module__.split(".")[0] not in ("aiohttp", "botocore", "urllib3"):
            raise
        raise RemoteReadError(f"reading {url} failed part-way (the server cut the transfer short?): {e}") from e


def doc_id(*parts: object) -> str:
    """Deterministic document id: the same record always gets the same id."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------
# Decoding


def decode_payload(payload: bytes, declared: str, cfg: ReaderConfig) -> tuple[str, str, int] | None:
    """(text, charset, replaced characters) of a web payload, or None when it does not decode.

    First the HTTP header's charset, ``<meta charset>`` and UTF-8, strictly. Then the same with the
    few bad bytes of a damaged page replaced (at most ``max_replacement_frac`` of its characters).
    Then charset_normalizer on the first ``charset_detection_bytes``, for a page whose declared
    charset is simply wrong. Text holding NUL characters is binary data, not a page.
    """
    candidates = _charset_candidates(payload, declared)
    for codec in candidates:
        try:
            return _checked(payload.decode(codec), codec, 0, cfg)
        except UnicodeDecodeError:
            continue
    repaired = [(payload.decode(codec, "replace"), codec) for codec in candidates]
    text, codec = min(repaired, key=lambda tc: tc[0].count("\ufffd"))
    if (decoded := _checked(text, codec, text.count("\ufffd"), cfg)) is not None:
        return decoded
    import charset_normalizer

    best = charset_normalizer.from_bytes(payload[: cfg.charset_detection_bytes]).best()
    if best is None or _codec_name(best.encoding) is None:
        return None
    text = payload.decode(best.encoding, "replace")
    return _checked(text, best.encoding, text.count("\ufffd"), cfg)


def _charset_candidates(payload: bytes, declared: str) -> list[str]:
    names = [declared]
    if match := META_CHARSET_RE.search(payload[:4096]):
        names.append(match.group(1).decode("ascii"))
    names.append("utf-8")
    return list(dict.fromkeys(c for name in names if (c := _codec_name(name)) is not None))


def _checked(text: str, codec: str, replaced: int, cfg: ReaderConfig) -> tuple[str, str, int] | None:
    if replaced > cfg.max_replacement_frac * len(text) or "\x00" in text:
        return None
    return text, codec, replaced


def _codec_name(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("\"'")).name
    except LookupError:
        return None


# --------------------------------------------------------------------------------------------
# WARC and WET


def read_warc(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """HTML pages from WARC ``response`` records; ``text`` holds the HTML (``meta.format = "html"``)."""
    return _read_archive(url, cfg, stats, record_type="response")


def read_wet(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Plain text from WET ``conversion`` records (already extracted; ``meta.format = "text"``)."""
    return _read_archive(url, cfg, stats, record_type="conversion")


def _read_archive(url: str, cfg: ReaderConfig, stats: Stats, record_type: str) -> Iterator[Document]:
    """Documents of the ``record_type`` records of one WARC/WET file; every record is accounted for.

    Records are framed here (``_WarcFramer``), not by warcio's iterator, so a bad record costs only
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
    with _open_archive(url, cfg) as raw:
        framer = _WarcFramer(_decompressed_chunks(url, raw), cfg.max_payload_bytes + _HEAD_SLACK, _compression(url), start)
        for record in framer:  # from ``start``: the records before it were given out above
            if (doc := _account(url, record, cfg, stats, record_type)) is not None:
                yield doc


def _open_archive(url: str, cfg: ReaderConfig) -> Any:
    return fsspec.open(url, "rb", **remote_options(url, cfg.connect_timeout_s, cfg.read_timeout_s))


def _account(url: str, record: _Framed, cfg: ReaderConfig, stats: Stats, record_type: str,
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
    doc = _framed_document(url, record, cfg, stats)
    if doc is not None:
        stats.add("out")
    return doc


_HOLD_TEXT = 16 << 20  # characters of documents held back (beyond one of the largest) while their gzip members are unverified


def _read_fast_gzip(url: str, cfg: ReaderConfig, stats: Stats, record_type: str) -> Generator[Document, None, int | None]:
    """The records of a .gz archive inflated by FastWARC's gzip reader (twice as fast as zlib here),
    framed and counted as always; returns None when the file is done, else the offset from which
    smelt's own decompression must read on.

    FastWARC's reader raises on corrupt data but passes a truncated file silently, and what it
    gave out before a corrupt member's checksum failed may be wrong. So a record is given out (its
    document yielded, its counts added) only once the reader has moved past every gzip member it
    lies in (their checksums held), and the file's last member is inflated again by zlib to prove
    it complete. At the first doubt (a corrupt member, an incomplete end, too much held back) the
    records not given out are dropped uncounted and the caller reads on from the end of the last
    one given out, with smelt's decompression, so every fault is counted exactly as without FastWARC.
    """
    from fastwarc.stream_io import GzipReader

    done = 0
    held: list[tuple[int, Document | None, Stats, list]] = []  # framed, not given out: (end, document, counts, warnings)
    held_text = 0
    with _open_archive(url, cfg) as raw:
        source = _VerifiedGzip(GzipReader(raw))
        try:
            for record in _WarcFramer(iter(source), cfg.max_payload_bytes + _HEAD_SLACK, "gzip"):
                counts, warnings = Stats(), []
                doc = _account(url, record, cfg, counts, record_type, lambda *args: warnings.append(args))
                held.append((record.end, doc, counts, warnings))
                held_text += len(doc.text) if doc is not None else 0
                while held and held[0][0] + len(_WARC_MAGIC) <= source.verified:  # the framer looked that far
                    done, doc, counts, warnings = held.pop(0)
                    held_text -= len(doc.text) if doc is not None else 0
                    yield from _give_out(doc, counts, warnings, stats)
                if held_text > _HOLD_TEXT + cfg.max_payload_bytes:  # one huge gzip member: nothing verified before its end
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


class _VerifiedGzip:
    """FastWARC's gzip reader as chunks, and how much of its output is verified (``verified``, an
    uncompressed offset): the members it has moved past had their checksums checked."""

    def __init__(self, reader: Any) -> None:
        self._reader, self._member, self._pos, self.verified = reader, 0, 0, 0

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._reader.read(READ_CHUNK):
            before, self._pos = self._pos, self._pos + len(chunk)
            member = self._reader.frame_start_position()
            if member != self._member:  # the member that held byte ``before`` ended in this chunk
                self._member, self.verified = member, before
            yield chunk

    def ends_complete(self, raw: IO[bytes]) -> bool:
        """Whether the last gzip member (from its compressed offset to the end of file) is whole."""
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


_HEAD_SLACK = 1 << 16  # bytes of HTTP head and framing held beyond max_payload_bytes
_MAX_WARC_HEAD = 1 << 16
_WARC_MAGIC = b"WARC/1."
_WARC_DATE_RE = re.compile(rb"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?)?$")
_GZIP_MAGIC = b"\x1f\x8b\x08"
_GAP = None  # in a chunk stream: corrupt compressed data was skipped here
_END = 1 << 62


def _decompressed_chunks(url: str, raw: IO[bytes]) -> Iterator[bytes | None]:
    """The uncompressed bytes of ``raw`` in chunks; a truncated gzip/zstd stream raises ``EOFError``."""
    name = url.lower()
    if name.endswith(".gz"):
        yield from _gzip_members(raw)
        return
    stream = io.BufferedReader(ZstdReader(raw), buffer_size=READ_CHUNK) if name.endswith(".zst") else raw
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def _gzip_members(raw: IO[bytes]) -> Iterator[bytes | None]:
    """Decompress gzip member after member (a WARC holds one record per member). Corrupt data
    yields ``_GAP`` once, and decoding resumes at the next gzip header in the compressed bytes."""
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
                yield _GAP
            at = data.find(_GZIP_MAGIC, 1 if fresh else 0)
            while at < 0:  # read on until the next member header
                more = raw.read(READ_CHUNK)
                if not more:
                    return
                data = data[-2:] + more
                at = data.find(_GZIP_MAGIC)
            data, decoder, fresh = data[at:], None, True
            continue
        if decoder.eof:
            data, decoder, fresh = decoder.unused_data, None, True
        else:
            data = b""


@dataclasses.dataclass
class _Framed:
    """One record as framed: its WARC head and body, or why it could not be read."""

    offset: int
    warc_type: str = ""
    head: dict[str, bytes] = dataclasses.field(default_factory=dict)
    raw_head: bytes = b""
    body: bytes | None = None  # None: larger than the framer holds
    failure: str | None = None
    end: int = 0  # where the framer reads on after this record


class _WarcFramer:
    """Splits an uncompressed WARC byte stream into records, resynchronising after a bad one.

    A record is ``WARC/1.x`` + header lines + CRLF + Content-Length bytes + CRLF CRLF. When the
    bytes after the body are not that trailer, the length lied: the next record is the next
    ``WARC/1.`` at a line start (searched in the held bytes first, then onward). Offsets are
    positions in the uncompressed stream. Memory: one record of at most ``retain`` bytes; a
    longer body is streamed past (and a ``WARC/1.`` header line inside it ends it as a lie).
    """

    def __init__(self, chunks: Iterator[bytes | None], retain: int, compression: str, start: int = 0) -> None:
        self._chunks, self._retain, self._compression, self._start = chunks, retain, compression, start
        self._buf, self._base = bytearray(), 0  # _buf[0] is stream offset _base
        self._gaps: list[int] = []  # offsets where corrupt compressed data was skipped
        self._eof = self._truncated = self._truncation_counted = False

    # -- the byte window -------------------------------------------------------------------

    def _more(self) -> bool:
        while not self._eof:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._eof = True
            except EOFError:
                self._eof = self._truncated = True
            else:
                if chunk is _GAP:
                    self._gaps.append(self._base + len(self._buf))
                    continue
                self._buf += chunk
                return True
        return False

    @property
    def _end(self) -> int:
        return self._base + len(self._buf)

    def _have(self, end: int) -> bool:
        while self._end < end:
            if not self._more():
                return False
        return True

    def _bytes(self, start: int, end: int) -> bytes:
        return bytes(self._buf[start - self._base: end - self._base])

    def _forget(self, before: int) -> None:
        if before - self._base > READ_CHUNK:
            del self._buf[: before - self._base]
            self._base = before

    def _find(self, needle: bytes, start: int, limit: int = _END) -> int:
        """Offset of ``needle`` in ``[start, limit)``, reading on as needed (and forgetting what it passed); -1 if none."""
        while True:
            end = min(limit, self._end)
            at = self._buf.find(needle, start - self._base, end - self._base)
            if at >= 0:
                return at + self._base
            if end >= limit or not self._more():
                return -1
            start = max(start, end - len(needle) + 1)
            self._forget(start)

    def _next_record(self, start: int, limit: int = _END, boundary: bool = False) -> int:
        """Offset of the next ``WARC/1.`` at a line start from ``start`` (or at ``start`` itself when it
        follows skipped data: ``boundary``); -1 if there is none before ``limit``."""
        if boundary and self._have(start + len(_WARC_MAGIC)) and self._bytes(start, start + len(_WARC_MAGIC)) == _WARC_MAGIC:
            return start
        at = self._find(b"\n" + _WARC_MAGIC, max(start - 1, 0), limit)
        return at + 1 if at >= 0 else -1

    # -- records -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[_Framed]:
        pos = self._start
        while self._end < pos:  # records before ``start`` were read already: skip their bytes unframed
            self._base, self._buf = self._end, bytearray()
            if not self._more():
                return
        del self._buf[: pos - self._base]
        self._base = pos
        while True:
            self._forget(pos)
            while self._have(pos + 1) and self._buf[pos - self._base] in b"\r\n":
                pos += 1
            while self._gaps and self._gaps[0] <= pos:  # whole members lost before this record
                yield _Framed(self._gaps.pop(0), failure="corrupt_gzip", end=pos)
            if not self._have(pos + 1):
                if self._truncated and not self._truncation_counted:
                    yield _Framed(pos, failure=f"truncated_{self._compression}", end=pos)
                return
            record, pos = self._frame(pos)
            record.end = pos
            yield record

    def _frame(self, start: int) -> tuple[_Framed, int]:
        record, end = self._frame_bytes(start)
        inside = [g for g in self._gaps if start < g < max(end, start + 1)]
        if inside:  # the record's bytes run across skipped corrupt data
            self._gaps = [g for g in self._gaps if g > inside[0]]
            resume = self._next_record(inside[0], boundary=True)
            return _Framed(start, failure="corrupt_gzip"), resume if resume >= 0 else self._end
        return record, end

    def _fail(self, start: int, reason: str, resume_from: int) -> tuple[_Framed, int]:
        if not self._have(resume_from) or (at := self._next_record(resume_from, boundary=True)) < 0:
            if self._truncated and not self._truncation_counted:
                self._truncation_counted = True
                reason = f"truncated_{self._compression}"
            return _Framed(start, failure=reason), self._end
        return _Framed(start, failure=reason), at

    def _frame_bytes(self, start: int) -> tuple[_Framed, int]:
        if not self._have(start + len(_WARC_MAGIC)) or self._bytes(start, start + len(_WARC_MAGIC)) != _WARC_MAGIC:
            return self._fail(start, "bad_header", start + 1)
        head_end = self._find(b"\r\n\r\n", start, start + _MAX_WARC_HEAD)
        if head_end < 0:
            return self._fail(start, "bad_header", start + 1)
        raw_head = self._bytes(start, head_end + 4)
        head = _parse_warc_head(raw_head)
        body_start = head_end + 4
        length = head.get("content-length", b"").strip()
        if not length.isdigit():
            return self._fail(start, "no_length", body_start)
        body_end = body_start + int(length)
        warc_type = head.get("warc-type", b"").decode("latin-1").strip()
        if int(length) <= self._retain:
            complete = self._have(body_end + 4)
            if complete and self._bytes(body_end, body_end + 4) == b"\r\n\r\n":
                if not warc_type:
                    return _Framed(start, failure="bad_header"), body_end + 4
                body = self._bytes(body_start, body_end)
                return _Framed(start, warc_type, head, raw_head, body), body_end + 4
            inside = self._next_record(body_start, min(body_end + 4, self._end))
            if inside >= 0:
                return _Framed(start, failure="bad_length"), inside
            return self._fail(start, "bad_length", min(body_end, self._end))
        inside = self._next_record(body_start, body_end + 4)  # streams past the body, holding none of it
        if inside >= 0:
            return _Framed(start, failure="bad_length"), inside
        if self._have(body_end + 4) and self._bytes(body_end, body_end + 4) == b"\r\n\r\n":
            return _Framed(start, warc_type, head, raw_head, None), body_end + 4
        return self._fail(start, "bad_length", min(body_end, self._end))


def _parse_warc_head(raw: bytes) -> dict[str, bytes]:
    """Lower-cased WARC header names to their raw values (the first of repeated names wins)."""
    fields: dict[str, bytes] = {}
    for line in raw.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            fields.setdefault(name.strip().decode("latin-1").lower(), value.strip())
    return fields


def _framed_document(url: str, record: _Framed, cfg: ReaderConfig, stats: Stats) -> Document | None:
    """A framed record's header checks, then its HTTP head and body parsed by ``reader.warc_engine``."""
    if not record.head.get("warc-target-uri"):
        stats.add("failed.read_no_target_uri")
        return None
    date = record.head.get("warc-date")
    if date is not None and not _WARC_DATE_RE.match(date):
        stats.add("failed.read_bad_date")
        return None
    try:
        parsed = (_fastwarc_parsed(record) if cfg.warc_engine == "fastwarc" else None) or _warcio_parsed(record)
        return _record_document(url, parsed, record.offset, cfg, stats)
    except Exception as e:  # the bytes are in memory: anything the parser raises is a fault of this record
        stats.add("failed.read_bad_record")
        log.warning("%s: record at offset %d cannot be parsed: %s", url, record.offset, e)
        return None


@dataclasses.dataclass
class _Parsed:
    """What the document checks need of one parsed record, whichever engine parsed it."""

    is_html: bool  # a WARC response (HTML to extract), not a WET conversion (text)
    warc_header: Callable[[str], str | None]
    http_header: Callable[[str], str | None] | None  # None: the record has no HTTP head
    status: str  # the HTTP status code as written ("" without an HTTP head)
    read_payload: Callable[[int], bytes]  # at most n bytes of the payload, its encodings undone


def _warcio_parsed(record: _Framed) -> _Parsed:
    from warcio.archiveiterator import ArchiveIterator

    parsed = next(iter(ArchiveIterator(io.BytesIO(record.raw_head + record.body + b"\r\n\r\n"))))
    http = parsed.http_headers
    return _Parsed(parsed.rec_type == "response", parsed.rec_headers.get_header,
                   http.get_header if http is not None else None,
                   (http.get_statuscode() or "") if http is not None else "", lambda n: parsed.content_stream().read(n))


_FOLDED = (b"\n ", b"\n\t")
_ODD_HEAD_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\xff]")  # where str and bytes whitespace differ


def _plain_head(raw: bytes) -> bool:
    """ASCII without control characters (but tab), every line ending in CRLF, no folded lines."""
    return (_ODD_HEAD_BYTES.search(raw) is None and raw.count(b"\r\n") == raw.count(b"\n") == raw.count(b"\r")
            and not any(f in raw for f in _FOLDED))


def _fastwarc_parsed(record: _Framed) -> _Parsed | None:
    """FastWARC's parse of a record's HTTP head, or None where warcio's might differ (warcio parses those).

    The framer has parsed the WARC head already. FastWARC takes the plain case: ``_plain_head``
    heads; an HTTP head under FastWARC's 32 KiB limit that starts ``HTTP/`` and holds only
    ``name: value`` lines; no Content- or Transfer-Encoding (warcio decodes those, and passes a body
    that does not decode as declared through as it is, where FastWARC raises); a target URI warcio
    would not rewrite (``<uri>``, spaces). On real crawls that is nearly every record (109 of 110
    in realcrawl-dev).
    """
    from fastwarc.warc import HeaderMap

    head, body = record.head, record.body
    if not _plain_head(record.raw_head):
        return None
    uri = head["warc-target-uri"].decode("ascii")
    if uri.startswith("<") or " " in uri:
        return None

    def warc_header(name: str) -> str | None:
        value = head.get(name.lower())
        return None if value is None else value.decode("ascii")

    is_html = record.warc_type == "response"
    if not (is_html and body and uri.startswith(("http:", "https:"))):  # where warcio parses no HTTP head
        return _Parsed(is_html, warc_header, None, "", io.BytesIO(body).read)
    http = HeaderMap()
    try:
        end = http.parse(io.BytesIO(body))
    except OSError:  # e.g. a head over FastWARC's 32 KiB limit, which warcio reads
        return None
    http_head, status_line = body[:end], http.status_line or ""
    if not (status_line.startswith("HTTP/") and http_head.startswith(status_line.encode() + b"\r\n")
            and http_head.endswith(b"\r\n\r\n") and _plain_head(http_head) and http_head.count(b"\n") == len(http) + 2
            and "Content-Encoding" not in http and "Transfer-Encoding" not in http):
        return None
    _, _, code = status_line.partition(" ")  # as warcio: the first word after the protocol
    return _Parsed(True, warc_header, http.get, code.strip().split(" ", 1)[0], lambda n: body[end:end + n])


def _compression(url: str) -> str:
    return "zstd" if url.lower().endswith(".zst") else "gzip"


def _record_document(url: str, record: _Parsed, offset: int, cfg: ReaderConfig, stats: Stats) -> Document | None:
    """One parsed record as a Document, or None with the reason counted."""
    http = record.http_header
    content_type = ""
    if http is not None:
        if cfg.require_http_ok and not record.status.startswith("2"):
            stats.add("dropped.read_http_status")
            return None
        content_type = http("Content-Type") or ""
    content_type = content_type or record.warc_header("WARC-Identified-Payload-Type") or ""
    mime, declared_charset = _parse_content_type(content_type)

    is_html = record.is_html
    if is_html and mime and mime not in cfg.html_content_types:
        stats.add("dropped.read_non_html")
        return None

    try:
        payload = record.read_payload(cfg.max_payload_bytes + 1)
    except (zlib.error, ValueError, OSError) as e:  # a broken Content-Encoding or chunked body
        stats.add("failed.read_bad_record")
        log.warning("%s: cannot decode the body of record %s: %s", url, record.warc_header("WARC-Record-ID"), e)
        return None
    if len(payload) > cfg.max_payload_bytes:
        stats.add("dropped.read_too_large")
        return None
    if _payload_truncated(http, len(payload)):
        stats.add("dropped.read_truncated_payload")
        return None
    if not payload.strip():
        stats.add("dropped.read_empty")
        return None
    if is_html and not mime and not payload.lstrip()[:1] == b"<":
        stats.add("dropped.read_non_html")  # no type given and it does not look like markup
        return None
    decoded = decode_payload(payload, declared_charset, cfg)
    if decoded is None:
        stats.add("dropped.read_undecodable")
        return None
    text, charset, replaced = decoded
    if replaced:
        stats.add("decoded_with_replacements")
    record_id = record.warc_header("WARC-Record-ID") or ""
    meta: dict[str, Any] = {
        "format": "html" if is_html else "text",
        "warc_file": url,
        "offset": offset,
        "charset": charset,
    }
    if date := record.warc_header("WARC-Date"):
        meta["date"] = date
    return Document(
        id=doc_id(record_id) if record_id else doc_id(url, offset),
        url=record.warc_header("WARC-Target-URI") or "",
        text=text,
        source="web",
        meta=meta,
    )


def _payload_truncated(http: Callable[[str], str | None] | None, length: int) -> bool:
    """The HTTP body is shorter than its own Content-Length: the crawler cut the page off.

    Only checked for identity-encoded bodies, where the header counts the bytes we hold.
    """
    if http is None or http("Content-Encoding") or http("Transfer-Encoding"):
        return False
    declared = http("Content-Length") or ""
    return declared.strip().isdigit() and int(declared) > length


def _parse_content_type(value: str) -> tuple[str, str]:
    """("text/html", "utf-8") from "text/html; charset=UTF-8"."""
    mime, _, params = value.partition(";")
    charset = ""
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset":
            charset = val.strip().strip("\"'")
    return mime.strip().lower(), charset


# --------------------------------------------------------------------------------------------
# JSONL and Parquet


def read_jsonl(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Documents from JSON lines with a ``text`` field; blank lines are not records."""
    truncated = f"read_truncated_{_compression(url)}"
    for line_no, record in read_json_lines(url, cfg.max_payload_bytes, stats, prefix="read", truncated=truncated):
        doc = _row_document(url, line_no, record, stats)
        if doc is not None:
            stats.add("out")
            yield doc


def read_json_lines(url: str, max_line_bytes: int, stats: Stats, *, prefix: str, truncated: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each line of a JSONL file (plain, .gz or .zst), streamed.

    Counts ``in``; skips an oversize line (``dropped.<prefix>_too_large``), undecodable
    bytes (``dropped.<prefix>_undecodable``) and malformed JSON (``failed.<prefix>_bad_record``); a
    truncated or corrupt compressed stream ends the file (``failed.<truncated>``,
    ``failed.<prefix>_corrupt_file``) keeping every line read before it.
    """
    with open_input(url) as f:
        line_no = 0
        try:
            for line_no, line in enumerate(_bounded_lines(f, max_line_bytes)):
                if line is not None and not line.strip():
                    continue
                stats.add("in")
                if line is None:
                    stats.add(f"dropped.{prefix}_too_large")
                    continue
                try:
                    record = json.loads(line)
                except UnicodeDecodeError:
                    stats.add(f"dropped.{prefix}_undecodable")
                    continue
                except json.JSONDecodeError:
                    stats.add(f"failed.{prefix}_bad_record")
                    continue
                yield line_no, record
        except EOFError:  # the cut line is a record seen: ``in`` still adds up
            stats.add("in")
            stats.add(f"failed.{truncated}")
            log.warning("%s: file is truncated after line %d", url, line_no)
        except (gzip.BadGzipFile, zlib.error) as e:
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: corrupt compressed data after line %d: %s", url, line_no, e)
        except Exception as e:  # zstandard.ZstdError, without importing zstandard for every format
            if type(e).__name__ != "ZstdError":
                raise
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: corrupt zstd data after line %d: %s", url, line_no, e)


def _bounded_lines(f: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """Lines of ``f``; a line longer than ``max_bytes`` is skipped unread and yields None."""
    while line := f.readline(max_bytes + 1):
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while (rest := f.readline(READ_CHUNK)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def read_parquet(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Documents from a Parquet file with a string ``text`` column, read one row group at a time."""
    for row, record in read_parquet_rows(url, "text", ("id", "url", "text", "source", "meta"), stats,
                                         prefix="read", batch_size=1024):
        text = record.get("text")
        if isinstance(text, str) and len(text.encode()) > cfg.max_payload_bytes:
            stats.add("dropped.read_too_large")
        elif (doc := _row_document(url, row, record, stats)) is not None:
            stats.add("out")
            yield doc


def read_parquet_rows(url: str, required: str, columns: Sequence[str], stats: Stats, *, prefix: str,
                      batch_size: int) -> Iterator[tuple[int, dict]]:
    """(row number, record) of a Parquet file, streamed by batches of the wanted ``columns``.

    Counts ``in``. An unreadable file, a file without the ``required`` column, or corrupt
    data part-way (which ends the file, keeping the rows before it) count as ``failed.<prefix>_corrupt_file``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb", **remote_options(url)) as f:
        try:
            parquet = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as e:
            stats.add("in")  # the unreadable rest is one record seen, so ``in`` adds up
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: not a readable Parquet file: %s", url, e)
            return
        names = set(parquet.schema_arrow.names)
        if required not in names:
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: Parquet file has no %r column (columns: %s); skipped", url, required, sorted(names))
            return
        row = 0
        try:
            for batch in parquet.iter_batches(batch_size=batch_size,
                                              columns=[c for c in dict.fromkeys(columns) if c in names]):
                for record in batch.to_pylist():
                    stats.add("in")
                    yield row, record
                    row += 1
        except (pa.ArrowException, OSError) as e:
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: corrupt Parquet data after row %d: %s", url, row, e)


def _row_document(url: str, index: int, record: Any, stats: Stats) -> Document | None:
    """A JSONL/Parquet record as a Document, or None with the reason counted."""
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        stats.add("failed.read_bad_record")
        return None
    text = record["text"]
    if not text.strip():
        stats.add("dropped.read_empty")
        return None
    meta = record.get("meta")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = None
    meta = dict(meta) if isinstance(meta, dict) else {}
    source = record.get("source") or "web"
    meta.setdefault("format", "code" if source == "code" else "text")
    given_id = record.get("id")
    return Document(
        id=str(given_id) if given_id not in (None, "") else doc_id(url, index),
        url=str(record.get("url") or ""),
        text=text,
        source=str(source),
        meta=meta,
    )
