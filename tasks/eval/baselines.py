"""Compression baselines: what general-purpose compressors make of exactly the bytes the model scored.

A model's bits per byte means little alone; beside ``xz -9e``, ``zstd -19`` and ``zlib -9`` on the
same bytes it answers "did it learn anything a compressor does not already know". Each figure is the
compressed size of the whole text in bits over its bytes, container included, so it equals what the
command line tool writes for a file holding those bytes (``xz -9e``: LZMA2 preset 9 extreme with its
CRC64 check; ``zstd -19``: level 19 with the content size and checksum; ``zlib -9``: the zlib stream).
"""

from __future__ import annotations

import lzma
import zlib

import zstandard

# name → (label as a person would type it, compress function)
COMPRESSORS = {
    "xz": ("xz -9e", lambda data: lzma.compress(data, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)),
    "zstd": ("zstd -19", lambda data: zstandard.ZstdCompressor(level=19, write_checksum=True).compress(data)),
    "zlib": ("zlib -9", lambda data: zlib.compress(data, 9)),
}


def compressed_bits_per_byte(data: bytes) -> dict[str, float]:
    """Compressor name → bits per byte of its output for ``data`` (an empty text scores 0)."""
    if not data:
        return {name: 0.0 for name in COMPRESSORS}
    return {name: 8 * len(compress(data)) / len(data) for name, (_, compress) in COMPRESSORS.items()}


def below(model_bpb: float, baseline_bpb: float) -> float:
    """How far the model is below a baseline, as a fraction of it (0.35: 35% fewer bits; negative: worse)."""
    return 1.0 - model_bpb / baseline_bpb if baseline_bpb > 0 else 0.0
