import bz2
import gzip
import json
import lzma

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks import contract
from tasks.dedup.config import DedupConfig
from tasks.dedup.inputs import load_dedup_inputs
from tasks.dedup.stage import run_dedup
from tests.tasks.dedup.corpus import A, B, SHARDS, read_ids, write_documents


def test_raw_jsonl_input_is_converted_and_bad_records_are_counted(tmp_path):
    lines = [
        json.dumps({"id": "x1", "text": " ".join(A), "quality_score": 0.4}),
        "{not json",
        json.dumps({"id": "x2", "text": " ".join(A) + "."}),
        json.dumps({"id": "x3"}),
        json.dumps({"id": "x4", "text": " ".join(B), "meta": {"k": 1}}),
    ]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(lines) + "\n")
    (converted,) = load_dedup_inputs([str(raw)], staging_url=f"file://{tmp_path}/staging")
    assert converted.kind == "documents" and converted.rows == 3
    assert converted.stats["failed.dedup_input_bad_record"] == 1
    assert converted.stats["failed.dedup_input_missing_id_or_text"] == 1
    out = run_dedup([converted], f"file://{tmp_path}/out", DedupConfig(), fingerprint="fp")
    assert read_ids(out) == [["x1", "x4"]]


@pytest.mark.parametrize("name,compress", [
    ("raw.jsonl.zst", zstandard.ZstdCompressor().compress), ("raw.jsonl.gz", lambda b: gzip.compress(b, mtime=0)),
    ("raw.jsonl.bz2", bz2.compress), ("raw.jsonl.xz", lzma.compress)])
def test_a_truncated_or_corrupt_compressed_raw_file_is_counted_not_passed_as_whole(tmp_path, name, compress):
    """Read through fsspec's zstd, a .jsonl.zst cut in half gave 0 of its 300 documents and no count."""
    data = compress(b"".join(json.dumps({"id": f"d{i}", "text": f"document {i} " + "x" * 200}).encode() + b"\n"
                             for i in range(300)))
    staging = f"file://{tmp_path}/staging"
    (tmp_path / f"cut-{name}").write_bytes(data[: len(data) // 2])
    (cut,) = load_dedup_inputs([str(tmp_path / f"cut-{name}")], staging_url=staging)
    assert cut.stats["failed.dedup_input_truncated_file"] == 1
    assert cut.rows == cut.stats["in"] - 1  # every line decoded before the cut, and the cut one counted
    flipped = bytearray(data)
    flipped[-6] ^= 0x01  # in the checksum at the end: every line decodes, and the check fails
    (tmp_path / f"flipped-{name}").write_bytes(bytes(flipped))
    (bad,) = load_dedup_inputs([str(tmp_path / f"flipped-{name}")], staging_url=staging)
    assert bad.rows == 0 and bad.stats["failed.dedup_input_corrupt_file"] == 1


def test_raw_parquet_files_matched_by_a_glob_are_converted_once(tmp_path):
    for name, ids in [("part-0.parquet", ["p1", "p2"]), ("part-1.parquet", ["p3"])]:
        table = pa.table({"id": ids, "text": [" ".join(B)] * len(ids), "quality_score": [0.1] * len(ids)})
        pq.write_table(table, tmp_path / name)
    staging = f"file://{tmp_path}/staging"
    (first,) = load_dedup_inputs([f"{tmp_path}/part-*.parquet"], staging_url=staging)
    (second,) = load_dedup_inputs([f"{tmp_path}/part-*.parquet"], staging_url=staging)
    assert first.rows == 3 and second.meta["url"] == first.meta["url"]
    out = run_dedup([first], f"file://{tmp_path}/out", DedupConfig(), fingerprint="fp")
    assert read_ids(out) == [["p1"], []]  # one shard per raw file; the copies p2, p3 go


def test_a_documents_dataset_url_is_opened_as_is():
    manifest = write_documents("memory://inputs-dataset", SHARDS)
    (opened,) = load_dedup_inputs(["memory://inputs-dataset"])
    assert opened.fingerprint == manifest.fingerprint and opened.rows == 10


def test_an_input_that_is_neither_dataset_nor_raw_file_is_a_clear_error(tmp_path):
    with pytest.raises(contract.DatasetError, match="neither a smelt documents dataset"):
        load_dedup_inputs([str(tmp_path)])
