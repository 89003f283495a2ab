"""Token shard layout: dtype choice, EOS placement, document index, write/read round trip."""

from __future__ import annotations

import numpy as np

from tasks import contract
from tasks.tokenize.shards import join_documents
from tasks.token_shards import iter_token_documents, read_token_shard, token_dtype, write_token_shard


def test_ids_fit_uint16_up_to_65536_entries_then_uint32():
    assert token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")


def test_every_document_ends_with_eos_and_the_index_points_at_its_start():
    tokens, starts = join_documents([[5, 6], [7], [8, 9, 10]], eos_id=1, bos_id=None, dtype=np.dtype("<u2"))
    assert tokens.tolist() == [5, 6, 1, 7, 1, 8, 9, 10, 1]
    assert starts.tolist() == [0, 3, 5]


def test_bos_starts_every_document_when_asked():
    tokens, starts = join_documents([[5, 6], [7]], eos_id=1, bos_id=0, dtype=np.dtype("<u4"))
    assert tokens.tolist() == [0, 5, 6, 1, 0, 7, 1] and tokens.dtype == np.dtype("<u4")
    assert starts.tolist() == [0, 4]


def test_written_shards_read_back_per_document(tmp_path):
    url = str(tmp_path / "tokens")
    tokens, starts = join_documents([[70000, 2], [3]], eos_id=1, bos_id=None, dtype=np.dtype("<u4"))
    infos = write_token_shard(url, "val-00003", "val", tokens, starts)
    assert [(s.name, s.rows, s.bytes) for s in infos] == [("val-00003.bin", 5, 20), ("val-00003.idx", 0, infos[1].bytes)]
    assert infos[0].extra == {"split": "val", "tokens": 5, "docs": 2, "dtype": "uint32"}
    manifest = contract.commit(url, "tokens", "t", infos, {}, meta={"dtype": "uint32"})
    back, back_starts = read_token_shard(manifest, "val-00003.bin")
    assert back.tolist() == [70000, 2, 1, 3, 1] and back_starts.tolist() == [0, 3]
    assert [d.tolist() for d in iter_token_documents(manifest, "val")] == [[70000, 2, 1], [3, 1]]
    assert list(iter_token_documents(manifest, "train")) == []
