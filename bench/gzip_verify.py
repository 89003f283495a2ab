"""What proving a one-member .warc.gz whole costs: its gzip trailer against what FastWARC inflated,
or (the baseline, and the fallback when they differ) zlib inflating the member a second time.

    python bench/gzip_verify.py                                        # the generated sample crawl
    python bench/gzip_verify.py --input '../shared/data/realcrawl-dev/*.warc.gz' --copies 3

The inputs' records are joined into one gzip member (as some crawlers write whole files). Each way
runs ``--repeat`` times, alternating, the least CPU time counting: FastWARC inflating the file, then
``VerifiedGzip.ends_complete``. Prints one JSON line: sizes, ``trailer_s``, ``reinflate_s`` and
``speedup`` (reinflate / trailer), and the machine's load average.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

from fastwarc.stream_io import GzipReader

from tasks.ingest.warc import VerifiedGzip
from tasks.sample.crawl import write_sample_crawl


def one_member(inputs: list[str], copies: int) -> bytes:
    records = b"".join(gzip.decompress(Path(p).read_bytes()) if p.endswith(".gz") else Path(p).read_bytes()
                       for p in inputs)
    return gzip.compress(records * copies, mtime=0)


def inflate_and_verify(path: Path, reinflate: bool) -> tuple[float, bool, int]:
    started = time.process_time()
    with open(path, "rb") as raw:
        source = VerifiedGzip(GzipReader(raw))
        size = sum(len(chunk) for chunk in source)
        # the baseline is what ends_complete did before the trailer check, and still does when it differs
        whole = source.last_member_inflates_whole(raw) if reinflate else source.ends_complete(raw)
    return time.process_time() - started, whole, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="WARC files (glob); default: a generated sample crawl")
    parser.add_argument("--copies", type=int, default=1, help="repeat the records this many times in the member")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smelt-gzip-") as tmp:
        if args.input:
            inputs = sorted(glob.glob(args.input))
        else:
            crawl = Path(tmp) / "crawl"
            inputs = [str(crawl / name) for name in write_sample_crawl(str(crawl), pages=3200, files=16)["files"]]
        data = one_member(inputs, args.copies)
        path = Path(tmp) / "one-member.warc.gz"
        path.write_bytes(data)
        best = {"trailer": float("inf"), "reinflate": float("inf")}
        for _ in range(args.repeat):
            for way in best:
                cpu, whole, size = inflate_and_verify(path, reinflate=way == "reinflate")
                assert whole, f"{way}: the intact file was not proven whole"
                best[way] = min(best[way], cpu)
    print(json.dumps({"inputs": len(inputs), "compressed_mb": round(len(data) / 2**20, 2),
                      "uncompressed_mb": round(size / 2**20, 1), "trailer_s": round(best["trailer"], 4),
                      "reinflate_s": round(best["reinflate"], 4),
                      "speedup": round(best["reinflate"] / best["trailer"], 2), "load_avg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
