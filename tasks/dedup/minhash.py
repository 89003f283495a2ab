"""MinHash signatures of word shingles, vectorised over a batch of documents with NumPy.

Input is a batch's words (``normalize.Words``: byte ranges of the texts' UTF-8). Every step runs
over the batch at once, with no Python loop per word or shingle:

    word hash   w = fmix64(Σⱼ bⱼ·Pʲ  xor  len)   (bytes bⱼ of the word, mod 2⁶⁴, P odd), as
                    prefix sums over the whole batch: Σⱼ bⱼ·Pʲ of a word = (S[end] − S[start])·P⁻ˢᵗᵃʳᵗ
    shingle     h = fmix64(((w₀·M + w₁)·M + w₂)·M + …)   (mod 2⁶⁴, M odd), top 32 bits for
                    the 32-bit schemes

Shingles are runs of ``n`` consecutive words (a document shorter than ``n`` words is one shingle of
all its words; an empty document has none). ``hash_shingle`` computes the same value for one
shingle string, so it can be passed to datasketch as ``hashfunc``: smelt's signatures then equal
``datasketch.MinHash(num_perm, seed, hashfunc=..., scheme=...)`` fed with ``shingle_strings`` — a
test checks this for every scheme — and can be queried with datasketch's ``MinHashLSH``. (The word
hash was BLAKE2b per distinct word, looked up through a Python dict: 80% of the stage's CPU.)

Permutations (datasketch 2.x): ``affine32``/``affine64`` pre-mix the shingle hash with the
MurmurHash3 finalizer and map it with ``a·h + b mod 2^w`` (``a`` odd); ``legacy`` is
``(a·h + b) mod (2⁶¹ − 1)`` truncated to 32 bits. ``a``, ``b`` come from
``numpy.random.RandomState(seed)`` exactly as datasketch draws them.

Shape legend: D documents, W words, T shingles, P permutations.
"""

from __future__ import annotations

import functools

import numpy as np

from tasks.dedup.normalize import Words

_MULT = np.uint64(0x9E3779B97F4A7C15)
_BYTE_MULT = 0x100000001B3  # FNV's 64-bit prime (odd, so invertible mod 2⁶⁴)
_BYTE_MULT_INV = pow(_BYTE_MULT, -1, 1 << 64)
_SPAN = 1 << 18  # bytes hashed per prefix-sum pass: its 2 MB uint64 buffer stays in cache (2.3× faster than 1 MB spans)
_MERSENNE = np.uint64((1 << 61) - 1)
_MAX32 = np.uint64((1 << 32) - 1)
_FMIX = {
    32: (np.uint32(16), np.uint32(0x85EBCA6B), np.uint32(13), np.uint32(0xC2B2AE35), np.uint32(16)),
    64: (np.uint64(33), np.uint64(0xFF51AFD7ED558CCD), np.uint64(33), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33)),
}
SCHEME_BITS = {"affine32": 32, "affine64": 64, "legacy": 32}  # width of the shingle hash fed in
SIGNATURE_DTYPE = {"affine32": np.uint32, "affine64": np.uint64, "legacy": np.uint64}
_EMPTY_VALUE = {"affine32": (1 << 32) - 1, "affine64": (1 << 64) - 1, "legacy": (1 << 32) - 1}


def fmix(values: np.ndarray, bits: int) -> np.ndarray:
    """MurmurHash3 finalizer on uint32/uint64 arrays (a bijection that avalanches every bit)."""
    s1, m1, s2, m2, s3 = _FMIX[bits]
    values = values ^ (values >> s1)
    values = values * m1
    values = values ^ (values >> s2)
    values = values * m2
    return values ^ (values >> s3)


def shingle_strings(words: list[str], n: int) -> list[str]:
    """The shingles of one document as space-joined strings (for datasketch and for people)."""
    if not words:
        return []
    if len(words) < n:
        return [" ".join(words)]
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def _poly(word: bytes) -> int:
    """Σⱼ bⱼ·Pʲ mod 2⁶⁴ of one word, by Horner's rule."""
    poly = 0
    for byte in reversed(word):
        poly = (poly * _BYTE_MULT + byte) & 0xFFFFFFFFFFFFFFFF
    return poly


def _word_hash(word: bytes) -> int:
    return int(fmix(np.array([_poly(word) ^ len(word)], dtype=np.uint64), 64)[0])


def hash_shingle(shingle: str | bytes, bits: int = 32) -> int:
    """Hash of one space-joined shingle, equal to what ``shard_shingle_hashes`` computes."""
    if isinstance(shingle, str):
        shingle = shingle.encode("utf-8")
    h = np.zeros(1, dtype=np.uint64)
    for word in shingle.split(b" "):
        h = h * _MULT + np.uint64(_word_hash(word))
    h = fmix(h, 64)
    return int(h[0] >> np.uint64(32)) if bits == 32 else int(h[0])


@functools.cache
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """(Pʲ, P⁻ʲ) mod 2⁶⁴ for j < _SPAN (uint64 products wrap, which is the modulus)."""
    up, down = np.full(_SPAN, _BYTE_MULT, dtype=np.uint64), np.full(_SPAN, _BYTE_MULT_INV, dtype=np.uint64)
    up[0] = down[0] = 1
    return np.cumprod(up), np.cumprod(down)


