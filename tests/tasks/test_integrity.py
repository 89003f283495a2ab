"""Integrity end to end: every consumer verifies what it reads, reuse verifies, outputs never clobber,
and a dataset folder works wherever it is copied."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tasks import contract, storage, verified_reads
from tasks.checksums import file_checksum
from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup
from tasks.ingest.config import IngestConfig
from tasks.ingest.readers import expand_inputs
from tasks.ingest.stage import run_ingest
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.tokenize.stage import run_tokenize
from tasks.tokenize.tokenizer import train_tokenizer
from tasks.token_shards import read_token_shard
from tasks.train.data import TokenLoader
from tests.tasks.ingest.crawl_files import english_warc, gzip_members, write
from tests.tasks.tokenize.conftest import TEXTS, write_documents

ROWS = [(f"doc-{i}", TEXTS[i % len(TEXTS)] + f" number {i}") for i in range(24)]


def flip_byte(path, at: int | None = None) -> None:
    """One flipped bit in the middle of a file: the size stays, only the checksum can tell."""
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.fixture
def docs(tmp_path) -> contract.Manifest:
    return write_documents(str(tmp_path / "docs"), [ROWS[:12], ROWS[12:]])


@pytest.fixture
def tokenizer_url(tmp_path, docs) -> str:
    cfg = TokenizerConfig(vocab_size=300, min_frequency=1, sample_docs=1000)
    return train_tokenizer([docs], str(tmp_path / "tokenizer"), cfg, fingerprint="tok").meta["url"]


def test_dedup_refuses_a_corrupt_documents_shard_naming_it(tmp_path, docs):
    flip_byte(tmp_path / "docs" / "docs-00001.parquet")
    with pytest.raises(contract.DatasetError, match="shard docs-00001.parquet of .*docs does not match its manifest checksum"):
        run_dedup([docs], str(tmp_path / "dedup"), DedupConfig(), fingerprint="dd")
    assert contract.read_manifest(str(tmp_path / "dedup")) is None


def test_tokenize_refuses_a_corrupt_documents_shard_naming_it(tmp_path, docs, tokenizer_url):
    flip_byte(tmp_path / "docs" / "docs-00000.parquet")
    with pytest.raises(contract.DatasetError, match="shard docs-00000.parquet of .* does not match"):
        run_tokenize([docs], tokenizer_url, str(tmp_path / "tokens"), TokenizeConfig(), fingerprint="tk")
    assert contract.read_manifest(str(tmp_path / "tokens")) is None


def test_a_truncated_documents_shard_is_named_by_its_size(tmp_path, docs, tokenizer_url):
    path = tmp_path / "docs" / "docs-00000.parquet"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(contract.DatasetError, match=r"docs-00000.parquet .* is \d+ bytes, the manifest says \d+"):
        run_tokenize([docs], tokenizer_url, str(tmp_path / "tokens"), TokenizeConfig(), fingerprint="tk")


def test_a_rerun_recomputes_a_corrupt_stage_output_instead_of_reusing_it(tmp_path):
    warc = write(tmp_path / "in" / "a.warc.gz", gzip_members(english_warc(0, 4)))
    out = str(tmp_path / "out")
    first = run_ingest(expand_inputs([warc]), out, IngestConfig(), fingerprint="fp")
    (shard,) = [s for s in first.shards if s.name.endswith(".parquet")]
    clean = (tmp_path / "out" / shard.name).read_bytes()
    flip_byte(tmp_path / "out" / shard.name)

    assert contract.finished_dataset(out, "fp") is None  # what every flow's reuse check asks
    again = run_ingest(expand_inputs([warc]), out, IngestConfig(), fingerprint="fp")
    assert (tmp_path / "out" / shard.name).read_bytes() == clean
    assert [(s.name, s.checksum) for s in again.shards] == [(s.name, s.checksum) for s in first.shards]
    assert contract.finished_dataset(out, "fp") is not None  # and now it is reused


def test_a_corrupt_token_shard_is_refused_by_eval_style_reads_and_the_loader(tmp_path, docs, tokenizer_url):
    tokens = run_tokenize([docs], tokenizer_url, str(tmp_path / "tokens"), TokenizeConfig(val_fraction=0.0),
                          fingerprint="tk")
    bins = [s.name for s in tokens.shards if s.name.endswith(".bin")]
    for name in bins:  # every one, so whichever the first batch touches is corrupt
        flip_byte(tmp_path / "tokens" / name)
    with pytest.raises(contract.DatasetError, match=f"shard {bins[0]} of .* does not match"):
        read_token_shard(tokens, bins[0])
    loader = TokenLoader({"web": tokens.meta["url"]}, None, split="train", seq_len=8, global_batch=2,
                         dp_rank=0, dp_size=1, seed=0, prefetch=0)
    with pytest.raises(contract.DatasetError, match=r"shard train-0000\d.bin of .* does not match"):
        loader.next_batch()
    loader.close()


def test_writing_a_different_dataset_where_one_lives_is_refused(tmp_path, docs):
    url = docs.meta["url"]
    with pytest.raises(contract.DatasetError, match="already holds a complete 'documents' dataset .* may not replace it"):
        contract.commit(url, "model", "other", [], {})
    with pytest.raises(contract.DatasetError, match="already holds a complete 'documents' dataset .* would change it"):
        contract.write_shard(url, "docs-00000.parquet", lambda f: f.write(b"other bytes"))
    assert contract.verify(contract.open_dataset(url)) == []  # nothing of it changed
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["docs-00000.parquet", "docs-00001.parquet", "manifest.json"]
    same = contract.commit(url, "documents", docs.fingerprint, docs.shards, docs.stats)  # its own stage may commit again
    assert same.fingerprint == docs.fingerprint


def test_a_copied_dataset_folder_reads_in_its_new_place(tmp_path, docs, tokenizer_url):
    tokens = run_tokenize([docs], tokenizer_url, str(tmp_path / "tokens"), TokenizeConfig(val_fraction=0.0),
                          fingerprint="tk")
    shutil.copytree(tmp_path / "tokens", tmp_path / "moved" / "tokens")
    shutil.copytree(tmp_path / "docs", tmp_path / "moved" / "docs")
    shutil.rmtree(tmp_path / "tokens")
    shutil.rmtree(tmp_path / "docs")
    manifest = json.loads((tmp_path / "moved" / "tokens" / "manifest.json").read_text())
    assert all("/" not in s["name"] for s in manifest["shards"])  # shards are named relative to the dataset

    moved = contract.open_dataset(str(tmp_path / "moved" / "tokens"), kind="tokens")
    assert moved.meta["url"].endswith("/moved/tokens") and contract.verify(moved) == []
    with TokenLoader({"web": moved.meta["url"]}, None, split="train", seq_len=8, global_batch=2,
                     dp_rank=0, dp_size=1, seed=0, prefetch=0) as loader:
        inputs, _ = loader.next_batch()
    assert inputs.shape == (2, 8)
    moved_docs = contract.open_dataset(str(tmp_path / "moved" / "docs"), kind="documents")
    again = run_tokenize([moved_docs], str(tmp_path / "moved" / "tokens"), str(tmp_path / "tokens2"),
                         TokenizeConfig(val_fraction=0.0), fingerprint="tk2")
    assert [s.checksum for s in again.shards] == [s.checksum for s in tokens.shards]


def test_a_manifest_from_before_algorithm_prefixes_still_verifies(tmp_path, docs):
    path = tmp_path / "docs" / "manifest.json"
    manifest = json.loads(path.read_text())
    for shard in manifest["shards"]:  # rewrite it the old way: a bare sha256 field
        fs, p = storage.filesystem(storage.join(docs.meta["url"], shard["name"]))
        shard["sha256"] = file_checksum(fs, p, "sha256").split(":", 1)[1]
        del shard["checksum"]
    path.write_text(json.dumps(manifest))
    old = contract.open_dataset(docs.meta["url"])
    assert {s.checksum.split(":")[0] for s in old.shards} == {"sha256"}
    assert contract.verify(old) == [] and verified_reads.read_shard(old, "docs-00000.parquet")
    flip_byte(tmp_path / "docs" / "docs-00000.parquet")
    assert contract.verify(old) == ["docs-00000.parquet"]


def test_the_verified_reader_checks_partial_reads_and_seeks_too(tmp_path):
    url = str(tmp_path / "ds")
    blob = np.arange(100_000, dtype="<u4").tobytes()
    shard = contract.write_shard(url, "a.bin", lambda f: f.write(blob) // 4)
    manifest = contract.commit(url, "tokens", "fp", [shard], {})
    with verified_reads.open_shard(manifest, "a.bin") as f:
        f.seek(len(blob) - 8)  # a footer-first reader: the skipped bytes are hashed on the way
        assert f.read() == blob[-8:] and f.verified
    flip_byte(tmp_path / "ds" / "a.bin", at=10)
    with pytest.raises(contract.DatasetError, match="a.bin .* does not match"):
        with verified_reads.open_shard(manifest, "a.bin") as f:
            f.read(100)  # reads only the start: leaving the block hashes the rest
    with pytest.raises(contract.DatasetError, match="has no shard 'b.bin'"):
        verified_reads.open_shard(manifest, "b.bin")


def test_a_corrupt_tokenizer_inside_a_dataset_is_refused(tmp_path, docs, tokenizer_url):
    from tasks.tokenizer_files import load_tokenizer

    tokens = run_tokenize([docs], tokenizer_url, str(tmp_path / "tokens"), TokenizeConfig(), fingerprint="tk")
    for folder in ("tokenizer", "tokens"):
        path = tmp_path / folder / "tokenizer.json"
        path.write_text(path.read_text().replace('"<|eos|>"', '"<|EOS|>"', 1))
        with pytest.raises(contract.DatasetError, match="tokenizer.json does not match the checksum"):
            load_tokenizer(str(tmp_path / folder))
    assert tokens.meta["tokenizer_checksum"].startswith("xxh3_128:")
