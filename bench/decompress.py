"""Speed and peak memory of smelt's stream decoder (``tasks.compression.frames``) against each format's plain
decompressor, fed the same 1 MiB chunks with no output cap (the baseline; zstandard's decompressobj takes no
cap at all).

Two inputs per format (gzip, bz2, xz, zstd), both compressed here:
- ``text``: the generated sample crawl's WARC records (``tasks/sample/crawl.py``), repeated to ``--text-mb``;
- ``bomb``: ``--bomb-mb`` of zero bytes, a few kilobytes compressed, the input that makes an uncapped decoder
  hold it all at once.

Per format and input it prints the output MB/s of both (``speedup``: smelt's over the baseline's, the same
run on the same machine), the largest chunk each hands out, and the peak of Python's traced allocations
while decoding (``tracemalloc``; the decoders' output buffers are Python bytes). Prints one JSON line.
Usage: ``python bench/decompress.py [--text-mb 32] [--bomb-mb 256]``.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import lzma
import os
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import zstandard

from tasks.compression import GAP, MEMBER_END, READ_CHUNK, frames
from tasks.sample.crawl import write_sample_crawl

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: zlib.compress(data, 6, wbits=31),
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zstd": zstandard.ZstdCompressor(write_checksum=True).compress,
}
PLAIN: dict[str, Callable[[], object]] = {
    "gzip": lambda: zlib.decompressobj(31),
    "bz2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
    "zstd": lambda: zstandard.ZstdDecompressor().decompressobj(),
}


def plain_chunks(kind: str, compressed: bytes) -> Iterator[bytes]:
    decoder = PLAIN[kind]()
    for at in range(0, len(compressed), READ_CHUNK):
        if out := decoder.decompress(compressed[at:at + READ_CHUNK]):
            yield out


def smelt_chunks(kind: str, compressed: bytes) -> Iterator[bytes]:
    for out in frames(io.BytesIO(compressed), kind):
        if out is not GAP and out is not MEMBER_END:
            yield out


def measure(chunks: Iterator[bytes], expected: int) -> dict:
    tracemalloc.start()
    start = time.perf_counter()
    total = biggest = 0
    for out in chunks:
        total += len(out)
        biggest = max(biggest, len(out))
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if total != expected:
        raise AssertionError(f"decoded {total} bytes, expected {expected}")
    return {"mb_per_s": round(expected / 1e6 / seconds, 1), "largest_chunk_kb": round(biggest / 1024, 1),
            "peak_mb": round(peak / 1e6, 2)}


def text_sample(megabytes: int) -> bytes:
    """The sample crawl's WARC bytes, uncompressed, repeated to ``megabytes``."""
    with tempfile.TemporaryDirectory() as tmp:
        write_sample_crawl(tmp, pages=300, files=1, seed=0)
        warc = b"".join(gzip.decompress(path.read_bytes()) for path in sorted(Path(tmp).glob("*.warc.gz")))
    return (warc * (megabytes * 10**6 // len(warc) + 1))[: megabytes * 10**6]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-mb", type=int, default=32, help="MB of sample-crawl pages per format")
    parser.add_argument("--bomb-mb", type=int, default=256, help="MB of zero bytes, compressed")
    args = parser.parse_args()
    inputs = {"text": text_sample(args.text_mb), "bomb": bytes(args.bomb_mb << 20)}
    result: dict = {"bench": "decompress", "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
                    "text_mb": args.text_mb, "bomb_mb": args.bomb_mb}
    for kind, compress in COMPRESS.items():
        for name, data in inputs.items():
            compressed = compress(data)
            plain = measure(plain_chunks(kind, compressed), len(data))
            smelt = measure(smelt_chunks(kind, compressed), len(data))
            result[f"{kind}.{name}"] = {"compressed_kb": round(len(compressed) / 1024, 1), "plain": plain,
                                        "smelt": smelt,
                                        "speedup": round(smelt["mb_per_s"] / plain["mb_per_s"], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
