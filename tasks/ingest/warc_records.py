"""One framed WARC record → a ``Document``, or None with the reason counted.

The HTTP head is parsed by FastWARC where it reads exactly as warcio would (``reader.warc_engine
= "fastwarc"``), else by warcio; either way ``record_document`` makes the same checks, so both
engines give the same documents and counts.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import re
import zlib
from collections.abc import Callable
from typing import Any

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.base import doc_id
from tasks.ingest.charsets import decode_payload
from tasks.ingest.config import ReaderConfig
from tasks.ingest.warc_framer import Framed

log = logging.getLogger(__name__)


_WARC_DATE_RE = re.compile(rb"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?)?$")


def framed_document(url: str, record: Framed, cfg: ReaderConfig, stats: Stats) -> Document | None:
    """A framed record's header checks, then its HTTP head and body parsed by ``reader.warc_engine``."""
    if not record.head.get("warc-target-uri"):
        stats.add("failed.read_no_target_uri")
        return None
    date = record.head.get("warc-date")
    if date is not None and not _WARC_DATE_RE.match(date):
        stats.add("failed.read_bad_date")
        return None
    try:
        parsed = (fastwarc_parsed(record) if cfg.warc_engine == "fastwarc" else None) or warcio_parsed(record)
        return record_document(url, parsed, record.offset, cfg, stats)
    except Exception as e:  # the bytes are in memory: anything the parser raises is a fault of this record
        stats.add("failed.read_bad_record")
        log.warning("%s: record at offset %d cannot be parsed: %s", url, record.offset, e)
        return None


@dataclasses.dataclass
class Parsed:
    """What the document checks need of one parsed record, whichever engine parsed it."""

    is_html: bool  # a WARC response (HTML to extract), not a WET conversion (text)
    warc_header: Callable[[str], str | None]
    http_header: Callable[[str], str | None] | None  # None: the record has no HTTP head
    status: str  # the HTTP status code as written ("" without an HTTP head)
    read_payload: Callable[[int], bytes]  # at most n bytes of the payload, its encodings undone


def warcio_parsed(record: Framed) -> Parsed:
    from warcio.archiveiterator import ArchiveIterator

    parsed = next(iter(ArchiveIterator(io.BytesIO(record.raw_head + record.body + b"\r\n\r\n"))))
    http = parsed.http_headers
    return Parsed(parsed.rec_type == "response", parsed.rec_headers.get_header,
                   http.get_header if http is not None else None,
                   (http.get_statuscode() or "") if http is not None else "", lambda n: parsed.content_stream().read(n))


_FOLDED = (b"\n ", b"\n\t")
_ODD_HEAD_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\xff]")  # where str and bytes whitespace differ


def _plain_head(raw: bytes) -> bool:
    """ASCII without control characters (but tab), every line ending in CRLF, no folded lines."""
    return (_ODD_HEAD_BYTES.search(raw) is None and raw.count(b"\r\n") == raw.count(b"\n") == raw.count(b"\r")
            and not any(f in raw for f in _FOLDED))


def fastwarc_parsed(record: Framed) -> Parsed | None:
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
        return Parsed(is_html, warc_header, None, "", io.BytesIO(body).read)
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
    return Parsed(True, warc_header, http.get, code.strip().split(" ", 1)[0], lambda n: body[end:end + n])


def record_document(url: str, record: Parsed, offset: int, cfg: ReaderConfig, stats: Stats) -> Document | None:
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
    if record_id:
        meta["warc_record_id"] = record_id  # the crawl's own name for the record (smelt trace shows it)
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
