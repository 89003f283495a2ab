"""Tiny deterministic corpora for dedup tests: documents as word lists and as Parquet shards."""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import contract, storage
from tasks.documents import document_schema

WORDS = (
    "river stone cloud paper engine garden window silver market yellow forest number simple "
    "letter morning bridge animal orange planet summer ladder violet castle mirror rocket "
    "pencil harbor candle tunnel meadow copper dragon island jacket kitten lemon marble "
    "needle ocean parrot quiver rabbit saddle temple umbrella velvet walnut xylophone yacht zebra"
).split()


def words(seed: int, n: int = 100) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n)]


def substitute(text_words: list[str], positions: list[int], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = list(text_words)
    for p in positions:
        out[p] = rng.choice([w for w in WORDS if w != out[p]])
    return out


def write_documents(
    url: str, shards: list[list[tuple[str, str | None, float]]], fp: str = "input-fp"
) -> contract.Manifest:
    """A documents dataset with one shard per list of (id, text, quality_score)."""
    infos = []
    for i, rows in enumerate(shards):
        n = len(rows)
        table = pa.table(
            {
                "id": [r[0] for r in rows],
                "url": [f"https://example.com/{r[0]}" for r in rows],
                "source": ["web"] * n,
                "lang": ["en"] * n,
                "lang_score": pa.array([1.0] * n, pa.float32()),
                "quality_score": pa.array([r[2] for r in rows], pa.float32()),
                "text": [r[1] for r in rows],
                "meta": ["{}"] * n,
            },
            schema=document_schema(),
        )

        def write(f, table=table):
            pq.write_table(table, f)
            return table.num_rows

        infos.append(contract.write_shard(url, f"docs-{i:05d}.parquet", write))
    return contract.commit(url, "documents", fp, infos, {})


def read_ids(manifest: contract.Manifest) -> list[list[str]]:
    out = []
    for shard in manifest.shards:
        fs, path = storage.filesystem(contract.shard_url(manifest, shard))
        with fs.open(path, "rb") as f:
            out.append(pq.read_table(f).column("id").to_pylist())
    return out


NAN = math.nan

# Two shards with exact copies (after normalisation), near copies and non-duplicates.
A = words(1)
B = words(2)
C = words(3)
SHARDS = [
    [
        ("a", " ".join(A), 0.5),
        ("a-copy", " ".join(A).upper().replace(" ", " ,  ") + "!", 0.9),  # same text once normalised
        ("a-near", " ".join(substitute(A, [50])), 0.7),  # Jaccard 91/101 = 0.90
        ("b", " ".join(B), NAN),
        ("c", " ".join(C), 0.1),
    ],
    [
        ("b-near", " ".join(substitute(B, [10])), 0.3),
        ("a-far", " ".join(substitute(A, list(range(3, 100, 7)))), 0.99),  # 14 edits: far below 0.8
        ("empty", "?!", NAN),
        ("null", None, NAN),
        ("c-copy", " ".join(C), 0.1),
    ],
]
