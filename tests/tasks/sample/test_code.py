"""The sample source-code dataset: deterministic, and holding what its ground truth says."""

from __future__ import annotations

import gzip
import json
import uuid
from collections import Counter

import fsspec
import pytest

from tasks import contract, storage
from tasks.sample.code import (
    CODE_CATEGORIES,
    CODE_GROUND_TRUTH,
    EXPECTED_REASONS,
    category_counts,
    load_code_ground_truth,
    read_source,
    source_pool,
    write_sample_code,
)

FILES = 60


def read_lines(url: str, names: list[str]) -> list[bytes]:
    fs, path = storage.filesystem(url)
    return [line for name in names for line in gzip.decompress(fs.cat_file(f"{path}/{name}")).splitlines()]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """(url, summary, ground truth, records by repo:path — None for the undecodable lines)."""
    out = str(tmp_path_factory.mktemp("code"))
    summary = write_sample_code(out, files=FILES)
    records = {}
    for row, line in zip(load_code_ground_truth(out), read_lines(out, summary["shards"]), strict=True):
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            record = None
        records[f"{row['repo']}:{row['path']}"] = record
    return out, summary, load_code_ground_truth(out), records


def rows_of(rows, category):
    return [r for r in rows if r["category"] == category]


def test_rerun_writes_byte_identical_files(sample):
    out, summary, _, _ = sample
    again = f"memory://sample-code-{uuid.uuid4().hex[:8]}"
    try:
        assert write_sample_code(again, files=FILES) == {**summary, "input": f"{again}/code-*.jsonl.gz"}
        for name in [*summary["shards"], CODE_GROUND_TRUTH]:
            assert fsspec.open(f"{again}/{name}", "rb").open().read() == open(f"{out}/{name}", "rb").read()
    finally:
        fsspec.filesystem("memory").rm(again.removeprefix("memory://"), recursive=True)


def test_another_seed_chooses_other_files(sample, tmp_path):
    _, _, rows, _ = sample
    write_sample_code(str(tmp_path), files=FILES, seed=1)
    other = load_code_ground_truth(str(tmp_path))
    assert {r["path"] for r in rows_of(rows, "good")} != {r["path"] for r in rows_of(other, "good")}


def test_summary_and_ground_truth_count_every_category(sample):
    _, summary, rows, records = sample
    assert summary["files"] == len(rows) == len(records) == FILES
    assert summary["categories"] == category_counts(FILES)
    assert Counter(r["category"] for r in rows) == Counter({k: v for k, v in category_counts(FILES).items() if v})
    assert set(summary["categories"]) == set(CODE_CATEGORIES)
    assert all(r["reason"] == EXPECTED_REASONS.get(r["category"]) for r in rows)
    assert summary["shards"] == ["code-00000.jsonl.gz"] and summary["input"].endswith("/code-*.jsonl.gz")


def test_categories_are_interleaved_not_grouped(sample):
    _, _, rows, _ = sample
    positions = [i for i, r in enumerate(rows) if r["category"] != "good"]
    assert positions[-1] - positions[0] > len(rows) // 2


def test_good_files_are_stdlib_sources_verbatim_some_without_a_license(sample):
    _, _, rows, records = sample
    good = [records[f"{r['repo']}:{r['path']}"] for r in rows_of(rows, "good")]
    assert all(g["content"] == read_source(g["path"].removeprefix("Lib/")) for g in good)
    assert {g["license"] for g in good} == {"PSF-2.0", None}
    assert len({g["path"] for g in good}) == len(good)


def test_duplicates_point_at_a_good_original_and_copy_it_exactly_or_nearly(sample):
    _, _, rows, records = sample
    for row in rows_of(rows, "exact_dup") + rows_of(rows, "near_dup"):
        copy, original = records[f"{row['repo']}:{row['path']}"], records[row["dup_of"]]
        assert next(r for r in rows if f"{r['repo']}:{r['path']}" == row["dup_of"])["category"] == "good"
        if row["category"] == "exact_dup":
            assert copy["content"] == original["content"] and row["repo"] != row["dup_of"].split(":")[0]
        else:
            ours, theirs = copy["content"].splitlines(), original["content"].splitlines()
            assert copy["content"] != original["content"]
            assert set(theirs) <= set(ours) and len(ours) - len(theirs) <= len(theirs) // 20 + 2


def test_planted_bad_files_hold_what_their_category_says(sample):
    _, _, rows, records = sample

    def contents(category):
        return [records[f"{r['repo']}:{r['path']}"] for r in rows_of(rows, category)]

    for record in contents("generated"):
        head = "\n".join(record["content"].splitlines()[:2]).lower()
        assert "generated" in head and record["path"].startswith("build/generated/")
    for record in contents("minified"):
        assert "\n" not in record["content"] and len(record["content"]) > 3000
        assert record["path"].endswith((".min.js", ".bundle.js"))
    for record in contents("data_like"):
        assert record["content"].count("0x") > 900
    for record in contents("vendored"):
        assert record["path"].split("/")[0] in ("node_modules", "vendor", "third_party", "site-packages")
    for record in contents("license"):
        assert "GPL" in record["license"]
    for record in contents("binary"):
        assert "\x00" in record["content"]
    assert contents("undecodable") == [None] * category_counts(FILES)["undecodable"]


def test_the_pool_of_good_files_has_no_generated_or_test_files():
    pool = source_pool()
    assert len(pool) > 300 and list(pool) == sorted(pool)
    assert not any(part in ("test", "tests", "site-packages") for rel in pool for part in rel.split("/")[:-1])


def test_counts_the_sample_cannot_honour_are_errors(tmp_path):
    with pytest.raises(ValueError, match="at least 20"):
        write_sample_code(str(tmp_path), files=10)
    with pytest.raises(ValueError, match="use at most"):
        write_sample_code(str(tmp_path), files=10 * len(source_pool()))


def test_stale_shards_from_a_larger_sample_are_refused(tmp_path):
    (tmp_path / "code-00007.jsonl.gz").write_bytes(b"")
    with pytest.raises(ValueError, match="code-00007.jsonl.gz"):
        write_sample_code(str(tmp_path), files=FILES)


def test_missing_ground_truth_is_a_clear_error(tmp_path):
    with pytest.raises(contract.DatasetError, match="no sample code ground truth"):
        load_code_ground_truth(str(tmp_path))
