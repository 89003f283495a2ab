"""Tokenizer training on a document sample, loading from any URL, and the byte-exact round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks import contract, storage
from tasks.tokenize.config import SpecialTokens, TokenizerConfig
from tasks.tokenize.tokenizer import special_ids, train_tokenizer
from tasks.tokenizer_files import load_tokenizer
from tests.tasks.tokenize.conftest import TEXTS, write_documents


def test_trained_tokenizer_is_a_dataset_with_special_tokens_first(tokenizer_dataset):
    assert tokenizer_dataset.kind == "tokenizer"
    assert [s.name for s in tokenizer_dataset.shards] == ["tokenizer.json"]
    assert tokenizer_dataset.meta | {"url": ""} == {"url": "", "vocab_size": 300, "bos_id": 0, "eos_id": 1, "pad_id": 2}
    assert tokenizer_dataset.stats == {"out": 30, "bytes.sampled": tokenizer_dataset.stats["bytes.sampled"],
                                       "dropped.empty_text": 1}
    assert load_tokenizer(tokenizer_dataset.meta["url"]).get_vocab_size() == 300


def test_training_is_deterministic(tmp_path, docs, small_tokenizer_cfg, tokenizer_dataset):
    again = train_tokenizer([docs], str(tmp_path / "again"), small_tokenizer_cfg, fingerprint="tok")
    assert again.shards[0].checksum == tokenizer_dataset.shards[0].checksum


def test_sample_docs_bounds_a_seeded_sample_spread_over_shards(tmp_path):
    rows = [(f"d{i}", TEXTS[i % len(TEXTS)]) for i in range(400)]
    docs = write_documents(str(tmp_path / "docs"), [rows[:200], rows[200:]], row_group_size=50)
    cfg = TokenizerConfig(vocab_size=300, sample_docs=40, min_frequency=1)
    a = train_tokenizer([docs], str(tmp_path / "a"), cfg, fingerprint="a").stats["out"]
    b = train_tokenizer([docs], str(tmp_path / "b"), cfg, fingerprint="b").stats["out"]
    assert a == b and 20 <= a <= 40


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=200))
def test_decode_of_encode_reproduces_any_text(tokenizer_dataset, text):
    tokenizer = load_tokenizer(tokenizer_dataset.meta["url"])
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_special_token_text_in_a_document_stays_text(tokenizer_dataset):
    tokenizer = load_tokenizer(tokenizer_dataset.meta["url"])
    ids = tokenizer.encode("end <|eos|> here", add_special_tokens=False).ids
    assert 1 not in ids and tokenizer.decode(ids) == "end <|eos|> here"


def test_any_tokenizer_json_url_loads(tokenizer_dataset):
    blob = storage.filesystem(contract.shard_url(tokenizer_dataset, "tokenizer.json"))[0].cat_file(
        storage.filesystem(contract.shard_url(tokenizer_dataset, "tokenizer.json"))[1])
    fs, _ = storage.filesystem("memory://tok/elsewhere.json")
    fs.pipe_file("/tok/elsewhere.json", blob)
    assert load_tokenizer("memory://tok/elsewhere.json").token_to_id("<|eos|>") == 1


def test_missing_or_wrong_tokenizer_is_a_clear_error(tmp_path, docs):
    with pytest.raises(contract.DatasetError, match="no tokenizer at"):
        load_tokenizer(str(tmp_path / "nothing.json"))
    with pytest.raises(contract.DatasetError, match="not a tokenizer or tokens dataset"):
        load_tokenizer(docs.meta["url"])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(contract.DatasetError, match="not a valid tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_a_tokenizer_without_the_configured_eos_is_refused(tokenizer_dataset):
    tokenizer = load_tokenizer(tokenizer_dataset.meta["url"])
    with pytest.raises(ValueError, match="tokenizer.eos_token"):
        special_ids(tokenizer, SpecialTokens(eos_token="</s>"))


def test_a_corpus_of_empty_documents_cannot_train_a_tokenizer(tmp_path):
    docs = write_documents(str(tmp_path / "docs"), [[("a", ""), ("b", None)]])
    with pytest.raises(contract.DatasetError, match="no non-empty documents"):
        train_tokenizer([docs], str(tmp_path / "tok"), TokenizerConfig(), fingerprint="x")


def test_hugging_face_tokenizer_files_give_roles_and_keep_special_token_text_as_text(tokenizer_dataset):
    import json

    from tokenizers import Tokenizer

    from tasks.tokenizer_files import hf_tokenizer_files

    blob = storage.filesystem(contract.shard_url(tokenizer_dataset, "tokenizer.json"))[0].cat_file(
        storage.filesystem(contract.shard_url(tokenizer_dataset, "tokenizer.json"))[1]).decode()
    meta = tokenizer_dataset.meta
    files = hf_tokenizer_files(blob, bos_id=meta["bos_id"], eos_id=meta["eos_id"], pad_id=meta["pad_id"],
                               add_bos=False, max_length=512)
    config = json.loads(files["tokenizer_config.json"])
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["split_special_tokens"] is True
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert json.loads(files["special_tokens_map.json"])["eos_token"] == "<|eos|>"
    assert files["tokenizer.json"].decode() == blob  # unchanged without add_bos

    with_bos = Tokenizer.from_str(hf_tokenizer_files(blob, bos_id=meta["bos_id"], eos_id=meta["eos_id"],
                                                     pad_id=None, add_bos=True, max_length=512)["tokenizer.json"].decode())
    with_bos.encode_special_tokens = True  # what split_special_tokens sets in transformers
    plain = load_tokenizer(tokenizer_dataset.meta["url"])
    text = "a literal <|eos|> stays text"
    assert with_bos.encode(text).ids == [meta["bos_id"]] + plain.encode(text).ids
    assert meta["eos_id"] not in plain.encode(text).ids
