import numpy as np
import pytest

from tasks.dedup.verify import estimated_jaccard, exact_jaccard, first_equal_band


def test_exact_jaccard_of_literal_sets():
    sets_a = [np.array([1, 2, 3, 4]), np.array([1, 2]), np.array([], dtype=np.int64), np.array([5])]
    sets_b = [np.array([3, 4, 5, 6]), np.array([1, 2]), np.array([], dtype=np.int64), np.array([6])]
    assert exact_jaccard(sets_a, sets_b).tolist() == pytest.approx([2 / 6, 1.0, 1.0, 0.0])


def test_first_equal_band_finds_the_earliest_agreeing_band_or_none():
    a = np.array([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    b = np.array([[9, 2, 3, 4, 5, 6], [9, 9, 9, 9, 9, 9]])
    assert first_equal_band(a, b, bands=3, rows=2).tolist() == [1, -1]


def test_estimated_jaccard_is_the_share_of_equal_values():
    assert estimated_jaccard(np.array([[1, 2, 3, 4]]), np.array([[1, 2, 0, 4]])).tolist() == [0.75]
