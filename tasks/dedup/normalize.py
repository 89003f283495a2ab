"""Text normalisation shared by exact and near dedup, so both see the same words.

Steps, in order: Unicode NFKC (folds compatibility forms such as full-width letters and
ligatures), lowercase, every punctuation or symbol character (Unicode categories P* and S*,
which include ``_``) becomes a space, then the text is split on whitespace. Letters, combining
marks and digits of every script are kept. ``"Hello,  WORLD!"`` and ``"hello world"`` give the
same words.
"""

from __future__ import annotations

import dataclasses
import unicodedata

import numpy as np

_SPACE = ord(" ")


class _Separators(dict):
    """``str.translate`` table: punctuation and symbols → space, everything else → itself.

    Filled lazily, one entry per distinct character seen, so it costs nothing up front and
    translate runs at C speed (a regex over Unicode classes was 15× slower).
    """

    def __missing__(self, codepoint: int) -> int:
        value = 32 if unicodedata.category(chr(codepoint))[0] in "PS" else codepoint
        self[codepoint] = value
        return value


_SEPARATORS = _Separators()


def _ascii_table() -> bytes:
    """``bytes.translate`` table giving ASCII text what ``normalized_words`` does to it: NFKC is the
    identity there, so lowercase letters, and punctuation, symbols and ``str.split`` whitespace
    (which includes the separators \\x1c–\\x1f that ``bytes.split`` does not know) become spaces."""
    table = bytearray(range(256))
    for code in range(128):
        char = chr(code)
        if char.isspace() or unicodedata.category(char)[0] in "PS":
            table[code] = 32
        else:
            table[code] = ord(char.lower())
    return bytes(table)


_ASCII = _ascii_table()


def normalized_words(text: str) -> list[str]:
    """The words of ``text`` after normalisation."""
    return unicodedata.normalize("NFKC", text).lower().translate(_SEPARATORS).split()


def normalize_text(text: str) -> str:
    """``text`` normalised: the words joined by single spaces."""
    return " ".join(normalized_words(text))


def spaced_bytes(text: str) -> bytes:
    """``text`` lowercased with every separator a space, as UTF-8, runs of spaces not yet collapsed:
    its words (``bytes.split()``) are ``normalized_words(text)``. ASCII text (most of it) takes a
    byte-table path ~10× faster than the Unicode one."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII)
    return " ".join(normalized_words(text)).encode("utf-8")


@dataclasses.dataclass
class Words:
    """The words of a batch of ``spaced_bytes`` texts, found with NumPy (no Python object per word).

    ``blob`` holds the texts joined by one space; word ``k`` is ``blob[starts[k]:ends[k]]``;
    document ``d`` has ``counts[d]`` words, its first at ``first[d]``.
    """

    blob: np.ndarray  # uint8
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, texts: list[bytes]) -> "Words":
        blob = np.frombuffer(b" ".join(texts) + b" ", dtype=np.uint8)
        edges = np.diff(np.r_[False, blob != _SPACE, False].view(np.int8))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        text_starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))[:-1] + 1, out=text_starts[1:])
        counts = np.bincount(np.searchsorted(text_starts, starts, side="right") - 1, minlength=len(texts))
        first = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        return cls(blob, starts, ends, counts, first)

    def normalized(self) -> list[bytes]:
        """Each document's words joined by single spaces: ``normalize_text(text).encode()``."""
        has = self.counts > 0
        last = self.first[has] + self.counts[has] - 1
        separator = np.ones(len(self.ends), dtype=bool)  # the space after every word but a document's last
        separator[last] = False
        keep = self.blob != _SPACE
        keep[self.ends[separator]] = True
        compact = self.blob[keep].tobytes()
        sizes = np.zeros(len(self.counts), dtype=np.int64)
        if has.any():
            sizes[has] = np.add.reduceat(self.ends - self.starts, self.first[has]) + self.counts[has] - 1
        bounds = np.r_[0, np.cumsum(sizes)]
        return [compact[bounds[d] : bounds[d + 1]] for d in range(len(self.counts))]
