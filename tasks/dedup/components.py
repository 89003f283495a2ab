"""Clusters of duplicates: connected components over verified pairs, and one survivor per cluster.

Memory is proportional to the number of documents that have a duplicate, never to the corpus.
"""

from __future__ import annotations

import numpy as np


def connected_components(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Component label (its smallest node) of each of ``n`` nodes, given edges ``a[i] — b[i]``.

    Union-find, vectorised: every round hooks each edge's larger root under the smaller one
    (``parent[x] <= x`` always holds, so no cycles), then compresses paths fully by pointer
    jumping. It stops when both ends of every edge have the same root; rounds grow with the
    logarithm of the component diameter in practice.
    """
    parent = np.arange(n, dtype=np.int64)
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    while True:
        root_a, root_b = parent[a], parent[b]
        pending = root_a != root_b
        if not pending.any():
            return parent
        root_a, root_b = root_a[pending], root_b[pending]
        low = np.minimum(root_a, root_b)
        np.minimum.at(parent, np.maximum(root_a, root_b), low)
        while True:  # full path compression
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand


def choose_survivors(labels: np.ndarray, quality: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each node, the index of the node its cluster keeps: highest quality, then smallest id.

    ``labels`` are node indices (as ``connected_components`` returns). A NaN quality (no
    classifier ran) ranks below every score. ``ids`` are strings.
    """
    quality = np.asarray(quality, dtype=np.float64)
    neg_quality = np.where(np.isnan(quality), np.inf, -quality)
    _, id_rank = np.unique(np.asarray(ids, dtype=str), return_inverse=True)
    order = np.lexsort((id_rank, neg_quality, labels))
    sorted_labels = labels[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_labels[1:] != sorted_labels[:-1]
    survivor_of_label = np.zeros(int(labels.max()) + 1 if len(labels) else 0, dtype=np.int64)
    survivor_of_label[sorted_labels[first]] = order[first]
    return survivor_of_label[labels]


def size_bin(size: int) -> str:
    """Histogram bin name of a cluster size: ``2``, ``3-4``, ``5-8``, ``9-16``, …"""
    if size <= 2:
        return str(size)
    high = 1 << (size - 1).bit_length()
    return f"{high // 2 + 1}-{high}"
