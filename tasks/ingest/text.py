"""Text helpers shared by the document steps: words, lines, paragraphs, sentences, code detection.

One definition of "word" for every rule, so thresholds mean the same thing everywhere: a run of
letters/digits/underscores, optionally joined by an inner apostrophe, hyphen or dot ("don't",
"e-mail", "3.14"). Pure punctuation and symbols are not words (Gopher counts "#" and "..." as
symbols, not words). Scripts written without spaces (Chinese, Japanese, Thai) come out as one long
"word" per run; the prose rules are tuned for English, which is what the language step keeps by
default.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from tasks.documents import Document

from tasks.ingest.base import Filter

WORD_RE = re.compile(r"\w+(?:['’.\-]\w+)*")
PARAGRAPH_BREAK_RE = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# A sentence ends at ., ! or ? (possibly repeated), optionally followed by closing quotes or
# brackets, and then whitespace.
SENTENCE_END_RE = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")
HAS_WORD_CHAR_RE = re.compile(r"\w")
NO_LETTER_WORD_RE = re.compile(r"(?<!\S)[0-9_'’.\-]+(?!\S)")


# Documents pass through the step chain one at a time, so consecutive rules ask for the words of
# the same text: remember the last few splits instead of redoing them. Callers must not mutate.
@functools.lru_cache(maxsize=8)
def split_words(text: str) -> list[str]:
    return WORD_RE.findall(text)


def lowercase_words(words: list[str]) -> list[str]:
    # one C-level pass: no word contains a space
    return " ".join(words).lower().split(" ") if words else []


def count_words_without_letters(words: list[str]) -> int:
    """Words made only of ASCII digits, underscores and joiners ("2024", "3.14", "1-2")."""
    joined = " ".join(words)
    if not any(ch in joined for ch in "0123456789_"):  # most prose: skip the slower regex pass
        return 0
    return len(NO_LETTER_WORD_RE.findall(joined))


def non_empty_lines(text: str) -> list[str]:
    """Lines with surrounding whitespace removed; blank lines are layout, not content."""
    return [stripped for line in text.splitlines() if (stripped := line.strip())]


def split_paragraphs(text: str) -> list[str]:
    """Blocks separated by at least one blank (or whitespace-only) line."""
    stripped = text.strip()
    return PARAGRAPH_BREAK_RE.split(stripped) if stripped else []


def count_sentences(line: str) -> int:
    """Sentences in ``line``: pieces between sentence-ending punctuation that hold a word character."""
    return sum(1 for piece in SENTENCE_END_RE.split(line) if HAS_WORD_CHAR_RE.search(piece))


def duplicates(items: Iterable[str]) -> tuple[int, int]:
    """(count, characters) of items that repeat an earlier item; first occurrences are not counted."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def is_code(doc: Document) -> bool:
    return doc.source == "code" or doc.meta.get("format") == "code"


class ProseFilter(Filter):
    """A filter whose rules are about natural-language prose: code documents pass unjudged
    (``skipped.code``)."""

    def skip_reason(self, doc: Document) -> str | None:
        return "code" if is_code(doc) else None
