import functools

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from tasks.dedup import minhash
from tasks.dedup.minhash import _SPAN, MinHasher, hash_shingle, shard_shingle_hashes, shingle_strings
from tasks.dedup.normalize import Words, normalized_words, spaced_bytes
from tests.tasks.dedup.corpus import words

DOCS = [
    "The quick brown fox jumps over the lazy dog, again and again.",
    "",
    "two words",
    "exactly five words right here",
    " ".join(words(1, 300)),
    "!!!",
    " ".join(words(2, 60)),
]


@pytest.mark.parametrize("scheme", ["affine32", "affine64", "legacy"])
def test_signatures_equal_datasketch_minhash_with_the_same_hashfunc_seed_and_num_perm(scheme):
    docs_words = [normalized_words(d) for d in DOCS]
    hasher = MinHasher(num_perm=128, seed=42, scheme=scheme, batch=37)  # small batches split documents
    hashes, offsets = shard_shingle_hashes(Words.of([spaced_bytes(d) for d in DOCS]), 5, hasher.bits)
    signatures = hasher.signatures(hashes, offsets)
    hashfunc = functools.partial(hash_shingle, bits=hasher.bits)
    for doc_words, signature in zip(docs_words, signatures):
        reference = MinHash(num_perm=128, seed=42, hashfunc=hashfunc, scheme=scheme)
        reference.update_batch(shingle_strings(doc_words, 5))
        assert reference.hashvalues.dtype == signature.dtype
        np.testing.assert_array_equal(reference.hashvalues, signature)


@pytest.mark.parametrize("span", [_SPAN, 7])
def test_vectorised_shingle_hashes_equal_the_scalar_hash_of_each_shingle(span, monkeypatch):
    # span 7: the batch is hashed in many prefix-sum passes and words longer than a pass go alone
    monkeypatch.setattr("tasks.dedup.minhash._SPAN", span)
    monkeypatch.setattr("tasks.dedup.minhash._powers", functools.cache(minhash._powers.__wrapped__))
    docs = [*DOCS, "Größe δοκιμή हिन्दी " + "x" * 40]
    docs_words = [normalized_words(d) for d in docs]
    hashes, offsets = shard_shingle_hashes(Words.of([spaced_bytes(d) for d in docs]), 3, 64)
    for d, doc_words in enumerate(docs_words):
        expected = [hash_shingle(s, bits=64) for s in shingle_strings(doc_words, 3)]
        assert hashes[offsets[d] : offsets[d + 1]].tolist() == expected


def test_short_documents_are_one_shingle_and_empty_ones_have_none():
    _, offsets = shard_shingle_hashes(Words.of([b"a  b ", b"  ", b"a b c d e f g"]), 5, 32)
    assert np.diff(offsets).tolist() == [1, 0, 3]


def test_datasketch_lsh_finds_a_near_duplicate_from_smelt_signatures():
    base = words(7, 200)
    variant = list(base)
    variant[100] = "changed"
    hasher = MinHasher()
    texts = [" ".join(w).encode() for w in (base, variant, words(8, 200))]
    hashes, offsets = shard_shingle_hashes(Words.of(texts), 5, hasher.bits)
    signatures = hasher.signatures(hashes, offsets)
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    for i, signature in enumerate(signatures):
        lsh.insert(str(i), MinHash(hashvalues=signature, scheme="affine32"))
    assert sorted(lsh.query(MinHash(hashvalues=signatures[0], scheme="affine32"))) == ["0", "1"]
