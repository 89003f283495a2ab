"""Offline text for the sample crawl: stdlib docstrings, stdlib sources and bundled prose.

Everything here comes from the running Python's standard library or from files shipped in this
package, so the sample is the same on every machine with the same Python version. Modules are
read in a fixed order and objects in sorted order; nothing depends on the environment, the
working directory or hash randomisation.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.resources
import inspect
import logging
import re
import sys
import sysconfig
import textwrap
import warnings
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)

# Pure-Python or always-built modules whose docstrings and members do not vary by platform or by
# optional C libraries (no os, socket, ssl, sqlite3, lzma, ctypes, tkinter, decimal).
DOCSTRING_MODULES = (
    "abc", "argparse", "ast", "asyncio.base_events", "asyncio.events", "asyncio.futures",
    "asyncio.locks", "asyncio.protocols", "asyncio.queues", "asyncio.runners", "asyncio.streams",
    "asyncio.tasks", "asyncio.transports", "base64", "bdb", "bisect", "builtins", "calendar",
    "cmd", "code", "codecs", "codeop", "collections", "collections.abc", "colorsys",
    "compileall", "concurrent.futures", "concurrent.futures._base", "configparser",
    "contextlib", "contextvars", "copy", "copyreg", "csv", "dataclasses", "datetime", "difflib",
    "dis", "doctest", "email._header_value_parser", "email._policybase", "email.charset",
    "email.contentmanager", "email.feedparser", "email.generator", "email.header",
    "email.headerregistry", "email.iterators", "email.message", "email.mime.multipart",
    "email.parser", "email.policy", "email.utils", "enum", "filecmp", "fileinput", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "graphlib", "gzip",
    "heapq", "hmac", "html", "html.parser", "http.client", "http.cookiejar", "http.cookies",
    "http.server", "imaplib", "importlib", "importlib.abc", "importlib.machinery",
    "importlib.metadata", "importlib.resources", "importlib.util", "inspect", "io", "ipaddress",
    "itertools", "json", "json.decoder", "json.encoder", "keyword", "linecache", "logging",
    "logging.config", "logging.handlers", "mailbox", "math", "mimetypes", "modulefinder",
    "netrc", "numbers", "operator", "optparse", "pathlib", "pdb", "pickle", "pickletools",
    "pkgutil", "plistlib", "poplib", "pprint", "profile", "pstats", "py_compile", "pyclbr",
    "queue", "quopri", "random", "re", "reprlib", "rlcompleter", "runpy", "sched", "secrets",
    "shelve", "shlex", "shutil", "smtplib", "socketserver", "statistics", "string",
    "stringprep", "struct", "symtable", "tabnanny", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "token", "tokenize", "tomllib", "trace", "traceback", "types",
    "typing", "unittest.case", "unittest.loader", "unittest.mock", "unittest.result",
    "unittest.runner", "unittest.suite", "urllib.parse", "urllib.request", "urllib.response",
    "urllib.robotparser", "uuid", "warnings", "wave", "weakref", "wsgiref.handlers",
    "wsgiref.headers", "wsgiref.simple_server", "wsgiref.util", "wsgiref.validate",
    "xml.dom.minidom", "xml.dom.pulldom", "xml.etree.ElementTree", "xml.sax", "xml.sax.handler",
    "xml.sax.saxutils", "xml.sax.xmlreader", "xmlrpc.client", "xmlrpc.server", "zipapp",
    "zipfile", "zipimport", "zoneinfo",
)

# Files in the stdlib directory that are not ordinary source (``this`` is rot13 text).
SKIPPED_SOURCE_FILES = frozenset({"this.py"})

FOREIGN_LANGS = ("de", "fr", "es", "it")

MIN_PARAGRAPH_WORDS = 10  # shorter ones are mostly one-line API summaries, not prose
# Gopher drops pages whose repeated word 5-grams cover more than 15% of the characters.
MAX_REPEATED_SHARE = 0.10
MIN_CODE_LINES = 40
MAX_CODE_LINES = 150

# Lines that mark a paragraph as code, a list, a table or markup rather than running prose.
_NOT_PROSE_LINE = re.compile(r"^(\s|>>>|\.\.\.|[-*+|:#=]|\d+[.)]\s)|\s--\s|::|={3,}|-{3,}")
_RST_MARKUP = re.compile(r"``([^`]+)``|`([^`]+)`|\*\*([^*]+)\*\*|(?<!\w)\*([A-Za-z_][\w.]*)\*(?!\w)")
_LETTERS_AND_SPACES = re.compile(r"[^\W\d_]+|\s+")
_VOCABULARY_WORD = re.compile(r"\b[a-z]{3,}\b")
_CODE_TOKEN = re.compile(r"[()\[\]{}=_<>/\\@$]")
# A module- or class-level definition (or its decorator): where a listing may start or end.
_DEFINITION = re.compile(r"^(?: {4})?(?:def |class |async def |@)")


@dataclasses.dataclass(frozen=True)
class Paragraph:
    """One paragraph of English prose and where it came from (``json.decoder.JSONDecoder``)."""

    source: str
    text: str

    @property
    def words(self) -> int:
        return len(self.text.split())


@dataclasses.dataclass(frozen=True)
class CodeSlice:
    """Lines ``first``..``last`` (1-based, inclusive) of one stdlib source file."""

    file: str
    first: int
    last: int
    text: str


def prose_paragraphs_of(doc: str) -> list[str]:
    """The paragraphs of a docstring that read as running prose, with rST literals unwrapped.

    Doctest lines, code, bullet and option lists, tables and fragments without a capitalised
    start and a full stop are left out: the sample's English pages must look like articles, not
    like API listings. Indented prose (the body of a definition list) is kept.
    """
    kept = []
    for block in re.split(r"\n\s*\n", doc):
        lines = textwrap.dedent(block.strip("\n")).splitlines()
        if not lines or any(_NOT_PROSE_LINE.search(line) for line in lines):
            continue
        text = " ".join(line.strip() for line in lines)
        text = _RST_MARKUP.sub(lambda m: next(g for g in m.groups() if g), text)
        text = re.sub(r"\s+", " ", text).strip()
        words = text.split()
        if len(words) < MIN_PARAGRAPH_WORDS or not text[0].isupper() or not text.endswith("."):
            continue
        if len(_LETTERS_AND_SPACES.sub("", text)) > 0.12 * len(text):
            continue
        # Curly brackets: C4 drops any page that has one, and in docstrings they are code anyway.
        if "{" in text or "}" in text or sum(bool(_CODE_TOKEN.search(w)) for w in words) > 0.1 * len(words):
            continue
        if repeated_share(normalized_words(text)) > MAX_REPEATED_SHARE:
            continue
        kept.append(text)
    return kept


def normalized_words(text: str) -> list[str]:
    return [w.strip(".,;:!?\"'()").lower() for w in text.split()]


def repeated_share(words: list[str], n: int = 5) -> float:
    """Share of word characters inside a word n-gram that occurs twice: Gopher's repetition signal."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(grams)
    covered = {i + k for i, gram in enumerate(grams) if counts[gram] > 1 for k in range(n)}
    return sum(len(words[i]) for i in covered) / max(1, sum(map(len, words)))


