import math

import numpy as np

from tasks.dedup.components import choose_survivors, connected_components, size_bin


def _components(labels):
    groups = {}
    for node, label in enumerate(labels.tolist()):
        groups.setdefault(label, []).append(node)
    return sorted(groups.values())


def test_components_of_a_hand_made_graph():
    # 0-1-2 chain, 3-4, 5 alone, 6-7-8 triangle, 9-0 joins the chain from the far side
    a = np.array([0, 1, 3, 6, 7, 8, 9])
    b = np.array([1, 2, 4, 7, 8, 6, 0])
    labels = connected_components(a, b, 10)
    assert _components(labels) == [[0, 1, 2, 9], [3, 4], [5], [6, 7, 8]]
    assert labels.tolist()[:3] == [0, 0, 0]  # a component is labelled by its smallest node


def test_a_long_chain_given_in_reverse_order_is_one_component():
    n = 1000
    labels = connected_components(np.arange(n - 1, 0, -1), np.arange(n - 2, -1, -1), n)
    assert set(labels.tolist()) == {0}


def test_a_star_and_self_loops_and_no_edges():
    star = connected_components(np.array([5, 5, 5, 2]), np.array([1, 3, 4, 2]), 6)
    assert _components(star) == [[0], [1, 3, 4, 5], [2]]
    assert connected_components(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 3).tolist() == [0, 1, 2]


def test_survivor_is_the_highest_quality_then_the_smallest_id():
    labels = np.array([0, 0, 0, 3, 3, 5, 5])
    quality = np.array([0.2, 0.9, 0.9, math.nan, math.nan, math.nan, 0.1])
    ids = np.array(["c", "z", "b", "y", "x", "a", "b"], dtype=object)
    survivors = choose_survivors(labels, quality, ids)
    assert survivors.tolist() == [2, 2, 2, 4, 4, 6, 6]  # ties on quality → "b"; all NaN → "x"; NaN ranks last


def test_cluster_size_bins_double():
    assert [size_bin(s) for s in (2, 3, 4, 5, 8, 9, 1000)] == ["2", "3-4", "3-4", "5-8", "5-8", "9-16", "513-1024"]
