import numpy as np

from tasks.dedup.candidates import exact_edges, near_candidates
from tasks.dedup.shuffle import EXACT_BAND, RECORD


def _records(rows):
    out = np.zeros(len(rows), dtype=RECORD)
    for i, (key, tag, doc, band) in enumerate(rows):
        out[i] = (key, tag, doc, band)
    return out


def test_exact_groups_link_every_copy_to_the_smallest_document():
    records = _records([
        (7, 1, 30, EXACT_BAND), (7, 1, 10, EXACT_BAND), (7, 2, 20, EXACT_BAND), (7, 1, 40, EXACT_BAND), (9, 9, 50, 0),
    ])
    a, b = exact_edges(records)
    assert sorted(zip(a.tolist(), b.tolist())) == [(10, 30), (10, 40)]  # (7, 2) differs in the low half


def test_band_groups_pair_members_and_collapse_exact_copies():
    records = _records([
        (5, 100, 3, 0), (5, 100, 1, 0), (5, 200, 2, 0),  # docs 1 and 3 are copies (same tag)
        (5, 300, 4, 1),  # same key, other band: another group
        (6, 400, 8, 2), (6, 500, 9, 2),
    ])
    a, b, band = near_candidates(records, fanout=8)
    assert sorted(zip(a.tolist(), b.tolist(), band.tolist())) == [(1, 2, 0), (8, 9, 2)]


def test_fanout_bounds_the_pairs_of_a_large_group():
    k, fanout = 50, 3
    records = _records([(1, 1000 + d, d, 0) for d in range(k)])
    a, b, _ = near_candidates(records, fanout=fanout)
    assert len(a) == sum(min(i, fanout) for i in range(k))
    assert (a < b).all()
    assert len(set(zip(a.tolist(), b.tolist()))) == len(a)
