"""File rules both sample writers share: never mix with an older sample, write the files and their ground truth,
read the ground truth back."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tasks import contract, storage


def refuse_stale_files(out: str, pattern: str, names: list[str]) -> None:
    """Files matching ``pattern`` that this sample will not write (left by a larger earlier sample)
    would be read as part of it: refuse rather than mix two samples."""
    fs, path = storage.filesystem(out)
    if not fs.exists(path):
        return
    stale = sorted(p.rsplit("/", 1)[-1] for p in fs.glob(f"{path}/{pattern}"))
    stale = [name for name in stale if name not in names]
    if stale:
        raise ValueError(f"{out} already holds {stale[0]}, which this sample would not overwrite; "
                         "write the sample to an empty directory")


def write_sample_files(out: str, files: Iterable[tuple[str, bytes, list[dict]]], ground_truth: str) -> tuple[list[dict], int]:
    """Write each ``(name, data, its ground-truth rows)`` atomically under ``out``, then every row as one JSON line
    to ``ground_truth`` (last, so a sample with its truth is complete); returns (the rows, the bytes written)."""
    rows, total_bytes = [], 0
    for name, data, file_rows in files:
        with storage.atomic_write(storage.join(out, name)) as f:
            f.write(data)
        total_bytes += len(data)
        rows.extend(file_rows)
    with storage.atomic_write(storage.join(out, ground_truth), "w") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return rows, total_bytes


def read_ground_truth(url: str, filename: str, kind: str = "") -> list[dict]:
    """Ground-truth rows; ``url`` is the sample folder or the ``.jsonl`` file; ``kind`` names it in errors."""
    url = storage.normalize_url(url)
    if not url.endswith(".jsonl"):
        url = storage.join(url, filename)
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        raise contract.DatasetError(f"no sample {kind + ' ' if kind else ''}ground truth at {url}; create it with `smelt sample --output DIR`")
    with fs.open(path, "r", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
