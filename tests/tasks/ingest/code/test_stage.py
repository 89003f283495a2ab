"""The code ingest stage on the sample code dataset and on trees, and the code branch end to end:
ingest → dedup → tokenize → a web/code mixture in the loader."""

from __future__ import annotations

import json
import math
import os
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks import contract, storage
from tasks.documents import document_schema
from tasks.documents import Document
from tasks.ingest.code.config import CodeIngestConfig
from tasks.ingest.code.stage import STAGE, code_input_fingerprints, code_step_names, run_code_ingest
from tasks.ingest.config import OutputConfig
from tasks.ingest.work_item import DocumentSink
from tasks.ingest.readers import InputError
from tasks.counters import funnel
from tasks.sample.code import load_code_ground_truth, write_sample_code

SAMPLE_FILES = 120


def rows_of(manifest: contract.Manifest) -> list[dict]:
    out = []
    for shard in manifest.shards:
        out += pq.read_table(contract.shard_url(manifest, shard).removeprefix("file://")).to_pylist()
    return out


def exclusions_config() -> CodeIngestConfig:
    cfg = CodeIngestConfig()
    cfg.output.write_exclusions = True
    return cfg


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """(sample folder, its summary, the ingested manifest, the excluded manifest)."""
    root = tmp_path_factory.mktemp("code-stage")
    summary = write_sample_code(str(root / "sample"), files=SAMPLE_FILES)
    out = str(root / "out")
    manifest = run_code_ingest([summary["input"]], out, exclusions_config(), fingerprint="fp-code")
    return str(root / "sample"), summary, manifest, contract.open_dataset(storage.join(out, "excluded"))


def key(row: dict) -> str:
    meta = json.loads(row["meta"]) if isinstance(row["meta"], str) else row["meta"]
    return f"{meta['repo']}:{meta['path']}"


def test_the_sample_ground_truth_is_what_ingest_keeps_and_drops(sample):
    sample_url, _, manifest, excluded = sample
    truth = {f"{r['repo']}:{r['path']}": r for r in load_code_ground_truth(sample_url)}
    kept = {key(row) for row in rows_of(manifest)}
    dropped = {key(row): json.loads(row["meta"])["dropped_by"] for row in rows_of(excluded)}

    assert kept == {k for k, r in truth.items() if r["reason"] is None}  # good files and both kinds of copies
    readers_drops = ("code_binary", "code_undecodable")  # never become documents, so never excluded rows
    assert dropped == {k: r["reason"] for k, r in truth.items() if r["reason"] and r["reason"] not in readers_drops}
    for reason in set(r["reason"] for r in truth.values()) - {None}:
        assert manifest.stats[f"dropped.{reason}"] == sum(r["reason"] == reason for r in truth.values())


def test_code_documents_follow_the_documents_contract(sample):
    _, summary, manifest, _ = sample
    assert manifest.kind == "documents" and manifest.meta["source"] == "code"
    assert [s.name for s in manifest.shards] == [f"docs-{i:05d}.parquet" for i in range(len(summary["shards"]))]
    assert contract.verify(manifest) == []
    table = pq.read_table(contract.shard_url(manifest, manifest.shards[0]).removeprefix("file://"))
    assert table.schema.equals(document_schema())
    row = table.to_pylist()[0]
    meta = json.loads(row["meta"])
    assert row["source"] == "code" and row["lang"] == meta["language"] == "Python"
    assert set(meta) == {"repo", "path", "license", "language"}
    assert math.isnan(row["lang_score"]) and math.isnan(row["quality_score"])


def test_the_manifest_holds_the_funnel_and_the_languages_written(sample):
    _, _, manifest, _ = sample
    rows = dict(funnel(manifest))
    assert manifest.meta["steps"] == code_step_names(CodeIngestConfig())
    assert rows["in"] == SAMPLE_FILES and rows["out"] == manifest.rows
    assert rows["read"] == SAMPLE_FILES - rows["dropped.code_binary"] - rows["dropped.code_undecodable"]
    assert rows["code_alphanum_fraction"] == manifest.rows
    assert sum(v for k, v in manifest.stats.items() if k.startswith("lang.")) == manifest.rows
    assert manifest.stats["work_items"] == 1 and STAGE == "ingest_code"


def test_a_finished_dataset_is_returned_and_another_fingerprint_is_refused(sample):
    _, summary, manifest, _ = sample
    again = run_code_ingest([summary["input"]], manifest.meta["url"], exclusions_config(), fingerprint="fp-code")
    assert again.to_json() == manifest.to_json()
    with pytest.raises(contract.DatasetError, match="already holds a dataset"):
        run_code_ingest([summary["input"]], manifest.meta["url"], exclusions_config(), fingerprint="other")


