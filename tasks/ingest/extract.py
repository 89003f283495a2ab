"""HTML → main text, under a time limit and a size cap, with one of two engines (``extract.engine``).

- ``trafilatura`` in precision mode, as FineWeb: a Python loop over lxml calls.
- ``resiliparse`` (``html2text.extract_plain_text`` with main-content detection, as DCLM): one
  native call over a lexbor DOM, about 14× faster per page here. The README's "How each stage scales
  out" gives what each costs and how their kept sets and texts differ (``bench/ingest.py``).

Why the time limit is a watchdog thread and not ``signal.alarm``: Dask workers run tasks in
threads, and signals can only be handled in a process's main thread. A single watchdog thread per
process instead raises ``ExtractTimeout`` *inside* the extracting thread when its deadline passes
(``PyThreadState_SetAsyncExc``), which works from any thread. The exception is delivered at the
next Python bytecode; trafilatura's work is a Python loop over lxml calls, so it stops within one
lxml call, and the size cap (``max_html_bytes``) bounds how long any single lxml call can take
(resiliparse's single native call is bounded by the size cap alone).
``ExtractTimeout`` derives from ``BaseException`` so trafilatura's own ``except Exception`` blocks
do not swallow it. (A subprocess per worker would also stop a runaway C call, at the price of
shipping every page across a pipe and keeping a second process per worker.)

Code pages keep their code: both engines keep ``<pre>`` blocks, but drop code laid out in tables
(line-numbered listings) when tables are excluded, as FineWeb excludes them. When code blocks hold
at least ``code_page_min_share`` of a page's text, blocks missing from the extraction are appended
and the document is marked ``meta.format = "code"`` so the prose rules do not judge it. Code
blocks are found on an lxml tree for both engines (resiliparse's only for pages that may hold code).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.base import Step
from tasks.ingest.config import ExtractConfig

log = logging.getLogger(__name__)


class ExtractTimeout(BaseException):
    """An extraction ran past its time limit (raised in the extracting thread by the watchdog)."""


class _Watchdog:
    """One daemon thread per process that interrupts threads whose deadline has passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: dict[int, tuple[float, int]] = {}  # token -> (monotonic deadline, thread id)
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._pid = -1

    def arm(self, seconds: float) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use in this process (or a forked child)
                self._pid = os.getpid()
                threading.Thread(target=self._watch, name="extract-watchdog", daemon=True).start()
            token = next(self._tokens)
            self._deadlines[token] = (time.monotonic() + seconds, threading.get_ident())
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._deadlines.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                # The work finished just as its time ran out: cancel the exception if not yet raised.
                _set_async_exc(threading.get_ident(), None)

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for token, (deadline, thread) in list(self._deadlines.items()):
                    if deadline <= now:
                        del self._deadlines[token]
                        self._fired.add(token)
                        _set_async_exc(thread, ExtractTimeout)
                soonest = min((d for d, _ in self._deadlines.values()), default=None)
                self._cond.wait(None if soonest is None else max(0.0, soonest - now))


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    # A NULL exception clears a pending one.
    obj = ctypes.py_object(exc) if exc is not None else ctypes.py_object()
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``ExtractTimeout`` in this thread if the block runs longer than ``seconds``.

    Catch ``ExtractTimeout`` *around* the ``with``: when the deadline and the end of the block
    coincide the exception may surface while leaving it.
    """
    token = _WATCHDOG.arm(seconds)
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)


# --------------------------------------------------------------------------------------------
# Code blocks


def code_blocks(tree, min_chars: int) -> list[str]:
    """Texts of the page's code blocks in document order (lxml tree): ``<pre>``, multi-line
    ``<code>`` outside ``<pre>``, and tables whose cells are classed as code (line-numbered listings).

    Line-number gutters (blocks of digits only) are not code.
    """
    blocks = []
    for element in tree.iter("pre", "code", "table"):
        if element.tag in ("pre", "code"):
            if any(a.tag in ("pre", "code") for a in element.iterancestors()):
                continue
            text = element.text_content()
        else:
            cells = element.xpath(".//td[contains(@class, 'code') and not(.//pre)]")
            if not cells:
                continue
            text = "\n".join(cell.text_content().rstrip("\n") for cell in cells)
        if (block := _code_block(element.tag, text, min_chars)) is not None:
            blocks.append(block)
    return blocks


def _code_block(tag: str, text: str, min_chars: int) -> str | None:
    """The block's text if it counts as code: not inline ``<code>`` in prose, at least ``min_chars``,
    not a line-number gutter (a block of digits only)."""
    if tag == "code" and "\n" not in text.strip():
        return None
    text = text.strip("\n")
    if len(text) < min_chars or all(line.strip().isdigit() for line in text.splitlines() if line.strip()):
        return None
    return text


def visible_text_chars(tree) -> int:
    body = tree.find("body")
    root = body if body is not None else tree
    return sum(len(t.strip()) for t in root.xpath(".//text()[not(ancestor::script) and not(ancestor::style)]"))


def _longest_line(block: str) -> str:
    return max((line.strip() for line in block.splitlines()), key=len, default="")


# --------------------------------------------------------------------------------------------
# The step


def extract_text(html: str, cfg: ExtractConfig) -> tuple[str, bool]:
    """(main text, is a code page) of one HTML page with ``cfg.engine``; "" when it finds no main text."""
    if cfg.engine == "resiliparse":
        return _resiliparse_text(html, cfg)
    import trafilatura
    from trafilatura.utils import load_html

    tree = load_html(html)
    if tree is None:
        return "", False
    blocks, is_code_page = _code_page(tree, cfg)
    text = trafilatura.extract(
        tree,
        favor_precision=cfg.favor_precision,
        include_comments=cfg.include_comments,
        include_tables=cfg.include_tables,
        deduplicate=cfg.deduplicate,
        with_metadata=False,
        include_images=False,
        include_links=False,
    ) or ""
    return _with_code(text, blocks, is_code_page), is_code_page


# A page without any of these has no code block; the others are parsed with lxml to look.
_MAY_HOLD_CODE = re.compile(r"<(?:pre|code)\b|<td\b[^>]*class\s*=\s*[\"']?[^\"'>]*code", re.IGNORECASE)


def _resiliparse_text(html: str, cfg: ExtractConfig) -> tuple[str, bool]:
    """Why the HTML string goes in, not a parsed ``HTMLTree``: resiliparse's tree and node objects
    may only be freed by the thread that made them, and in a Dask worker some were freed by its
    event-loop thread instead (a RuntimeError each, and the object leaked). The string makes none."""
    from resiliparse.extract.html2text import extract_plain_text

    text = extract_plain_text(
        html,
        main_content=True,
        alt_texts=False,
        links=False,
        form_fields=False,
        noscript=False,
        comments=cfg.include_comments,
        skip_elements=None if cfg.include_tables else ["table"],
    ).strip()
    blocks, is_code_page = [], False
    if cfg.keep_code and _MAY_HOLD_CODE.search(html):
        from trafilatura.utils import load_html

        tree = load_html(html)
        if tree is not None:
            blocks, is_code_page = _code_page(tree, cfg)
    return _with_code(text, blocks, is_code_page), is_code_page


def _code_page(tree, cfg: ExtractConfig) -> tuple[list[str], bool]:
    """(code blocks, is a code page) of an lxml tree: code blocks hold ``code_page_min_share`` of its text."""
    blocks = code_blocks(tree, cfg.code_block_min_chars) if cfg.keep_code else []
    code_chars = sum(len(b.strip()) for b in blocks)
    return blocks, bool(blocks) and code_chars >= cfg.code_page_min_share * max(1, visible_text_chars(tree))


def _with_code(text: str, blocks: list[str], is_code_page: bool) -> str:
    """On a code page, the extracted text with the code blocks the engine left out appended."""
    if not is_code_page:
        return text
    missing = [b for b in blocks if _longest_line(b) not in text]
    return "\n\n".join(part for part in [text, *missing] if part)


class Extract(Step):
    """HTML documents (``meta.format == "html"``) → their main text; other documents pass through.

    Counters (besides ``in`` and ``out``): ``code_pages``, ``time.extract_s``;
    ``dropped.extract_too_large`` (HTML over ``max_html_bytes``), ``dropped.extract_timeout``,
    ``dropped.extract_empty`` (no main text), ``failed.extract_error`` (the parser raised).
    """

    name = "extract"

    def __init__(self, cfg: ExtractConfig):
        self.cfg = cfg

    def process(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None) -> Iterator[Document]:
        for doc in docs:
            if doc.meta.get("format") != "html":
                yield doc
                continue
            # characters ≤ UTF-8 bytes: the first test spares encoding a huge page
            if len(doc.text) > self.cfg.max_html_bytes or len(doc.text.encode("utf-8", "replace")) > self.cfg.max_html_bytes:
                stats.add("dropped.extract_too_large")
                continue
            started = time.perf_counter()
            try:
                with time_limit(self.cfg.timeout_s):
                    text, is_code_page = extract_text(doc.text, self.cfg)
            except ExtractTimeout:
                stats.add("dropped.extract_timeout")
                log.info("extraction of %s ran past %.1f s; dropped", doc.url, self.cfg.timeout_s)
                continue
            except Exception as e:  # parser faults on odd markup must not end the shard
                stats.add("failed.extract_error")
                log.warning("extraction of %s failed: %s", doc.url, e)
                continue
            finally:
                stats.add("time.extract_s", time.perf_counter() - started)
            if not text.strip():
                stats.add("dropped.extract_empty")
                continue
            doc.text = text
            doc.meta["format"] = "code" if is_code_page else "text"
            if is_code_page:
                stats.add("code_pages")
            yield doc
