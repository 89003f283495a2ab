"""URL filtering from block lists kept in files (domains, and words that may not appear in a URL).

Lists are plain text at any fsspec URL: one entry per line, blank lines and ``#`` comments
ignored, matched case-insensitively. They are read once per process. With no list configured the
step passes every document.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import urlsplit

from tasks import storage
from tasks.documents import Document
from tasks.ingest.base import Filter
from tasks.ingest.config import URLFilterConfig

log = logging.getLogger(__name__)

URL_TOKEN_SPLIT_RE = re.compile(r"[^a-z0-9]+")

_lists: dict[str, frozenset[str]] = {}
_lists_lock = threading.Lock()


def read_list(url: str) -> frozenset[str]:
    """Entries of the list file at ``url`` (lowercased), read once per process."""
    with _lists_lock:
        if url not in _lists:
            fs, path = storage.filesystem(url)
            with fs.open(path, "rt", encoding="utf-8") as f:
                entries = {line.split("#", 1)[0].strip().lower() for line in f}
            entries.discard("")
            log.info("read %d entries from %s", len(entries), url)
            _lists[url] = frozenset(entries)
        return _lists[url]


def host_of(url: str) -> str:
    try:
        return (urlsplit(url if "://" in url else "//" + url).hostname or "").rstrip(".")
    except ValueError:  # e.g. an invalid IPv6 literal in the host
        return ""


def domain_suffixes(host: str) -> list[str]:
    """``a.b.example.com`` -> [a.b.example.com, b.example.com, example.com, com]."""
    parts = host.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


class URLFilter(Filter):
    """Drops documents whose URL is on a blocked domain (or a subdomain of one) or holds a banned word.

    A banned word must be a whole URL token (URLs are split on every non-alphanumeric character),
    so "sex" blocks ``/sex-toys`` but not ``/sussex``. Reasons: url_blocked_domain, url_banned_word.
    Documents without a URL are kept and counted as ``skipped.no_url``; with no list configured
    every document passes.
    """

    name = "url_filter"

    def __init__(self, cfg: URLFilterConfig):
        super().__init__(cfg)
        for key in ("blocked_domains_url", "banned_words_url"):
            url = getattr(cfg, key)
            if url:
                fs, path = storage.filesystem(url)
                if not fs.exists(path):
                    raise ValueError(f"url_filter.{key} points to {url}, which does not exist: fix the path or leave it empty")

    def skip_reason(self, doc: Document) -> str | None:
        return None if doc.url else "no_url"

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        if self.cfg.blocked_domains_url:
            blocked = read_list(self.cfg.blocked_domains_url)
            host = host_of(doc.url).lower()
            if host and any(suffix in blocked for suffix in domain_suffixes(host)):
                return False, "url_blocked_domain"
        if self.cfg.banned_words_url:
            banned = read_list(self.cfg.banned_words_url)
            if not banned.isdisjoint(URL_TOKEN_SPLIT_RE.split(doc.url.lower())):
                return False, "url_banned_word"
        return True
