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
import pyarrow as pa

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


def spaced_batch(texts) -> tuple[bytes, np.ndarray]:
    """A pyarrow string array's ``spaced_bytes``, concatenated, and the D + 1 offsets of each text.

    Read from the array's UTF-8 buffer with one ``bytes.translate`` for the whole batch: no Python
    string per document. Only texts with non-ASCII bytes (and batches with nulls, which count as
    empty) go through the per-document Unicode path.
    """
    if texts.null_count or not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        pieces = [spaced_bytes(t or "") for t in texts.to_pylist()]
        return b"".join(pieces), np.r_[0, np.cumsum([len(p) for p in pieces], dtype=np.int64)]
    _, offsets_buffer, data = texts.buffers()[:3]
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
    raw = bytes(memoryview(data)[offsets[0] : offsets[-1]]) if data is not None else b""
    bounds = offsets - offsets[0]
    spaced = raw.translate(_ASCII)
    if raw.isascii():
        return spaced, bounds
    high = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) >= 0x80)
    unicode_docs = np.unique(np.searchsorted(bounds, high, side="right") - 1).tolist()
    pieces, sizes, done = [], np.diff(bounds), 0
    for d in unicode_docs:
        piece = spaced_bytes(texts[d].as_py())
        pieces += [spaced[bounds[done] : bounds[d]], piece]
        sizes[d], done = len(piece), d + 1
    pieces.append(spaced[bounds[done] :])
    return b"".join(pieces), np.r_[0, np.cumsum(sizes)]


@dataclasses.dataclass
class Words:
    """The words of a batch of ``spaced_bytes`` texts, found with NumPy (no Python object per word).

    ``blob`` holds the texts back to back (and one space at the end); word ``k`` is
    ``blob[starts[k]:ends[k]]``, never crossing from one text into the next; document ``d`` has
    ``counts[d]`` words, its first at ``first[d]``.
    """

    blob: np.ndarray  # uint8
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, texts: list[bytes]) -> "Words":
        sizes = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        return cls.of_concatenated(b"".join(texts), np.r_[0, np.cumsum(sizes)])

    @classmethod
    def of_arrow(cls, texts) -> "Words":
        """The words of a pyarrow string array of raw texts (``spaced_batch``)."""
        return cls.of_concatenated(*spaced_batch(texts))

    @classmethod
    def of_concatenated(cls, spaced: bytes, bounds: np.ndarray) -> "Words":
        """The words of texts concatenated in ``spaced``, text ``d`` at ``bounds[d]:bounds[d+1]``."""
        blob = np.frombuffer(spaced + b" ", dtype=np.uint8)
        nonspace = np.zeros(len(blob) + 1, dtype=bool)
        np.not_equal(blob, _SPACE, out=nonspace[1:])
        edges = np.flatnonzero(nonspace[1:] != nonspace[:-1])  # alternately a word's start and its end
        starts, ends = edges[0::2], edges[1::2]
        # A text ending in a letter is followed directly by the next text's first letter: split there.
        joins = np.unique(bounds[1:-1])
        joins = joins[(joins > 0) & (joins < len(spaced))]
        joins = joins[(blob[joins - 1] != _SPACE) & (blob[joins] != _SPACE)]
        if len(joins):
            starts = np.insert(starts, np.searchsorted(starts, joins), joins)
            ends = np.insert(ends, np.searchsorted(ends, joins), joins)
        first = np.searchsorted(starts, bounds)
        return cls(blob, starts, ends, np.diff(first), first[:-1])

    def normalized(self) -> list[memoryview]:
        """Each document's words joined by single spaces: ``normalize_text(text).encode()``, as views
        of one compacted buffer (hashing them copies nothing)."""
        has = self.counts > 0
        last = self.first[has] + self.counts[has] - 1
        separator = np.ones(len(self.ends), dtype=bool)  # the space after every word but a document's last
        separator[last] = False
        keep = self.blob != _SPACE
        keep[self.ends[separator]] = True
        compact = memoryview(self.blob[keep])
        sizes = np.zeros(len(self.counts), dtype=np.int64)
        if has.any():
            sizes[has] = np.add.reduceat(self.ends - self.starts, self.first[has]) + self.counts[has] - 1
        bounds = np.r_[0, np.cumsum(sizes)]
        return [compact[bounds[d] : bounds[d + 1]] for d in range(len(self.counts))]
