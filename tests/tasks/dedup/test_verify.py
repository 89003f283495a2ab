import numpy as np
import pytest

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


def test_estimated_jaccard_is_the_share_of_equal_values():
    assert estimated_jaccard(np.array([[1, 2, 3, 4]]), np.array([[1, 2, 0, 4]])).tolist() == [0.75]
