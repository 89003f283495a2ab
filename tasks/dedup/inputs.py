"""What ``smelt dedup --input`` accepts: smelt documents datasets, or raw JSONL / Parquet files.

Raw files need ``id`` and ``text`` fields; ``url``, ``source``, ``lang``, ``lang_score``,
``quality_score`` and ``meta`` are taken when present. They are converted once into a documents
dataset (one or more shards per file) named by the files' fingerprints, so a rerun reuses it.
Records without a string ``id`` and ``text``, lines that are not JSON, and truncated or corrupt
files are counted in that dataset's stats under ``dropped.dedup_input_<reason>`` and
``failed.dedup_input_<reason>`` and skipped.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from typing import Any

from tasks import contract, storage
from tasks.contract import Manifest
from tasks.counters import Stats
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.records import read_json_lines, read_parquet_rows

RAW_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz", ".parquet")
ROWS_PER_SHARD = 50_000
BATCH_ROWS = 4096  # raw Parquet rows decoded at a time
MAX_LINE_BYTES = 64 << 20  # a longer JSON line is skipped unread, counted dropped.dedup_input_too_large


def _default_staging() -> str:
    return storage.normalize_url(tempfile.gettempdir()) + "/smelt-dedup-inputs"


def _raw_files(url: str) -> list[str]:
    fs, path = storage.filesystem(url)
    paths = fs.glob(path) if any(c in path for c in "*?[") else [path]
    files = sorted(p for p in paths if fs.isfile(p))
    if not files:
        raise contract.DatasetError(f"no dataset or raw input file at {url}")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [storage.normalize_url(f"{protocol}://{p}" if protocol != "file" else p) for p in files]


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _document_row(record: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(record.get("id"), str) or not isinstance(record.get("text"), str):
        return None
    meta = record.get("meta", {})
    return {
        "id": record["id"],
        "url": str(record.get("url") or ""),
        "source": str(record.get("source") or "web"),
        "lang": str(record.get("lang") or ""),
        "lang_score": _float(record.get("lang_score")),
        "quality_score": _float(record.get("quality_score")),
        "text": record["text"],
        "meta": meta if isinstance(meta, str) else json.dumps(meta, sort_keys=True),
    }


def _records(url: str, stats: Stats) -> Iterator[dict[str, Any]]:
    """The records of a raw file, its faults counted as the ingest readers count them (``tasks/records.py``):
    a truncated or corrupt compressed file, a bad line, an unreadable Parquet file."""
    if url.endswith(".parquet"):
        rows = read_parquet_rows(url, "text", tuple(DOCUMENT_COLUMNS), stats, prefix="dedup_input",
                                 batch_size=BATCH_ROWS)
    else:
        rows = read_json_lines(url, MAX_LINE_BYTES, stats, prefix="dedup_input", truncated="dedup_input_truncated_file")
    for _, record in rows:
        if isinstance(record, dict):
            yield record
        else:
            stats.add("failed.dedup_input_not_an_object")


def raw_to_documents(urls: list[str], staging_url: str | None = None) -> Manifest:
    """Convert raw JSONL/Parquet files into a documents dataset (reused if already converted)."""
    import pyarrow as pa

    from tasks.dedup.plan import write_parquet

    raw_fps = contract.raw_input_fingerprints(urls)
    fp = contract.fingerprint("dedup-input", {"rows_per_shard": ROWS_PER_SHARD}, raw_fps, "2")  # 2: checked reads
    out_url = storage.join(staging_url or _default_staging(), fp)
    existing = contract.finished_dataset(out_url, fp)  # verified; a corrupt copy is converted again
    if existing is not None:
        return existing
    stats, shards, rows = Stats(), [], []

    def flush() -> None:
        table = pa.Table.from_pylist(rows, schema=document_schema())
        name = f"docs-{len(shards):05d}.parquet"
        shards.append(contract.write_shard(out_url, name, lambda f: write_parquet(table, f)))
        rows.clear()

    for url in urls:
        for record in _records(url, stats):
            row = _document_row(record)
            if row is None:
                stats.add("failed.dedup_input_missing_id_or_text")
                continue
            rows.append(row)
            if len(rows) >= ROWS_PER_SHARD:
                flush()
        if rows:
            flush()
    stats.add("docs_out", sum(s.rows for s in shards))
    return contract.commit(out_url, "documents", fp, shards, stats, inputs=list(urls))


def load_dedup_inputs(urls: list[str], staging_url: str | None = None) -> list[Manifest]:
    """Manifests to pass to ``run_dedup``: each URL is a documents dataset, or raw files
    (a file, or a glob such as ``data/*.jsonl.gz``) converted into one under ``staging_url``."""
    manifests, raw = [], []
    for url in urls:
        if contract.read_manifest(url) is not None:
            manifests.append(contract.open_dataset(url, kind="documents"))
        elif url.endswith(RAW_SUFFIXES) or any(c in url for c in "*?["):
            raw.extend(_raw_files(url))
        else:
            raise contract.DatasetError(
                f"{url} is neither a smelt documents dataset (no manifest.json) nor a raw file "
                f"ending in {', '.join(RAW_SUFFIXES)}"
            )
    if raw:
        manifests.append(raw_to_documents(raw, staging_url))
    return manifests
