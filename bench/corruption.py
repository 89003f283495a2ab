"""What damaged input costs, per format: flipped bits and cuts swept over real files, through smelt's readers.

The records are WARC records of ``--input`` (default: a generated sample crawl, ``tasks/sample/crawl.py``;
e.g. ``../shared/data/realcrawl-dev/*.warc.gz`` for real pages), repacked into each container:

- ``warc.zst``: one checksummed zstd frame per record (the zstd WARC layout), read by ``read_warc``;
- ``jsonl.<gz|bz2|xz|zst>``: a JSON line per record, three parts compressed apart and concatenated
  (``cat a.gz b.gz c.gz``), read by the ingest JSONL reader;
- ``tar.<gz|bz2|xz|zst>``: a file per record, read by the code reader's tar path;
- ``parquet`` with and without page checksums, row groups of 16 records, read by the ingest Parquet reader.

Each file is read clean, then with one bit flipped at ``--flips`` evenly spaced positions, then cut at
``--cuts`` positions. Per format it prints ``flips``, ``raised`` (the reader raised: its whole work item
fails), ``counted`` (a fault was counted),
``harmless`` (nothing counted and every record read unchanged), ``silent_loss`` (nothing counted, yet
records missing), ``wrong`` (flips after which a record was given out changed) and, for flips,
``kept_share``: records read over records in the file, summed over the flips (how much one fault
costs). ``cuts_counted`` / ``cuts``: cuts that counted a truncation or fault (``cuts_raised``: raised).
Prints one JSON line. Usage: ``python bench/corruption.py [--input GLOB] [--records 60] [--flips 150]``.
"""

from __future__ import annotations

import argparse
import bz2
import glob
import gzip
import io
import json
import logging
import lzma
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tasks.compression import GAP, MEMBER_END, frames
from tasks.counters import Stats
from tasks.ingest.code.config import CodeReaderConfig
from tasks.ingest.code.readers import plan_code_inputs, read_code
from tasks.ingest.config import ReaderConfig
from tasks.ingest.readers import read_documents

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": lambda b: gzip.compress(b, mtime=0), "bz2": bz2.compress, "xz": lzma.compress,
    "zst": zstandard.ZstdCompressor(write_checksum=True).compress,
}


def warc_records(paths: list[str], limit: int) -> list[bytes]:
    """The records of .warc.gz files, one per gzip member, uncompressed."""
    records: list[bytes] = []
    for path in paths:
        with open(path, "rb") as raw:
            record = b""
            for chunk in frames(raw, "gzip", frame_ends=True):
                if chunk is MEMBER_END:
                    records.append(record)
                    record = b""
                elif chunk is not GAP:
                    record += chunk
        if len(records) >= limit:
            break
    return records[:limit]


def containers(records: list[bytes]) -> dict[str, bytes]:
    """Each container's bytes."""
    texts = [r.decode("utf-8", "replace") for r in records]
    out = {"warc.zst": b"".join(COMPRESS["zst"](r) for r in records)}
    thirds = [texts[i::3] for i in range(3)]
    for kind, compress in COMPRESS.items():
        parts = [compress(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in part)) for part in thirds]
        out[f"jsonl.{kind}"] = b"".join(parts)
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as archive:
            for i, text in enumerate(texts):
                data = text.encode()
                info = tarfile.TarInfo(f"r/record{i:05d}.txt")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        out[f"tar.{kind}"] = compress(tar.getvalue())
    for checksum in (True, False):
        buffer = io.BytesIO()
        pq.write_table(pa.table({"text": texts}), buffer, write_page_checksum=checksum, row_group_size=16)
        out[f"parquet{'' if checksum else '-no-page-crc'}"] = buffer.getvalue()
    return out


def read(path: Path, fmt: str) -> tuple[list[str], dict[str, int]]:
    """The texts smelt's reader gives for ``path`` and its fault counters."""
    stats = Stats()
    logging.disable(logging.WARNING)
    try:
        if fmt.startswith("tar."):
            cfg = CodeReaderConfig(max_file_bytes=1 << 24)
            docs = [d for item in plan_code_inputs([str(path)], cfg) for d in read_code(item, cfg, stats)]
        else:
            docs = list(read_documents(str(path), ReaderConfig(max_payload_bytes=1 << 24), stats))
    finally:
        logging.disable(logging.NOTSET)
    return [d.text for d in docs], {k: v for k, v in stats.items() if k.startswith("failed.")}


def sweep(workdir: Path, fmt: str, data: bytes, flips: int, cuts: int) -> dict:
    """The flip and cut sweep of one container; a clean read is the reference (the readers' own drops, such
    as the sample crawl's binary pages, are not faults)."""
    path = workdir / f"input.{fmt.split('-')[0]}"
    path.write_bytes(data)
    clean, faults = read(path, fmt)
    assert clean and not faults, f"{fmt}: a clean read gives nothing or counts a fault: {faults}"
    known = set(clean)
    row = {"bytes": len(data), "records": len(clean), "flips": 0, "raised": 0, "counted": 0, "harmless": 0,
           "silent_loss": 0, "wrong": 0, "kept_share": 0.0, "cuts": 0, "cuts_counted": 0, "cuts_raised": 0}
    kept = 0
    for at in range(0, len(data), max(1, len(data) // flips)):
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        path.write_bytes(bytes(flipped))
        row["flips"] += 1
        try:
            texts, faults = read(path, fmt)
        except Exception:  # a reader that raises on bad data fails its whole work item
            row["raised"] += 1
            continue
        row["wrong"] += any(t not in known for t in texts)
        row["counted"] += bool(faults)
        row["harmless"] += not faults and texts == clean
        row["silent_loss"] += not faults and len(texts) < len(clean)
        kept += sum(t in known for t in texts)
    row["kept_share"] = round(kept / (row["flips"] * len(clean)), 3)
    for cut in range(1, len(data), max(1, len(data) // cuts)):
        path.write_bytes(data[:cut])
        row["cuts"] += 1
        try:
            row["cuts_counted"] += bool(read(path, fmt)[1])
        except Exception:
            row["cuts_raised"] += 1
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="a glob of .warc.gz files; default: a generated sample crawl")
    parser.add_argument("--records", type=int, default=60, help="WARC records repacked into each container")
    parser.add_argument("--flips", type=int, default=150, help="flipped-bit positions per format")
    parser.add_argument("--cuts", type=int, default=40, help="cut positions per format")
    parser.add_argument("--formats", help="comma-separated subset, e.g. tar.xz,jsonl.gz")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.input:
            paths, source = sorted(glob.glob(args.input)), args.input
        else:
            from tasks.sample.crawl import write_sample_crawl

            write_sample_crawl(str(work / "crawl"), pages=max(args.records, 40), files=1, seed=0)
            paths, source = sorted(glob.glob(str(work / "crawl" / "*.warc.gz"))), "sample"
        records = [r for r in warc_records(paths, args.records * 4) if r.startswith(b"WARC/1.")][: args.records]
        wanted = set(args.formats.split(",")) if args.formats else None
        started = time.perf_counter()
        rows = {fmt: sweep(work, fmt, data, args.flips, args.cuts)
                for fmt, data in containers(records).items() if wanted is None or fmt in wanted}
        print(json.dumps({"input": source, "records": len(records), "formats": rows,
                          "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
