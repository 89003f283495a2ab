"""Cost of verifying shards as they are read (tasks/verified_reads.py): read throughput with and without it.

Prints one JSON line. Every figure is a ratio measured in this run on files in the page cache
(the worst case for verification: no disk or network time to hide the hashing behind):

- ``bytes``: a token shard read whole, plain ``fs.open().read`` vs ``verified_reads.open_shard`` (xxh3-128),
  and the same with a sha256 manifest, to show why the default is not sha256;
- ``parquet``: a documents shard decoded by pyarrow from the file vs ``verified_reads.read_parquet``;
- ``parquet_texts``: the same, then its texts as Python strings (the first thing dedup and tokenize do
  with them, and still far cheaper than their own work per byte);
- ``memmap``: a token shard mapped and summed, without and with ``verify_local_file`` first.

Usage: ``python bench/verify.py [--mib 256] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks import contract, storage, verified_reads
from tasks.checksums import CHECKSUM, file_checksum


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the token shard (the Parquet shard is a quarter)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = storage.normalize_url(tmp) + "/ds"
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, 50_000, size=args.mib * (1 << 20) // 2, dtype="<u2")
        bin_info = contract.write_shard(url, "train-00000.bin", lambda f: f.write(tokens.tobytes()) // 2)
        words = np.array(["river", "library", "bread", "harbour", "morning", "valley", "engineer", "market"])
        texts = [" ".join(rng.choice(words, 200)) for _ in range(args.mib * (1 << 20) // 4 // 1400)]
        table = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
        parquet_info = contract.write_shard(url, "docs-00000.parquet", lambda f: pq.write_table(table, f) or len(texts))
        manifest = contract.commit(url, "bench", "bench-verify", [bin_info, parquet_info], {})
        fs, bin_path = storage.filesystem(contract.shard_url(manifest, bin_info))
        _, parquet_path = storage.filesystem(contract.shard_url(manifest, parquet_info))
        sha_info = dataclasses.replace(bin_info, checksum=file_checksum(fs, bin_path, "sha256"))

        def plain_bytes():
            with fs.open(bin_path, "rb") as f:
                while f.read(4 << 20):
                    pass

        def verified_bytes(info):
            with verified_reads.open_verified(contract.shard_url(manifest, info), info) as f:
                while f.read(4 << 20):
                    pass

        def plain_parquet():
            with fs.open(parquet_path, "rb") as f:
                pq.read_table(f)

        def plain_texts():
            with fs.open(parquet_path, "rb") as f:
                pq.read_table(f).column("text").to_pylist()

        def verified_texts():
            verified_reads.read_parquet(contract.shard_url(manifest, parquet_info), parquet_info).column("text").to_pylist()

        def plain_memmap():
            int(np.memmap(bin_path, dtype="<u2", mode="r").sum(dtype=np.uint64))

        def verified_memmap():
            verified_reads.verify_local_file(bin_path, bin_info, url)
            plain_memmap()

        plain_bytes()  # warm the page cache
        cases = {
            "bytes_plain": plain_bytes,
            "bytes_xxh3": lambda: verified_bytes(bin_info),
            "bytes_sha256": lambda: verified_bytes(sha_info),
            "parquet_plain": plain_parquet,
            "parquet_xxh3": lambda: verified_reads.read_parquet(contract.shard_url(manifest, parquet_info), parquet_info),
            "texts_plain": plain_texts,
            "texts_xxh3": verified_texts,
            "memmap_plain": plain_memmap,
            "memmap_xxh3": verified_memmap,
        }
        t = dict.fromkeys(cases, float("inf"))
        for _ in range(args.repeat):  # interleaved, best of each: other load on the machine hits both alike
            for name, fn in cases.items():
                t[name] = min(t[name], best_of(1, fn))
    gbps = lambda seconds, size: round(size / seconds / 1e9, 2)  # noqa: E731
    print(json.dumps({
        "bench": "verify",
        "checksum": CHECKSUM,
        "token_shard_mib": args.mib,
        "parquet_shard_mib": round(parquet_info.bytes / (1 << 20), 1),
        "bytes_read_gbps": {"plain": gbps(t["bytes_plain"], bin_info.bytes), "xxh3_128": gbps(t["bytes_xxh3"], bin_info.bytes),
                            "sha256": gbps(t["bytes_sha256"], bin_info.bytes)},
        "overhead": {
            "bytes_xxh3_128": round(t["bytes_xxh3"] / t["bytes_plain"] - 1, 3),
            "bytes_sha256": round(t["bytes_sha256"] / t["bytes_plain"] - 1, 3),
            "parquet_xxh3_128": round(t["parquet_xxh3"] / t["parquet_plain"] - 1, 3),
            "parquet_texts_xxh3_128": round(t["texts_xxh3"] / t["texts_plain"] - 1, 3),
            "memmap_xxh3_128": round(t["memmap_xxh3"] / t["memmap_plain"] - 1, 3),
        },
    }))


if __name__ == "__main__":
    main()
