"""The tokenize stage end to end on tiny documents: round trip, counts, split, idempotency."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tasks import contract, storage
from tasks.checksums import file_checksum
from tasks.tokenize.config import TokenizeConfig
from tasks.tokenize.stage import run_tokenize
from tasks.tokenizer_files import load_tokenizer
from tasks.token_shards import iter_token_documents, read_token_shard
from tasks.train.data import TokenLoader
from tests.tasks.tokenize.conftest import TEXTS, write_documents


def pickling_map(fn, items, *, label=""):
    """Like a Dask map: the work function must survive pickling."""
    fn = pickle.loads(pickle.dumps(fn))
    return [fn(item) for item in items]


@pytest.fixture
def tokens(tmp_path, docs, tokenizer_dataset, small_cfg) -> contract.Manifest:
    return run_tokenize([docs], tokenizer_dataset.meta["url"], str(tmp_path / "tokens"), small_cfg,
                        fingerprint="tk", map_fn=pickling_map)


def decoded(manifest: contract.Manifest, split: str) -> list[str]:
    tokenizer = load_tokenizer(manifest.meta["url"])  # the tokens dataset carries its tokenizer
    out = []
    for doc in iter_token_documents(manifest, split):
        assert doc[-1] == manifest.meta["eos_id"]
        out.append(tokenizer.decode(doc[:-1].tolist(), skip_special_tokens=False))
    return out


def test_decoding_the_shards_reproduces_every_document(tokens):
    texts = decoded(tokens, "train") + decoded(tokens, "val")
    assert sorted(texts) == sorted(TEXTS[i % len(TEXTS)] + f" #{i}" for i in range(30))


def test_manifest_counts_equal_the_shard_contents(tokens):
    assert tokens.kind == "tokens" and contract.verify(tokens) == []
    for shard in tokens.shards:
        if shard.name.endswith(".bin"):
            array, starts = read_token_shard(tokens, shard.name)
            assert shard.rows == shard.extra["tokens"] == len(array)
            assert shard.extra["docs"] == len(starts) == int((array == tokens.meta["eos_id"]).sum())
    stats = tokens.stats
    assert stats["in"] == 31 and stats["dropped.empty_text"] == 1 and stats["shards.in"] == 2
    assert stats["docs.train"] + stats["docs.val"] == 30 and stats["docs.val"] > 0
    assert stats["tokens.train"] + stats["tokens.val"] == tokens.rows
    assert stats["bytes.text"] == sum(len((TEXTS[i % 6] + f" #{i}").encode()) for i in range(30))
    assert {k: tokens.meta[k] for k in ("dtype", "vocab_size", "bos_id", "eos_id", "pad_id")} == {
        "dtype": "uint16", "vocab_size": 300, "bos_id": 0, "eos_id": 1, "pad_id": 2}


def test_shards_are_named_by_split_and_input_shard(tokens):
    names = [s.name for s in tokens.shards]
    assert {"train-00000.bin", "train-00000.idx", "train-00001.bin", "train-00001.idx"} <= set(names)
    assert all(n.split("-")[0] in ("train", "val") for n in names)


def test_validation_split_depends_on_the_document_not_its_shard(tmp_path, tokens, tokenizer_dataset, small_cfg):
    rows = [(f"doc-{i}", TEXTS[i % len(TEXTS)] + f" #{i}") for i in range(30)]
    resharded = write_documents(str(tmp_path / "resharded"), [rows[::3], rows[1::3], rows[2::3]], row_group_size=5)
    other = run_tokenize([resharded], tokenizer_dataset.meta["url"], str(tmp_path / "other"), small_cfg, fingerprint="o")
    assert sorted(decoded(other, "val")) == sorted(decoded(tokens, "val"))


def test_a_rerun_reuses_finished_shards_byte_for_byte(tmp_path, docs, tokenizer_dataset, small_cfg, tokens):
    again = run_tokenize([docs], tokenizer_dataset.meta["url"], str(tmp_path / "tokens"), small_cfg, fingerprint="tk")
    assert again.stats["shards_reused"] == 2
    assert [(s.name, s.checksum) for s in again.shards] == [(s.name, s.checksum) for s in tokens.shards]


def test_the_loader_reads_the_stage_output(tokens):
    with TokenLoader({"web": tokens.meta["url"]}, None, split="train", seq_len=16, global_batch=2, dp_rank=0,
                     dp_size=1, seed=0, prefetch=0) as loader:
        inputs, targets = loader.next_batch()
    assert inputs.shape == (2, 16) and int(inputs.max()) < 300 and loader.eos_id == 1


def test_a_vocabulary_beyond_uint16_writes_uint32_shards(tmp_path, docs):
    # a BPE with no merges whose byte symbols sit above id 65535: every token needs uint32
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {f"filler{i}": i for i in range(70000)} | {c: 70000 + i for i, c in enumerate(sorted(alphabet))}
    wide = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    wide.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    wide.decoder = decoders.ByteLevel()
    wide.add_special_tokens(["<|bos|>", "<|eos|>", "<|pad|>"])
    (tmp_path / "wide.json").write_text(wide.to_str())
    out = run_tokenize([docs], str(tmp_path / "wide.json"), str(tmp_path / "tokens"), TokenizeConfig(val_fraction=0.0),
                       fingerprint="w")
    assert out.meta["dtype"] == "uint32" and out.meta["eos_id"] == 70257
    assert [s.name for s in out.shards if s.name.endswith(".bin")] == ["train-00000.bin", "train-00001.bin"]
    assert sorted(decoded(out, "train")) == sorted(TEXTS[i % len(TEXTS)] + f" #{i}" for i in range(30))


def test_tokenizing_a_non_documents_dataset_is_refused(tmp_path, tokens, tokenizer_dataset, small_cfg):
    with pytest.raises(contract.DatasetError, match="reads 'documents' datasets"):
        run_tokenize([tokens], tokenizer_dataset.meta["url"], str(tmp_path / "x"), small_cfg, fingerprint="x")


def test_the_tokenizer_inside_the_dataset_matches_the_manifest(tokens):
    fs, path = storage.filesystem(storage.join(tokens.meta["url"], "tokenizer.json"))
    assert file_checksum(fs, path) == tokens.meta["tokenizer_checksum"]
    assert json.loads(fs.cat_file(path))["decoder"]["type"] == "ByteLevel"
    assert np.dtype(tokens.meta["dtype"]).itemsize == 2


def test_documents_without_an_id_are_split_by_content(tmp_path, tokenizer_dataset, small_cfg):
    rows = [(None, TEXTS[i % len(TEXTS)] + f" #{i}") for i in range(30)]
    first = write_documents(str(tmp_path / "a"), [rows])
    second = write_documents(str(tmp_path / "b"), [rows[::-1]])
    a = run_tokenize([first], tokenizer_dataset.meta["url"], str(tmp_path / "ta"), small_cfg, fingerprint="a")
    b = run_tokenize([second], tokenizer_dataset.meta["url"], str(tmp_path / "tb"), small_cfg, fingerprint="b")
    assert a.stats["docs.train"] + a.stats["docs.val"] == 30 and 0 < a.stats["docs.val"] < 30
    assert sorted(decoded(a, "val")) == sorted(decoded(b, "val"))