def test_a_rerun_after_a_crash_reuses_finished_shards_byte_for_byte(tmp_path):
    tree = tmp_path / "repo"
    for i in range(5):
        (tree / f"pkg{i % 2}").mkdir(parents=True, exist_ok=True)
        (tree / f"pkg{i % 2}" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n")
    cfg = CodeIngestConfig()
    cfg.reader.dir_chunk_files = 2
    out = str(tmp_path / "out")
    first = run_code_ingest([str(tree)], out, cfg, fingerprint="fp")
    assert [s.rows for s in first.shards] == [2, 2, 1] and first.stats["work_items"] == 3
    os.remove(tmp_path / "out" / "manifest.json")  # the stage died before committing
    os.remove(tmp_path / "out" / "docs-00001.parquet")  # and before one shard was written
    second = run_code_ingest([str(tree)], out, cfg, fingerprint="fp")
    assert second.stats["shards_reused"] == 2
    assert [(s.name, s.checksum) for s in second.shards] == [(s.name, s.checksum) for s in first.shards]


def test_no_inputs_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no code inputs"):
        run_code_ingest([], str(tmp_path / "out"), CodeIngestConfig(), fingerprint="fp")


def test_a_tree_fingerprint_changes_when_a_file_inside_changes(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    before = code_input_fingerprints([str(tmp_path)])
    assert code_input_fingerprints([str(tmp_path)]) == before
    (tmp_path / "src" / "a.py").write_text("x = 12\n")
    assert code_input_fingerprints([str(tmp_path)]) != before
    archive = tmp_path / "r.zip"
    archive.write_bytes(b"PK")
    assert code_input_fingerprints([str(archive)]) == contract.raw_input_fingerprints([f"file://{archive}"])


# ---------------------------------------------------------------------------------------------
# The code branch end to end: dedup, tokenize, and the loader's mixture


def web_documents(url: str, docs: int = 240, seed: int = 0) -> contract.Manifest:
    """A documents dataset of English prose (random sentence mixes): the web side of the mixture."""
    from tests.tasks.ingest.crawl_files import SENTENCES

    rng = random.Random(seed)
    documents = [
        Document(id=f"web-{i}", url=f"https://news.example/{i}", text=" ".join(rng.sample(SENTENCES, 6)), lang="en")
        for i in range(docs)
    ]

    def write(f) -> int:
        sink = DocumentSink(f, OutputConfig())
        for doc in documents:
            sink.append(doc)
        return sink.close()

    shard = contract.write_shard(url, "docs-00000.parquet", write)
    return contract.commit(url, "documents", "web-docs", [shard], {"out": docs})


def windows_by_content(url: str, seq_len: int) -> set[bytes]:
    """Every sample window (seq_len + 1 tokens) of a tokens dataset's train stream, as bytes."""
    from tasks.token_shards import TokenStream

    stream = TokenStream(url, "train", seq_len, cache_dir=None)
    out = np.empty((stream.samples, seq_len + 1), dtype=np.int64)
    stream.read_windows(np.arange(stream.samples, dtype=np.int64) * seq_len, out)
    stream.close()
    return {row.tobytes() for row in out}


@pytest.mark.slow
def test_code_documents_dedup_tokenize_and_mix_with_web_at_the_configured_weights(tmp_path):
    from tasks.dedup.config import DedupConfig
    from tasks.dedup.stage import run_dedup
    from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
    from tasks.tokenize.stage import run_tokenize
    from tasks.tokenize.tokenizer import train_tokenizer
    from tasks.train.data import TokenLoader

    summary = write_sample_code(str(tmp_path / "sample"), files=60)
    code_docs = run_code_ingest([summary["input"]], str(tmp_path / "code"), CodeIngestConfig(), fingerprint="c")
    deduped = run_dedup([code_docs], str(tmp_path / "dedup"), DedupConfig(), fingerprint="d")
    exact = summary["categories"]["exact_dup"]
    assert deduped.stats["dropped.exact_duplicate"] == exact
    assert deduped.rows == code_docs.rows - exact - deduped.stats.get("dropped.near_duplicate", 0)
    texts = [row["text"] for row in rows_of(deduped)]
    assert len(texts) == len(set(texts))  # no exact copy survives

    web_docs = web_documents(str(tmp_path / "web"))
    cfg = TokenizeConfig(val_fraction=0.05)
    tokenizer_cfg = TokenizerConfig(vocab_size=320, min_frequency=1, sample_docs=2000)
    tokenizer = train_tokenizer([web_docs, deduped], str(tmp_path / "tok"), tokenizer_cfg, fingerprint="t")
    web_tokens = run_tokenize([web_docs], tokenizer.meta["url"], str(tmp_path / "web-tokens"), cfg, fingerprint="wt")
    code_tokens = run_tokenize([deduped], tokenizer.meta["url"], str(tmp_path / "code-tokens"), cfg, fingerprint="ct")
    assert code_tokens.stats["in"] == deduped.rows

    seq_len, global_batch, steps = 16, 32, 40
    origin = {"web": windows_by_content(web_tokens.meta["url"], seq_len),
              "code": windows_by_content(code_tokens.meta["url"], seq_len)}
    assert not origin["web"] & origin["code"]  # every window tells which dataset it came from
    loader = TokenLoader({"web": web_tokens.meta["url"], "code": code_tokens.meta["url"]}, {"web": 0.8, "code": 0.2},
                         split="train", seq_len=seq_len, global_batch=global_batch, dp_rank=0, dp_size=1, seed=0,
                         prefetch=0)
    counts = {"web": 0, "code": 0}
    with loader:
        for _ in range(steps):
            inputs, targets = loader.next_batch()
            windows = np.concatenate([inputs.numpy(), targets.numpy()[:, -1:]], axis=1).astype(np.int64)
            for row in windows:
                (name,) = [n for n, seen in origin.items() if row.tobytes() in seen]
                counts[name] += 1
    samples = steps * global_batch
    share = counts["code"] / samples
    assert abs(share - 0.2) <= 3 * math.sqrt(0.2 * 0.8 / samples), counts
