"""Deterministic WARC/1.0 records, each in its own gzip member, as crawlers write them.

Records are written by hand rather than through warcio's writer because the sample needs
records warcio's writer would repair (an HTTP Content-Length larger than the payload), and
because byte-identical reruns need a fixed gzip header: mtime 0 and OS "unknown", which
``zlib``'s own gzip wrapper does not give on every platform.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import struct
import uuid
import zlib

WARC_VERSION = "WARC/1.0"
GZIP_LEVEL = 6
# Header of a gzip member: magic, deflate, no flags, mtime 0, no extra flags, OS 255 (unknown).
_GZIP_HEADER = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x00\xff"


def gzip_member(data: bytes) -> bytes:
    """One gzip member holding ``data``; the same input gives the same bytes on every machine."""
    deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    return _GZIP_HEADER + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


def record_id(seed: int, key: str) -> str:
    """A ``urn:uuid`` derived from the seed and a stable key, so reruns reuse the same ids."""
    digest = hashlib.sha256(f"smelt-sample:{seed}:{key}".encode()).digest()
    return f"<urn:uuid:{uuid.UUID(bytes=digest[:16], version=4)}>"


def warc_date(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def http_date(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


def sha1_digest(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode("ascii")


def warc_record(headers: list[tuple[str, str]], block: bytes) -> bytes:
    """A WARC record: version line, ``headers``, Content-Length of ``block``, block, CRLF CRLF."""
    lines = [WARC_VERSION, *(f"{name}: {value}" for name, value in headers), f"Content-Length: {len(block)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + block + b"\r\n\r\n"


def warcinfo_record(filename: str, info_id: str, moment: dt.datetime, fields: dict[str, str]) -> bytes:
    """The record that opens a WARC file and describes it; responses point to it by ``info_id``."""
    block = "".join(f"{name}: {value}\r\n" for name, value in fields.items()).encode("utf-8")
    return warc_record(
        [
            ("WARC-Type", "warcinfo"),
            ("WARC-Record-ID", info_id),
            ("WARC-Date", warc_date(moment)),
            ("WARC-Filename", filename),
            ("Content-Type", "application/warc-fields"),
        ],
        block,
    )


def http_response_head(status: str, moment: dt.datetime, server: str, content_type: str, content_length: int) -> bytes:
    """The HTTP status line and headers. ``content_length`` is what the server claimed."""
    lines = [
        f"HTTP/1.1 {status}",
        f"Date: {http_date(moment)}",
        f"Server: {server}",
        f"Content-Type: {content_type}",
        f"Content-Length: {content_length}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def response_record(
    url: str, seed: int, moment: dt.datetime, warcinfo_id: str, http_head: bytes, payload: bytes
) -> bytes:
    """A ``response`` record for ``url``: the HTTP head and the payload bytes actually received.

    The WARC Content-Length and digests always describe the bytes present, so the record parses
    even when the HTTP head claims more payload than arrived (a truncated download).
    """
    block = http_head + payload
    return warc_record(
        [
            ("WARC-Type", "response"),
            ("WARC-Record-ID", record_id(seed, f"response:{url}")),
            ("WARC-Date", warc_date(moment)),
            ("WARC-Target-URI", url),
            ("WARC-Warcinfo-ID", warcinfo_id),
            ("WARC-Block-Digest", sha1_digest(block)),
            ("WARC-Payload-Digest", sha1_digest(payload)),
            ("Content-Type", "application/http; msgtype=response"),
        ],
        block,
    )
