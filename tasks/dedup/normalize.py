"""Text normalisation shared by exact and near dedup, so both see the same words.

Steps, in order: Unicode NFKC (folds compatibility forms such as full-width letters and
ligatures), lowercase, every run of punctuation, symbols or underscores becomes one space,
whitespace runs collapse to one space, ends are stripped. ``"Hello,  WORLD!"`` and
``"hello world"`` normalise to the same text. Letters and digits of every script are kept.
"""

from __future__ import annotations

import re
import unicodedata

_NOT_WORD = re.compile(r"(?:[^\w\s]|_)+")


def normalized_words(text: str) -> list[str]:
    """The words of ``text`` after normalisation."""
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).split()


def normalize_text(text: str) -> str:
    """``text`` normalised: the words joined by single spaces."""
    return " ".join(normalized_words(text))
