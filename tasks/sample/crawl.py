"""Write the bundled sample crawl: gzipped WARC files plus a ground-truth file of what is where.

``write_sample_crawl`` is what ``smelt sample --output DIR`` calls. The crawl is generated from
offline text only (stdlib docstrings and sources, prose shipped in this package) and is
byte-identical for the same (pages, files, seed) on the same Python version: fixed dates,
record ids derived from the seed, gzip members with mtime 0.

Output, at any fsspec URL::

    crawl-00000.warc.gz … crawl-0000N.warc.gz   warcinfo record, then one response per page
    ground_truth.jsonl                           one line per page, in crawl order, written last

Ground-truth fields: url, file, category (``plan.CATEGORIES``), lang (ISO 639-1 or null),
dup_of (url of the original, for exact_dup/near_dup), edit_rate (near_dup only) and note (for
low_quality and malformed pages the subtype, e.g. ``word_salad`` or ``truncated``).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections import Counter

from tasks import storage
from tasks.sample.files import read_ground_truth, refuse_stale_files, write_sample_files
from tasks.sample import content, templates, warc
from tasks.sample.plan import CATEGORIES, Page, plan_crawl, rng_for

log = logging.getLogger(__name__)

GROUND_TRUTH = "ground_truth.jsonl"
FILE_PATTERN = "crawl-{:05d}.warc.gz"
CRAWL_START = dt.datetime(2024, 5, 6, 12, 0, 0, tzinfo=dt.timezone.utc)
SECONDS_BETWEEN_FETCHES = 7
RELATED_LINKS = 4
# Byte sequences that are never valid UTF-8: a stray continuation byte, bytes UTF-8 never uses,
# a lead byte followed by ASCII, a truncated three-byte sequence, an encoded surrogate.
INVALID_UTF8 = (b"\x80", b"\xff\xfe", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80")


def _related_links(page: Page, same_lang: list[Page], rng: random.Random) -> list[tuple[str, str]]:
    others = [p for p in rng.sample(same_lang, min(len(same_lang), RELATED_LINKS + 1)) if p is not page]
    return [(p.url, p.content.title) for p in others[:RELATED_LINKS]]


def _break_utf8(payload: bytes, rng: random.Random) -> bytes:
    """Insert invalid UTF-8 sequences at word boundaries inside the article."""
    start, end = payload.index(b"<article>"), payload.index(b"</article>")
    spaces = [i for i in range(start, end) if payload[i] == 0x20]
    out = bytearray(payload)
    for i, position in enumerate(sorted(rng.sample(spaces, min(len(spaces), 6)), reverse=True)):
        out[position:position] = INVALID_UTF8[i % len(INVALID_UTF8)]
    return bytes(out)


def http_exchange(page: Page, related: list[tuple[str, str]], rng: random.Random) -> tuple[str, int, bytes]:
    """(Content-Type, claimed Content-Length, payload actually received) for one page."""
    if page.malformed == "non_html":
        payload = content.png_bytes(rng)
        return "image/png", len(payload), payload
    if page.malformed == "empty":
        return "text/html; charset=utf-8", 0, b""
    page_content = page.content
    if page_content.code is not None:
        article = templates.code_article_html(page_content.title, page_content.paragraphs[0], page_content.code)
    else:
        article = templates.article_html(page_content.title, page_content.paragraphs)
    payload = templates.render_page(page.site, page.url, page_content.title, article, related).encode("utf-8")
    content_type = f"text/html; charset={page.site.charset}"
    if page.malformed == "truncated":
        cut = int(len(payload) * rng.uniform(0.35, 0.65))
        return content_type, len(payload), payload[:cut]
    if page.malformed == "undecodable":
        payload = _break_utf8(payload, rng)
    return content_type, len(payload), payload


def ground_truth_row(page: Page, file: str) -> dict:
    return {
        "url": page.url,
        "file": file,
        "category": page.category,
        "lang": page.lang,
        "dup_of": page.dup_of.url if page.dup_of else None,
        "edit_rate": page.edit_rate,
        "note": page.note,
    }


def _warc_file(name: str, pages: list[Page], first_index: int, seed: int, total_pages: int,
               by_lang: dict[str | None, list[Page]], rng: random.Random) -> bytes:
    info_id = warc.record_id(seed, f"warcinfo:{name}")
    fields = {
        "software": "smelt sample crawl",
        "format": "WARC File Format 1.0",
        "description": f"generated sample crawl, seed {seed}, {total_pages} pages; see {GROUND_TRUTH}",
        "isPartOf": f"smelt-sample-seed{seed}",
    }
    members = [warc.gzip_member(warc.warcinfo_record(name, info_id, CRAWL_START, fields))]
    for offset, page in enumerate(pages):
        moment = CRAWL_START + dt.timedelta(seconds=SECONDS_BETWEEN_FETCHES * (first_index + offset))
        related = _related_links(page, by_lang[page.lang], rng) if page.content else []
        content_type, claimed, payload = http_exchange(page, related, rng)
        head = warc.http_response_head("200 OK", moment, page.site.server, content_type, claimed)
        members.append(warc.gzip_member(warc.response_record(page.url, seed, moment, info_id, head, payload)))
    return b"".join(members)


def write_sample_crawl(output_url: str, pages: int = 1200, files: int = 4, seed: int = 0) -> dict:
    """Write a deterministic sample crawl of ``pages`` pages in ``files`` WARC files.

    Returns a summary: ``pages``, ``categories`` (pages per category), ``subtypes``
    (low_quality and malformed pages per note), ``files`` (names), ``bytes`` (WARC bytes) and
    ``ground_truth`` (its file name). Raises ValueError for counts it cannot honour.
    """
    if not 1 <= files <= pages:
        raise ValueError(f"files must be between 1 and pages ({pages}); got files={files}")
    out = storage.normalize_url(output_url)
    names = [FILE_PATTERN.format(i) for i in range(files)]
    refuse_stale_files(out, "crawl-*.warc.gz", names)

    plan = plan_crawl(pages, seed)
    by_lang: dict[str | None, list[Page]] = {}
    for page in plan:
        if page.content is not None:
            by_lang.setdefault(page.lang, []).append(page)
    links_rng = rng_for(seed, "links")
    bounds = [round(i * len(plan) / files) for i in range(files + 1)]
    chunks = [(name, plan[bounds[i]: bounds[i + 1]], bounds[i]) for i, name in enumerate(names)]
    rows, total_bytes = write_sample_files(out, ((name, _warc_file(name, chunk, first, seed, pages, by_lang, links_rng),
                                                  [ground_truth_row(page, name) for page in chunk])
                                                 for name, chunk, first in chunks), GROUND_TRUTH)

    categories = Counter(row["category"] for row in rows)
    summary = {
        "pages": len(rows),
        "categories": {name: categories[name] for name in CATEGORIES},
        "subtypes": dict(sorted(Counter(f"{r['category']}.{r['note']}" for r in rows
                                        if r["category"] in ("low_quality", "malformed")).items())),
        "files": names,
        "bytes": total_bytes,
        "ground_truth": GROUND_TRUTH,
    }
    log.info("sample crawl: %d pages in %d files (%d bytes) at %s", len(rows), files, total_bytes, out)
    return summary


def load_ground_truth(url: str) -> list[dict]:
    """The ground-truth rows of a sample crawl; ``url`` is its folder or the file itself."""
    return read_ground_truth(url, GROUND_TRUTH)
