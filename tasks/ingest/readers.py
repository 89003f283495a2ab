"""Readers: raw crawl files at any fsspec URL → a stream of ``Document``s.

Formats (chosen from the file name unless ``reader.format`` says): WARC response records (raw HTML,
``meta.format = "html"``, text extracted later), WET conversion records (plain text), JSONL and
Parquet with a ``text`` field (optional ``id``, ``url``, ``source``, ``meta``).

Everything streams: one record is in memory at a time and payloads over ``max_payload_bytes`` are
skipped without being held, so a 1 GB WARC file never sits in memory whole. Compression is
inferred from the name (``.gz``, ``.zst``) and decompressed here, not by warcio, because Python's
gzip reader raises on a truncated file where warcio's own decompressor stops silently; record
offsets are therefore positions in the uncompressed stream.

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
import contextlib
import gzip
import hashlib
import io
import json
import logging
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any

import fsspec

from tasks.datasets import Stats, filesystem, normalize_url
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
    with fsspec.open(url, "rb") as raw:
        name = url.lower()
        if name.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream
        elif name.endswith(".zst"):
            with io.BufferedReader(ZstdReader(raw), buffer_size=READ_CHUNK) as stream:
                yield stream
        else:
            yield raw


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
    yield from reader(url, cfg, stats)


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
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    with open_input(url) as raw:
        stream = _EOFWatch(raw)
        archive = ArchiveIterator(stream)
        try:
            for record in archive:
                if record.rec_type != record_type:
                    stats.add("other_records")
                    continue
                stats.add("in")
                doc = _record_document(url, archive, record, cfg, stats)
                if doc is not None:
                    stats.add("out")
                    yield doc
        except EOFError:
            pass  # counted below from the watch: the compressed stream ended early
        except (ArchiveLoadFailed, ValueError, KeyError, IndexError) as e:
            # The record framing is lost (typically a lying Content-Length before it): warcio cannot
            # find the next record, so the rest of this file is skipped.
            stats.add("failed.read_bad_record")
            log.warning("%s: unreadable WARC record after offset %s, skipping the rest of the file: %s", url, archive.offset, e)
        except (gzip.BadGzipFile, zlib.error) as e:
            stats.add("failed.read_corrupt_file")
            log.warning("%s: corrupt compressed data, skipping the rest of the file: %s", url, e)
        if stream.truncated:
            stats.add(f"failed.read_truncated_{_compression(url)}")
            log.warning("%s: file is truncated; records after offset %s are lost", url, archive.offset)


class _EOFWatch:
    """Remembers that the decompressor hit a truncated end, and loses no byte before it.

    warcio treats ``EOFError`` while parsing a record header as the normal end of the archive, so
    a file cut inside a header would otherwise end quietly. Reads go through ``read1`` (one
    underlying read each): a buffered ``read(n)`` that meets the truncation throws away the bytes
    it had already decompressed, and with them the last complete records.
    """

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._read = getattr(raw, "read1", raw.read)
        self.truncated = False

    def read(self, size: int = -1) -> bytes:
        try:
            return self._read(size)
        except EOFError:
            self.truncated = True
            raise

    def tell(self) -> int:
        return self._raw.tell()


def _compression(url: str) -> str:
    return "zstd" if url.lower().endswith(".zst") else "gzip"


def _record_document(url: str, archive: Any, record: Any, cfg: ReaderConfig, stats: Stats) -> Document | None:
    """One record as a Document, or None with the reason counted."""
    headers = record.rec_headers
    http = record.http_headers
    content_type = ""
    if http is not None:
        status = http.get_statuscode() or ""
        if cfg.require_http_ok and not status.startswith("2"):
            archive.read_to_end()
            stats.add("dropped.read_http_status")
            return None
        content_type = http.get_header("Content-Type") or ""
    content_type = content_type or headers.get_header("WARC-Identified-Payload-Type") or ""
    mime, declared_charset = _parse_content_type(content_type)

    is_html = record.rec_type == "response"
    if is_html and mime and mime not in cfg.html_content_types:
        archive.read_to_end()
        stats.add("dropped.read_non_html")
        return None

    try:
        payload = record.content_stream().read(cfg.max_payload_bytes + 1)
    except (zlib.error, ValueError, OSError) as e:  # a broken Content-Encoding or chunked body
        archive.read_to_end()
        stats.add("failed.read_bad_record")
        log.warning("%s: cannot decode the body of record %s: %s", url, headers.get_header("WARC-Record-ID"), e)
        return None
    errors_before = archive.err_count
    archive.read_to_end()  # finds out whether the record ended where its Content-Length said
    if archive.err_count > errors_before or record.raw_stream.limit > 0:
        stats.add("failed.read_bad_record")
        log.warning("%s: record at offset %s does not end where its Content-Length says; skipped",
                    url, archive.get_record_offset())
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
    offset = archive.get_record_offset()
    record_id = headers.get_header("WARC-Record-ID") or ""
    meta: dict[str, Any] = {
        "format": "html" if is_html else "text",
        "warc_file": url,
        "offset": offset,
        "charset": charset,
    }
    if date := headers.get_header("WARC-Date"):
        meta["date"] = date
    return Document(
        id=doc_id(record_id) if record_id else doc_id(url, offset),
        url=headers.get_header("WARC-Target-URI") or "",
        text=text,
        source="web",
        meta=meta,
    )


def _payload_truncated(http: Any, length: int) -> bool:
    """The HTTP body is shorter than its own Content-Length: the crawler cut the page off.

    Only checked for identity-encoded bodies, where the header counts the bytes we hold.
    """
    if http is None or http.get_header("Content-Encoding") or http.get_header("Transfer-Encoding"):
        return False
    declared = http.get_header("Content-Length") or ""
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
        except EOFError:
            stats.add(f"failed.{truncated}")
            log.warning("%s: file is truncated after line %d", url, line_no)
        except (gzip.BadGzipFile, zlib.error) as e:
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: corrupt compressed data after line %d: %s", url, line_no, e)
        except Exception as e:  # zstandard.ZstdError, without importing zstandard for every format
            if type(e).__name__ != "ZstdError":
                raise
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

    with fsspec.open(url, "rb") as f:
        try:
            parquet = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as e:
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: not a readable Parquet file: %s", url, e)
            return
        names = set(parquet.schema_arrow.names)
        if required not in names:
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