def _documented_objects(module):
    """(qualified name, object) for a module, its public classes, their members and functions."""
    yield module.__name__, module
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj
            for member_name, member in sorted(vars(obj).items()):
                if not member_name.startswith("_"):
                    yield f"{module.__name__}.{name}.{member_name}", getattr(member, "__func__", member)
        elif callable(obj):
            yield f"{module.__name__}.{name}", obj


@functools.lru_cache(maxsize=1)
def english_paragraphs() -> tuple[Paragraph, ...]:
    """Distinct prose paragraphs from stdlib docstrings and the reference topics, in fixed order.

    Docstrings come from ``DOCSTRING_MODULES`` via ``inspect.getdoc``; the language reference
    topics that ``help()`` shows (``pydoc_data.topics``) follow. The first occurrence of a
    paragraph wins, so inherited docstrings appear once.
    """
    if sys.flags.optimize >= 2:
        raise RuntimeError("python -OO strips the docstrings the sample crawl is made of; run without -OO")
    seen: set[str] = set()
    out: list[Paragraph] = []

    def add(source: str, doc: str | None) -> None:
        for text in prose_paragraphs_of(doc or ""):
            if text not in seen:
                seen.add(text)
                out.append(Paragraph(source, text))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn on import
        for module_name in DOCSTRING_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # absent from this Python version: the sample follows the stdlib
                log.debug("sample: stdlib module %s not importable, skipped", module_name)
                continue
            for qualname, obj in _documented_objects(module):
                try:
                    doc = inspect.getdoc(obj)
                except Exception:  # a descriptor that raises on access has no usable docstring
                    continue
                add(qualname, doc if isinstance(doc, str) else None)
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        add(f"reference:{topic}", topics[topic])
    return tuple(out)


@functools.lru_cache(maxsize=1)
def english_vocabulary() -> tuple[str, ...]:
    """Sorted lower-case words (3+ letters) of the English paragraphs, for word salad and edits."""
    text = "\n".join(p.text for p in english_paragraphs()).lower()
    return tuple(sorted(set(_VOCABULARY_WORD.findall(text))))


@functools.lru_cache(maxsize=None)
def foreign_sentences(lang: str) -> tuple[str, ...]:
    """The sentences this package ships for ``lang`` (one per line in ``prose/<lang>.txt``)."""
    if lang not in FOREIGN_LANGS:
        raise ValueError(f"no bundled prose for language {lang!r}; use one of {', '.join(FOREIGN_LANGS)}")
    text = importlib.resources.files("tasks.sample").joinpath("prose", f"{lang}.txt").read_text("utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=1)
def stdlib_source_files() -> tuple[str, ...]:
    """Sorted names of the top-level ``*.py`` files of the stdlib (no site-packages, no tests)."""
    return tuple(sorted(p.name for p in stdlib_dir().glob("*.py") if p.name not in SKIPPED_SOURCE_FILES))


@functools.lru_cache(maxsize=256)
def code_slices_of(file: str) -> tuple[CodeSlice, ...]:
    """Non-overlapping slices of 40-150 lines of one stdlib file, cut before definitions."""
    lines = (stdlib_dir() / file).read_text("utf-8").splitlines()
    boundaries = [
        i for i, line in enumerate(lines)
        if _DEFINITION.match(line) and not (i and lines[i - 1].lstrip().startswith("@"))
    ] + [len(lines)]
    slices = []
    start = 0
    while len(lines) - start >= MIN_CODE_LINES:
        fits = [b for b in boundaries if start + MIN_CODE_LINES <= b <= start + MAX_CODE_LINES]
        end = fits[-1] if fits else min(start + MAX_CODE_LINES, len(lines))
        first, last = start, end  # trimmed of blank lines, so the stated line numbers are exact
        while first < last and not lines[first].strip():
            first += 1
        while last > first and not lines[last - 1].strip():
            last -= 1
        if first < last:
            slices.append(CodeSlice(file, first + 1, last, "\n".join(lines[first:last])))
        start = end
    return tuple(slices)
