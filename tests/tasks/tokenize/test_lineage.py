"""The tokenize stage's lineage shards: every document's row points at its source and its exact tokens."""

from __future__ import annotations

import numpy as np

from tasks import contract, verified_reads
from tasks.tokenize.stage import LINEAGE_COLUMNS, run_tokenize
from tasks.tokenizer_files import load_tokenizer
from tasks.token_shards import lineage_name, read_token_shard


def test_each_lineage_row_names_its_source_row_and_its_exact_token_range(tmp_path, docs, tokenizer_dataset, small_cfg):
    tokens = run_tokenize([docs], tokenizer_dataset.meta["url"], str(tmp_path / "tokens"), small_cfg, fingerprint="tk")
    tokenizer = load_tokenizer(tokens.meta["url"])
    sources = {s.name: verified_reads.read_parquet(contract.shard_url(docs, s), s).to_pylist()
               for s in docs.shards if s.name.endswith(".parquet")}
    seen = 0
    for shard in (s for s in tokens.shards if s.name.endswith(".bin")):
        array, starts = read_token_shard(tokens, shard.name)
        lineage_info = next(s for s in tokens.shards if s.name == lineage_name(shard.name))
        assert lineage_info.rows == 0 and lineage_info.extra["split"] == shard.extra["split"]
        lineage = verified_reads.read_parquet(contract.shard_url(tokens, lineage_info), lineage_info)
        assert tuple(lineage.column_names) == LINEAGE_COLUMNS
        assert lineage.column("token_start").to_pylist() == starts.tolist()
        for row in lineage.to_pylist():
            source = sources[row["shard"]][row["row"]]
            assert row["documents"] == docs.fingerprint and row["id"] == source["id"]
            assert row["text_bytes"] == len(source["text"].encode())
            doc = array[row["token_start"]: row["token_start"] + row["tokens"]]
            want = tokenizer.encode(source["text"], add_special_tokens=False).ids + [tokens.meta["eos_id"]]
            np.testing.assert_array_equal(doc, want)
            seen += 1
    assert seen == 30  # every non-empty document once; the empty one has no tokens and no row
    assert tokens.rows == tokens.stats["tokens.train"] + tokens.stats["tokens.val"]  # lineage adds no rows
