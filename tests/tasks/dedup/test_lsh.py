import numpy as np
import pytest
from datasketch.lsh import _optimal_param

from tasks.dedup.lsh import band_keys, candidate_probability, choose_bands
from tasks.dedup.minhash import MinHasher


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.9])
def test_without_the_miss_bound_the_choice_is_datasketchs(threshold):
    assert choose_bands(threshold, 128, 0.5, 0.5, max_miss=0.999) == _optimal_param(threshold, 128, 0.5, 0.5)


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9, 0.95])
def test_chosen_bands_catch_pairs_at_the_threshold_with_the_configured_probability(threshold):
    bands, rows = choose_bands(threshold, 128, max_miss=0.005)
    assert bands * rows <= 128
    assert candidate_probability(threshold, bands, rows) >= 0.995


def test_default_choice_for_0_8_and_the_curves_it_replaces():
    assert choose_bands(0.8, 128) == (18, 6)
    assert candidate_probability(0.8, 9, 13) < 0.41  # datasketch's unconstrained choice misses most pairs at 0.8
    assert (1 / 14) ** (1 / 8) == pytest.approx(0.72, abs=0.005)  # 14 × 8's effective threshold
    assert candidate_probability(0.72, 14, 8) > 0.6  # unverified, it removes most pairs at 0.72


def test_an_impossible_miss_bound_is_a_clear_error():
    with pytest.raises(ValueError, match="max_miss_at_threshold"):
        choose_bands(0.99, 4, max_miss=1e-9)


def _pairs_with_similarity(s: float, n_pairs: int, rng: np.random.Generator, union: int = 200):
    """Shingle-hash sets of pairs with Jaccard exactly ``s``: (hashes, offsets) for 2·n_pairs docs."""
    shared = int(round(s * union))
    own = (union - shared) // 2
    docs = []
    for _ in range(n_pairs):
        values = rng.choice(2**32, size=shared + 2 * own, replace=False).astype(np.uint32)
        docs.append(values[: shared + own])
        docs.append(np.concatenate([values[:shared], values[shared + own :]]))
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    return np.concatenate(docs), offsets


@pytest.mark.parametrize("s", [0.5, 0.7, 0.8])
def test_measured_candidate_rate_follows_the_closed_form_banding_curve(s):
    bands, rows, n_pairs = 18, 6, 400
    hashes, offsets = _pairs_with_similarity(s, n_pairs, np.random.default_rng(int(s * 100)))
    keys = band_keys(MinHasher().signatures(hashes, offsets), bands, rows)
    candidate = (keys[0::2] == keys[1::2]).any(axis=1)
    expected = candidate_probability(s, bands, rows)
    tolerance = 4 * np.sqrt(expected * (1 - expected) / n_pairs) + 0.01
    assert abs(candidate.mean() - expected) <= tolerance


def test_band_keys_are_equal_exactly_where_bands_are_equal():
    signatures = np.arange(2 * 12, dtype=np.uint32).reshape(2, 12)
    signatures[1] = signatures[0]
    signatures[1, 5] += 1  # band 1 of 3 × 4 differs
    keys = band_keys(signatures, 3, 4)
    assert (keys[0] == keys[1]).tolist() == [True, False, True]
    assert len(set(keys[0].tolist())) == 3  # the band index is part of the key
