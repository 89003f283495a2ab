"""The dataset contract: fingerprints, atomic shards, manifest last, shard-level idempotency."""

import json

import pytest

from tasks import contract, storage
from tasks.counters import Stats


def write_rows(rows: list[str]):
    def write(f) -> int:
        f.write("\n".join(rows).encode())
        return len(rows)

    return write


@pytest.fixture(params=["memory", "file"])
def root(request, tmp_path):
    if request.param == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        fs.store.clear()
        fs.pseudo_dirs.clear()
        fs.pseudo_dirs.append("")
        return "memory://smelt-test"
    return f"file://{tmp_path}"


def test_fingerprint_changes_with_config_inputs_and_code_only():
    base = contract.fingerprint("ingest", {"a": 1}, ["x"], "v1")
    assert base == contract.fingerprint("ingest", {"a": 1}, ["x"], "v1")
    assert base != contract.fingerprint("ingest", {"a": 2}, ["x"], "v1")
    assert base != contract.fingerprint("ingest", {"a": 1}, ["y"], "v1")
    assert base != contract.fingerprint("ingest", {"a": 1}, ["x"], "v2")
    assert base != contract.fingerprint("dedup", {"a": 1}, ["x"], "v1")


def test_stage_url_is_root_stage_fingerprint():
    assert contract.stage_url("memory://r", "dedup", "abc") == "memory://r/dedup/abc"
    assert contract.stage_url("/tmp/r/", "dedup", "abc") == "file:///tmp/r/dedup/abc"


def test_stats_add_key_by_key_and_sum():
    total = sum([Stats({"a": 1, "dropped.x": 2}), Stats({"a": 3, "b": 1})])
    assert total == {"a": 4, "dropped.x": 2, "b": 1}
    assert total.with_prefix("dropped.") == {"x": 2}


def test_dataset_without_manifest_is_not_complete(root):
    url = storage.join(root, "ds")
    contract.write_shard(url, "part-0.txt", write_rows(["a", "b"]))
    assert contract.read_manifest(url) is None
    with pytest.raises(contract.DatasetError, match="incomplete"):
        contract.open_dataset(url)


def test_commit_writes_manifest_last_with_checksums_and_lineage(root):
    url = storage.join(root, "ds")
    shard = contract.write_shard(url, "part-0.txt", write_rows(["a", "b", "c"]))
    manifest = contract.commit(url, "documents", "fp1", [shard], Stats({"dropped.short": 2}),
                               inputs=["file:///in.warc"], config={"k": 1})
    again = contract.open_dataset(url, kind="documents")
    assert again.rows == 3 and again.shards[0].checksum == shard.checksum
    assert again.stats == {"dropped.short": 2}
    assert again.lineage["inputs"] == [{"url": "file:///in.warc"}]
    assert again.lineage["config"] == {"k": 1} and "python" in again.lineage["software"]
    assert contract.verify(manifest) == []


def test_verify_reports_a_corrupted_shard(root):
    url = storage.join(root, "ds")
    shard = contract.write_shard(url, "part-0.txt", write_rows(["abc"]))
    manifest = contract.commit(url, "documents", "fp", [shard], {})
    fs, path = storage.filesystem(contract.shard_url(manifest, shard))
    fs.pipe_file(path, b"abd")  # same size, one byte flipped
    assert contract.verify(manifest) == ["part-0.txt"]


def test_open_dataset_of_wrong_kind_is_an_error(root):
    url = storage.join(root, "ds")
    contract.commit(url, "tokens", "fp", [], {})
    with pytest.raises(contract.DatasetError, match="expected 'documents'"):
        contract.open_dataset(url, kind="documents")


def test_missing_dataset_error_names_the_url(root):
    with pytest.raises(contract.DatasetError, match="no dataset at .*nowhere"):
        contract.open_dataset(storage.join(root, "nowhere"))


def test_failed_write_leaves_no_shard_and_no_temporary(root):
    url = storage.join(root, "ds")

    def explode(f) -> int:
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        contract.write_shard(url, "part-0.txt", explode)
    fs, path = storage.filesystem(url)
    assert not fs.exists(path) or fs.ls(path) == []


def test_run_shard_reuses_a_finished_shard_and_redoes_a_corrupted_one(root):
    url = storage.join(root, "ds")
    calls = []

    def work() -> contract.ShardResult:
        calls.append(1)
        shard = contract.write_shard(url, "part-0.txt", write_rows(["x", "y"]))
        return contract.ShardResult([shard], Stats({"docs": 2}))

    first = contract.run_shard(url, "part-0", work)
    second = contract.run_shard(url, "part-0", work)
    assert len(calls) == 1 and second.stats["shards_reused"] == 1
    assert second.shards[0].checksum == first.shards[0].checksum

    fs, path = storage.filesystem(storage.join(url, "part-0.txt"))
    fs.pipe_file(path, b"tampered")
    third = contract.run_shard(url, "part-0", work)
    assert len(calls) == 2 and third.shards[0].checksum == first.shards[0].checksum


def test_manifest_round_trips_through_json():
    m = contract.Manifest("tokens", "fp", [contract.ShardInfo("a", 1, 2, "h", {"split": "val"})], {"x": 1},
                          {"inputs": []}, {"dtype": "uint16"})
    assert contract.Manifest.from_json(m.to_json()) == m
    assert json.loads(m.to_json())["kind"] == "tokens"


def test_raw_input_fingerprint_changes_when_the_file_changes(tmp_path):
    f = tmp_path / "a.warc"
    f.write_bytes(b"one")
    before = contract.raw_input_fingerprints([str(f)])
    f.write_bytes(b"three")
    assert contract.raw_input_fingerprints([str(f)]) != before


def test_finished_dataset_is_returned_only_for_its_own_fingerprint(root):
    url = storage.join(root, "ds")
    assert contract.finished_dataset(url, "fp1") is None
    contract.commit(url, "documents", "fp1", [], {})
    assert contract.finished_dataset(url, "fp1").fingerprint == "fp1"
    with pytest.raises(contract.DatasetError, match="already holds a dataset with fingerprint fp1, not fp2"):
        contract.finished_dataset(url, "fp2")