def _word_hashes(blob: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Hashes of the words ``blob[starts[k]:ends[k]]`` (sorted, disjoint), _SPAN bytes at a time,
    in one reused buffer (the uint8 → uint64 cast happens inside the multiply, never as an array)."""
    up, down = _powers()
    poly = np.empty(len(starts), dtype=np.uint64)
    prefix = np.zeros(_SPAN + 1, dtype=np.uint64)
    lo = 0
    while lo < len(starts):
        base = int(starts[lo])
        hi = int(np.searchsorted(ends, base + _SPAN, side="right"))
        if hi == lo:  # one word longer than a span: hashed on its own
            poly[lo] = _poly(blob[starts[lo] : ends[lo]].tobytes())
            lo += 1
            continue
        n = int(ends[hi - 1]) - base
        sums = prefix[1 : n + 1]
        np.multiply(blob[base : base + n], up[:n], out=sums)
        np.cumsum(sums, out=sums)
        s, e = starts[lo:hi] - base, ends[lo:hi] - base
        word = prefix[e]
        word -= prefix[s]
        word *= down[s]
        poly[lo:hi] = word
        lo = hi
    poly ^= (ends - starts).astype(np.uint64)
    return fmix(poly, 64)


def shard_shingle_hashes(words: Words, n: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of every document of a batch (``normalize.Words``), concatenated.

    Returns ``(hashes (T,), offsets (D+1,))``: document ``d``'s shingles are
    ``hashes[offsets[d]:offsets[d+1]]``. uint32 for ``bits=32``, uint64 for 64.
    """
    lengths, first_word = words.counts, words.first
    counts = np.where(lengths >= n, lengths - n + 1, np.minimum(lengths, 1))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out_dtype = np.uint32 if bits == 32 else np.uint64
    if offsets[-1] == 0:
        return np.zeros(0, dtype=out_dtype), offsets

    word_hashes = _word_hashes(words.blob, words.starts, words.ends)

    # Rolling polynomial over every window of n words (windows crossing a document end are not used).
    padded = np.concatenate([word_hashes, np.zeros(n - 1, dtype=np.uint64)])
    windows = padded[: len(word_hashes)].copy()
    for k in range(1, n):
        windows *= _MULT
        windows += padded[k : k + len(word_hashes)]
    first_window = np.repeat(first_word - offsets[:-1], counts) + np.arange(offsets[-1])
    hashes = windows[first_window]

    # A document shorter than n words is one shingle of all its words.
    for length in range(1, n):
        docs = np.flatnonzero(lengths == length)
        if len(docs):
            poly = word_hashes[first_word[docs]].copy()
            for k in range(1, length):
                poly = poly * _MULT + word_hashes[first_word[docs] + k]
            hashes[offsets[docs]] = poly
    hashes = fmix(hashes, 64)
    return (hashes >> np.uint64(32)).astype(np.uint32) if bits == 32 else hashes, offsets


def permutations(num_perm: int, seed: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) permutation parameters, drawn exactly as datasketch 2.x draws them."""
    gen = np.random.RandomState(seed)
    if scheme == "legacy":
        pairs = [
            (gen.randint(1, _MERSENNE, dtype=np.uint64), gen.randint(0, _MERSENNE, dtype=np.uint64))
            for _ in range(num_perm)
        ]
        ab = np.array(pairs, dtype=np.uint64).T
        return ab[0], ab[1]
    dtype = SIGNATURE_DTYPE[scheme]
    width = np.dtype(dtype).itemsize * 8
    a = gen.randint(0, 1 << (width - 1), num_perm, dtype=dtype) * dtype(2) + dtype(1)
    b = gen.randint(0, 1 << width, num_perm, dtype=dtype)
    return a, b


class MinHasher:
    """Signatures for a shard: holds only config values, so it pickles to workers."""

    def __init__(self, num_perm: int = 128, seed: int = 1, scheme: str = "affine32", batch: int = 8192):
        self.num_perm, self.seed, self.scheme, self.batch = num_perm, seed, scheme, batch
        self.bits = SCHEME_BITS[scheme]
        self.dtype = SIGNATURE_DTYPE[scheme]
        self.a, self.b = permutations(num_perm, seed, scheme)

    def _mixed(self, hashes: np.ndarray) -> np.ndarray:
        """Shingle hashes as the permutations take them (pre-mixed for the affine schemes)."""
        if self.scheme == "legacy":
            return hashes.astype(np.uint64)
        return fmix(hashes.astype(self.dtype), 64 if self.scheme == "affine64" else 32)

    def _permute(self, values: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` (P, T) := the permuted values of a batch of mixed shingle hashes (T,)."""
        np.multiply(self.a[:, None], values[None, :], out=out)
        out += self.b[:, None]
        if self.scheme == "legacy":
            out %= _MERSENNE
            out &= _MAX32
        return out

    def signatures(self, hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(D, P) signatures from ``shard_shingle_hashes`` output; a document without shingles
        gets the empty signature (every value at its maximum), as an un-updated datasketch MinHash."""
        n_docs = len(offsets) - 1
        out = np.full((n_docs, self.num_perm), _EMPTY_VALUE[self.scheme], dtype=self.dtype)
        nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
        doc_starts = offsets[nonempty]
        total = len(hashes)
        mixed = self._mixed(hashes)
        buffer = np.empty((self.num_perm, min(self.batch, total)), dtype=mixed.dtype)
        # Batches of shingles may split a document; its partial minima are merged with np.minimum.
        for lo in range(0, total, self.batch):
            hi = min(lo + self.batch, total)
            first = np.searchsorted(doc_starts, lo, side="right") - 1
            last = np.searchsorted(doc_starts, hi, side="left")
            seg_starts = np.maximum(doc_starts[first:last], lo) - lo
            permuted = self._permute(mixed[lo:hi], buffer[:, : hi - lo])
            minima = np.minimum.reduceat(permuted, seg_starts, axis=1)  # (P, docs)
            rows = nonempty[first:last]
            out[rows] = np.minimum(out[rows], minima.T)
        return out
