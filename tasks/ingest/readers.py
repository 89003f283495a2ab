"""Readers: raw crawl files at any fsspec URL → a stream of ``Document``s.

Formats (chosen from the file name unless ``reader.format`` says): WARC response records (raw HTML,
``meta.format = "html"``, text extracted later), WET conversion records (plain text), JSONL and
Parquet with a ``text`` field (optional ``id``, ``url``, ``source``, ``meta``).

Everything streams: payloads over ``max_payload_bytes`` are skipped without being held, and the
records held until their compressed data passes its checksum are bounded (``UNVERIFIED_HOLD_CHARS``),
so a 1 GB WARC file never sits in memory whole. Compression is
inferred from the name (``.gz``, ``.zst``) and undone by smelt (``compression.py``), not by
warcio, whose decompressor passes a truncated file silently; record offsets are therefore
positions in the uncompressed stream. WARC and WET files are read by ``warc.py`` (framing:
``warc_framer.py``; records: ``warc_records.py``) with either ``reader.warc_engine``; both give
the same documents and counts.

Data faults are counted and skipped, never raised (docs/design.md §3). Counters:
``in`` (candidate records: WARC responses, WET conversions, JSONL lines, Parquet rows),
``out`` (documents yielded), ``other_records`` (WARC request/metadata/… records),
``decoded_with_replacements`` (pages kept with a few undecodable bytes replaced),
``dropped.read_{non_html,http_status,empty,too_large,undecodable}``,
``failed.read_{truncated_<compression>,corrupt_gzip,corrupt_zstd,corrupt_file,bad_record,unverified_record}``,
``bytes_in``.
Network and permission errors are not data faults: they raise, so the work item is retried.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from tasks.compression import compression_name
from tasks.counters import Stats
from tasks.storage import filesystem, normalize_url
from tasks.documents import Document
from tasks.ingest.base import doc_id
from tasks.errors import UserError
from tasks.ingest.config import ReaderConfig
from tasks.ingest.warc import read_warc, read_wet
from tasks.records import read_json_lines, read_parquet_rows

log = logging.getLogger(__name__)

# Longest suffix first: ".warc.wet.gz" is WET, not WARC.
FORMAT_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".warc.wet.gz", "wet"), (".wet.gz", "wet"), (".wet", "wet"),
    (".warc.gz", "warc"), (".warc.zst", "warc"), (".warc.bz2", "warc"), (".warc.xz", "warc"), (".warc", "warc"),
    (".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl.bz2", "jsonl"), (".jsonl.xz", "jsonl"),
    (".jsonl", "jsonl"),
    (".json.gz", "jsonl"), (".ndjson", "jsonl"),
    (".parquet", "parquet"),
)
GLOB_CHARS = "*?["


class InputError(UserError):
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


def http_input(fs, url: str, what: str = "input") -> list[str] | None:
    """An HTTP(S) URL names one file, as HTTP has no listing: ``[url]`` if it exists; None for other URLs."""
    if not url.startswith(("http://", "https://")):
        return None
    if not fs.exists(url):
        raise InputError(f"{what} {url} does not exist (HTTP error or not found)")
    return [url]


def _expand_one(url: str) -> list[str]:
    fs, path = filesystem(url)
    if (one := http_input(fs, url)) is not None:
        return one
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


# --------------------------------------------------------------------------------------------
# Decoding


# --------------------------------------------------------------------------------------------
# WARC and WET


# --------------------------------------------------------------------------------------------
# JSONL and Parquet


def read_jsonl(url: str, cfg: ReaderConfig, stats: Stats) -> Iterator[Document]:
    """Documents from JSON lines with a ``text`` field; blank lines are not records."""
    truncated = f"read_truncated_{compression_name(url)}"
    for line_no, record in read_json_lines(url, cfg.max_payload_bytes, stats, prefix="read", truncated=truncated):
        doc = _row_document(url, line_no, record, stats)
        if doc is not None:
            stats.add("out")
            yield doc


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
