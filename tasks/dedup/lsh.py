"""LSH banding: how many bands and rows, and the band keys that make candidate pairs.

A signature of P values is cut into ``bands`` bands of ``rows`` values; two documents become a
candidate pair when any band is equal. For Jaccard similarity s the probability is the closed form

    P(candidate | s) = 1 − (1 − s^rows)^bands

``choose_bands`` picks (bands, rows) like datasketch (minimise the weighted areas under P below
the threshold, "false positives", and above it, "false negatives") but only among choices that
catch a pair at exactly the threshold with probability ≥ 1 − ``max_miss``. P rises with s, so
every pair above the threshold is caught at least that often. For threshold 0.8 and 128
permutations this gives 18 × 6 (P(0.8) = 0.996) where datasketch's unconstrained choice, 9 × 13,
has P(0.8) = 0.40, and the common 14 × 8 has 0.92 while its effective threshold (1/b)^(1/r) is
0.72: unverified, it removes two thirds of pairs at 0.72. Verification then drops candidates
below the threshold, so a low effective threshold costs time, not precision.
"""

from __future__ import annotations

import functools

import numpy as np

from tasks.dedup.minhash import fmix

_GRID = np.linspace(0.0, 1.0, 2001)
_BAND_SEED = np.uint64(0xD6E8FEB86659FD93)


def candidate_probability(s: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """Probability that two documents with Jaccard similarity ``s`` share at least one band."""
    return 1.0 - (1.0 - np.asarray(s, dtype=np.float64) ** rows) ** bands


def _areas(threshold: float, bands: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false-positive area below threshold, false-negative area above) for each (band, row) choice."""
    p = candidate_probability(_GRID[None, :], bands[:, None], rows[:, None])
    below = _GRID <= threshold
    fp = np.trapezoid(np.where(below, p, 0.0), _GRID, axis=1)
    fn = np.trapezoid(np.where(~below, 1.0 - p, 0.0), _GRID, axis=1)
    return fp, fn


@functools.lru_cache(maxsize=64)  # pure; the search costs ~0.1 s
def choose_bands(
    threshold: float,
    num_perm: int,
    false_positive_weight: float = 0.5,
    false_negative_weight: float = 0.5,
    max_miss: float = 0.005,
) -> tuple[int, int]:
    """(bands, rows) minimising weighted fp/fn areas with P(candidate | threshold) ≥ 1 − max_miss."""
    choices = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)])
    # Only feasible choices get their areas computed (the areas cost 2001 points each).
    choices = choices[candidate_probability(threshold, choices[:, 0], choices[:, 1]) >= 1.0 - max_miss]
    if not len(choices):
        raise ValueError(
            f"no bands × rows with {num_perm} permutations miss fewer than {max_miss} of pairs at "
            f"{threshold}; raise dedup.num_perm or dedup.max_miss_at_threshold"
        )
    bands, rows = choices[:, 0], choices[:, 1]
    fp, fn = _areas(threshold, bands, rows)
    error = false_positive_weight * fp + false_negative_weight * fn
    best = int(np.argmin(error))  # first minimum: fewest bands among ties, deterministic
    return int(bands[best]), int(rows[best])


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(D, bands) uint64 keys: a hash of each band's values mixed with the band's index.

    Equal bands give equal keys; different bands collide with probability ~2⁻⁶⁴, which only
    adds a candidate that verification rejects.
    """
    n_docs = len(signatures)
    banded = signatures[:, : bands * rows].reshape(n_docs, bands, rows)
    keys = np.broadcast_to(np.arange(bands, dtype=np.uint64) * _BAND_SEED, (n_docs, bands)).copy()
    for j in range(rows):  # one (D, bands) column at a time: no uint64 copy of every signature
        keys ^= banded[:, :, j]
        keys *= np.uint64(0x9E3779B97F4A7C15)
        keys ^= keys >> np.uint64(29)
    return fmix(keys, 64)
