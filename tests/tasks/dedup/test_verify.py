import numpy as np
import pytest

from tasks.dedup import lsh, verify
from tasks.dedup.verify import estimated_jaccard, exact_jaccard, first_equal_band


def test_exact_jaccard_of_literal_sets():
    sets = [[1, 2, 3, 4], [3, 4, 5, 6], [1, 2], [1, 2], [], [], [5], [6]]
    values, offsets = np.array(sum(sets, []), dtype=np.uint32), np.cumsum([0, *map(len, sets)])
    similarity = exact_jaccard(values, offsets, np.array([0, 2, 4, 6]), np.array([1, 3, 5, 7]))
    assert similarity.tolist() == pytest.approx([2 / 6, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_exact_jaccard_counts_distinct_values_whatever_their_order_and_repeats(dtype):
    sets = [[4, 1, 2, 1, 3, 4], [6, 3, 3, 5, 4], [2**31 + 7, 9, 9], [9, 2**31 + 7]]
    values, offsets = np.array(sum(sets, []), dtype=dtype), np.cumsum([0, *map(len, sets)])
    similarity = exact_jaccard(values, offsets, np.array([0, 2, 1]), np.array([1, 3, 1]))
    assert similarity.tolist() == pytest.approx([2 / 6, 1.0, 1.0])


def test_first_equal_band_finds_the_earliest_agreeing_band_or_none():
    signatures = np.array([[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 5, 6], [9, 9, 9, 9, 9, 9]], dtype=np.uint32)
    a, b = np.array([0, 0, 1]), np.array([1, 2, 1])
    assert first_equal_band(signatures, a, b, bands=3, rows=2).tolist() == [1, -1, 0]


def _colliding_band_keys(signatures, bands, rows):
    """Band keys with 2 bits: most different bands collide, as a 64-bit collision would, only often."""
    return lsh.band_keys(signatures, bands, rows) & np.uint64(3)


def test_a_band_key_collision_never_counts_as_an_equal_band(monkeypatch):
    rng = np.random.default_rng(0)
    signatures = rng.integers(0, 4, size=(60, 12), dtype=np.uint32)  # 4 values: some bands agree by chance
    a, b = np.triu_indices(60, k=1)
    truth = np.full(len(a), -1)
    for i, (x, y) in enumerate(zip(a, b)):
        equal = [(signatures[x, 3 * k: 3 * k + 3] == signatures[y, 3 * k: 3 * k + 3]).all() for k in range(4)]
        truth[i] = equal.index(True) if any(equal) else -1
    monkeypatch.setattr(verify, "band_keys", _colliding_band_keys)
    got = first_equal_band(signatures, a, b, bands=4, rows=3)
    colliding = _colliding_band_keys(signatures, 4, 3)
    assert ((colliding[a] == colliding[b]).any(axis=1) & (truth == -1)).sum() > 100  # collisions happened
    assert got.tolist() == truth.tolist()


def test_estimated_jaccard_is_the_share_of_equal_values():
    assert estimated_jaccard(np.array([[1, 2, 3, 4]]), np.array([[1, 2, 0, 4]])).tolist() == [0.75]
