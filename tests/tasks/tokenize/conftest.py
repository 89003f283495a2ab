"""Tiny documents datasets and a tiny tokenizer shared by the tokenize tests."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import contract
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.tokenize.tokenizer import train_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Ünïcödé, emoji 😀 and CJK 漢字 survive the round trip.",
    "  leading spaces, trailing tabs\t\t\r\nand a literal <|eos|> in the text",
    "Pack my box with five dozen liquor jugs; how vexingly quick daft zebras jump!",
    "for i in range(10):\n\tprint(i * i)\n",
]


def write_documents(url: str, shards: list[list[tuple[str, str | None]]], row_group_size: int = 2) -> contract.Manifest:
    """A documents dataset whose shard k holds the (id, text) rows ``shards[k]``."""
    infos = []
    for k, rows in enumerate(shards):
        table = pa.table(
            {name: [doc_id if name == "id" else text if name == "text" else None for doc_id, text in rows]
             for name in DOCUMENT_COLUMNS},
            schema=document_schema(),
        )

        def write(f, table=table) -> int:
            pq.write_table(table, f, row_group_size=row_group_size)
            return table.num_rows

        infos.append(contract.write_shard(url, f"docs-{k:05d}.parquet", write))
    return contract.commit(url, "documents", "docs-" + url.rsplit("/", 1)[-1], infos, {"docs": sum(len(r) for r in shards)})


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> contract.Manifest:
    """Two shards: 30 short documents, plus one empty document (read-only: tests write elsewhere)."""
    rows = [(f"doc-{i}", TEXTS[i % len(TEXTS)] + f" #{i}") for i in range(30)]
    return write_documents(str(tmp_path_factory.mktemp("docs")), [rows[:17], rows[17:] + [("empty", "")]])


@pytest.fixture(scope="module")
def small_cfg() -> TokenizeConfig:
    return TokenizeConfig(batch_docs=4, val_fraction=0.2)


@pytest.fixture(scope="module")
def small_tokenizer_cfg() -> TokenizerConfig:
    return TokenizerConfig(vocab_size=300, min_frequency=1, sample_docs=1000)


@pytest.fixture(scope="module")
def tokenizer_dataset(tmp_path_factory, docs, small_tokenizer_cfg) -> contract.Manifest:
    return train_tokenizer([docs], str(tmp_path_factory.mktemp("tokenizer")), small_tokenizer_cfg, fingerprint="tok")
