"""Tiny crawl files for the ingest tests, built with warcio, gzip and zstandard (no fixtures on disk)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

# Plain English prose that passes every default quality rule when four or more sentences are
# combined: distinct sentences (no repetition), stop words, terminal punctuation.
SENTENCES = [
    "The river rose slowly after three days of steady rain in the hills.",
    "Farmers along the valley moved their animals to higher ground before night.",
    "Local volunteers filled sandbags and stacked them beside the old stone bridge.",
    "By morning the water had reached the lower steps of the church.",
    "Children watched from the school windows as boats drifted down the main street.",
    "The mayor said that the town had prepared for a flood like this for years.",
    "Engineers will inspect the bridge and the levee once the water goes down.",
    "Most families expect to return to their homes within a week.",
    "A new library opened on Saturday with a reading room that faces the harbour.",
    "The building was designed to let in as much daylight as possible during winter.",
    "Its shelves hold more than forty thousand books, maps and old newspapers.",
    "Visitors can also borrow tools, board games and musical instruments.",
    "The librarian explained that people asked for a quiet place to study and work.",
    "On the first day several hundred readers signed up for a card.",
    "Evening classes in languages and local history will begin next month.",
    "The city paid for the project with help from a regional cultural fund.",
    "Bakers in the old quarter start their ovens long before sunrise each day.",
    "The smell of fresh bread drifts through the narrow lanes near the market.",
    "Many of the recipes have been passed down through four generations of one family.",
    "Rye flour from nearby mills gives the loaves their dark colour and firm crust.",
    "Tourists often arrive early to watch the bakers shape the dough by hand.",
    "The shop closes at noon, when the last trays have been sold to neighbours.",
    "Prices have stayed low because the owners buy grain directly from farmers.",
    "A small museum next door tells the story of bread making in the region.",
]


def prose(first: int, count: int = 8) -> list[str]:
    """``count`` distinct sentences starting at ``first``, as one paragraph each pair of sentences."""
    chosen = [SENTENCES[(first + i) % len(SENTENCES)] for i in range(count)]
    return [" ".join(chosen[i:i + 2]) for i in range(0, len(chosen), 2)]


def article_page(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
        '<nav><a href="/">Home</a> <a href="/news">News</a> <a href="/about">About us</a></nav>'
        f"<article><h1>{title}</h1>{body}</article>"
        "<footer>Contact | Imprint | Jobs</footer></body></html>"
    )


def response(uri: str, payload: bytes, content_type: str | None = "text/html; charset=utf-8",
             status: str = "200 OK", record_id: str | None = None) -> bytes:
    """One uncompressed WARC response record (with its HTTP head)."""
    headers = [("Content-Type", content_type)] if content_type is not None else []
    http = StatusAndHeaders(status, headers, protocol="HTTP/1.1")
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    warc_headers = {"WARC-Record-ID": record_id} if record_id else None
    record = writer.create_warc_record(uri, "response", payload=io.BytesIO(payload), http_headers=http,
                                       warc_headers_dict=warc_headers)
    writer.write_record(record)
    return out.getvalue()


def other_record(uri: str, rec_type: str = "request") -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    record = writer.create_warc_record(uri, rec_type, payload=io.BytesIO(b"GET / HTTP/1.1\r\n\r\n"))
    writer.write_record(record)
    return out.getvalue()


def conversion(uri: str, text: str) -> bytes:
    """One WET conversion record."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    record = writer.create_warc_record(uri, "conversion", payload=io.BytesIO(text.encode()),
                                       warc_content_type="text/plain")
    writer.write_record(record)
    return out.getvalue()


def gzip_members(records: list[bytes]) -> bytes:
    """A .warc.gz: one gzip member per record, as crawlers write them (mtime 0: same bytes each time)."""
    return b"".join(gzip.compress(r, mtime=0) for r in records)


def write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return "file://" + str(path)


def jsonl(rows: list[dict | str]) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def english_warc(first_sentence: int, pages: int, host: str = "news.example") -> list[bytes]:
    """``pages`` response records of distinct English articles that pass the default filters."""
    return [
        response(f"https://{host}/story-{first_sentence + i}",
                 article_page(f"Story {first_sentence + i}", prose(first_sentence + 8 * i)).encode())
        for i in range(pages)
    ]


def raw_response(uri: str, http_head: bytes, body: bytes, warc_head: bytes = b"") -> bytes:
    """A WARC response record written byte by byte, so a test can give it any HTTP head (odd
    status lines, encodings, folded lines) that warcio's writer would tidy up."""
    block = http_head + b"\r\n\r\n" + body
    return (b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: " + uri.encode() + b"\r\n"
            b"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Record-ID: <urn:uuid:" + uri.encode() + b">\r\n" + warc_head +
            b"Content-Type: application/http; msgtype=response\r\nContent-Length: %d\r\n\r\n" % len(block) + block + b"\r\n\r\n")
