"""Deterministic, elastic token loader (docs/design.md §4): the order of samples is a pure function of
(seed, epoch, sample index), and the loader's whole state is the number of samples consumed.

Vocabulary and the rules every part below keeps:

- *stream*: the concatenation, in shard-name order, of one tokens dataset's shards of one split.
- *sample*: window ``s`` of a stream, tokens ``[s*seq_len, s*seq_len + seq_len + 1)``. Windows step by
  ``seq_len`` and overlap by one token, so every token is a target exactly once per epoch; a stream
  of T tokens holds ``(T - 1) // seq_len`` samples (the tail that does not fill a window is unused
  in that epoch). Windows cross document and shard boundaries; EOS tokens separate documents.
- *global sample index* ``i``: position in the run's sample sequence. Global batch ``g`` is indices
  ``[g*global_batch, (g+1)*global_batch)``; data-parallel rank ``r`` of ``d`` takes the contiguous
  slice ``[r*b, (r+1)*b)`` of it with ``b = global_batch // d``. Any world size therefore resumes at
  exactly the next sample: nothing about the order depends on ``d``.
- *mixture*: index ``i`` is routed to a dataset by a deterministic interleave (``_route``), which
  also tells which draw ``j`` of that dataset it is. Draw ``j`` of a dataset with ``n`` samples is
  sample ``permute(j % n)`` of epoch ``j // n``, where ``permute`` is a seeded Feistel bijection on
  ``[0, n)``: no permutation is ever materialised (a few cached blocks of 8,192 draws per
  dataset, 64 KiB each), so memory does not grow with the number of samples.

Streams (``TokenStream``, ``tasks/token_shards.py``) read shards through ``np.memmap``, each verified against its manifest when
first mapped; shards of remote datasets are first copied (hashed on the way) into a local cache
directory, whose copies are verified too. A background thread keeps ``prefetch`` batches ready.
Nothing here needs torch.distributed: callers pass their data-parallel rank and size.
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import threading
from dataclasses import dataclass

import numpy as np

from tasks.errors import UserError
from tasks.token_shards import TokenStream

log = logging.getLogger(__name__)

# Mixture routing uses integer arithmetic so every machine routes identically: weights are
# quantised to 1/2**_WEIGHT_BITS and global sample indices stay below 2**(63 - _WEIGHT_BITS).
_WEIGHT_BITS = 24
_MAX_SAMPLES = 1 << (63 - _WEIGHT_BITS)
_FEISTEL_ROUNDS = 6
_U64 = np.uint64


# --------------------------------------------------------------------------------------------
# Pure functions of (seed, epoch, index): the whole order lives here.


def _key(*parts: object) -> int:
    """A 64-bit key from any labels (seed, dataset name, epoch, round), stable across machines."""
    blob = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic): a cheap, well-spread hash."""
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def permute(index: np.ndarray, n: int, key: int) -> np.ndarray:
    """A seeded bijection of ``[0, n)``: a balanced Feistel network on the next even power of two,
    cycle-walked back into range (each value is re-encrypted until it lands below ``n``)."""
    index = np.asarray(index, dtype=np.uint64)
    if n <= 1:
        return np.zeros_like(index)
    bits = max(2, math.ceil(math.log2(n)))
    bits += bits % 2
    half = _U64(bits // 2)
    mask = _U64((1 << (bits // 2)) - 1)
    round_keys = [_U64(_key(key, r)) for r in range(_FEISTEL_ROUNDS)]

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for k in round_keys:
            left, right = right, left ^ (_mix64(right + k) & mask)
        return (left << half) | right

    out = encrypt(index)
    outside = out >= _U64(n)
    while outside.any():
        out[outside] = encrypt(out[outside])
        outside = out >= _U64(n)
    return out


@dataclass(frozen=True)
class _Split:
    """One node of the mixture chain: send a share ``q / 2**_WEIGHT_BITS`` of what reaches it to one
    dataset, the rest onward. ``phase`` (seeded) shifts where in the period the picks fall."""

    q: int
    phase: int


def _chain(weights: list[float], seed: int) -> list[_Split]:
    splits, rest = [], sum(weights)
    scale = 1 << _WEIGHT_BITS
    for k, w in enumerate(weights[:-1]):
        splits.append(_Split(q=round(scale * w / rest), phase=_key("mixture", seed, k) % scale))
        rest -= w
    return splits


def _route(index: np.ndarray, chain: list[_Split]) -> tuple[np.ndarray, np.ndarray]:
    """(dataset, draw) for each global sample index: a deterministic interleave with exact shares.

    Node k takes item m of those reaching it iff floor((m+1)q + phase) > floor(m q + phase)
    (Bresenham), so after M items it has taken floor(M q + phase) of them: every dataset's count
    stays within one sample of its weight per node, at any prefix, with no scan of the past.
    The draw number within the dataset (or onward node) follows from the same floor count.
    """
    m = np.asarray(index, dtype=np.uint64).copy()
    dataset = np.full(m.shape, len(chain), dtype=np.int64)
    draw = np.zeros(m.shape, dtype=np.uint64)
    open_ = np.ones(m.shape, dtype=bool)
    shift = _U64(_WEIGHT_BITS)
    for k, node in enumerate(chain):
        q, phase = _U64(node.q), _U64(node.phase)
        before = (m * q + phase) >> shift
        after = ((m + _U64(1)) * q + phase) >> shift
        taken = open_ & (after > before)
        dataset[taken] = k
        draw[taken] = before[taken]
        m = np.where(taken, m, m - before)
        open_ &= ~taken
    draw[open_] = m[open_]
    return dataset, draw


class _SampleOrder:
    """Draw ``j`` of one dataset -> its sample: ``permute(j % n)`` keyed by (seed, dataset, epoch).

    Permutes whole blocks of draws at once and keeps the last few, because numpy's per-call cost
    dominates a batch-sized permutation; the result is the same pure function either way.
    """

    KEEP = 4

    def __init__(self, samples: int, seed: int, name: str, block: int = 8192) -> None:
        self.samples, self.seed, self.name = samples, seed, name
        self.block = min(block, samples)  # a block spans at most two epochs
        self._blocks: dict[int, np.ndarray] = {}

    def _block(self, b: int) -> np.ndarray:
        if b not in self._blocks:
            draws = np.arange(b * self.block, (b + 1) * self.block, dtype=np.uint64)
            epoch, position = np.divmod(draws, _U64(self.samples))
            block = np.empty_like(position)
            for e in np.unique(epoch).tolist():
                at = epoch == e
                block[at] = permute(position[at], self.samples, _key(self.seed, self.name, e))
            if len(self._blocks) >= self.KEEP:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[b] = block
        return self._blocks[b]

    def __call__(self, draws: np.ndarray) -> np.ndarray:
        block, within = np.divmod(draws, _U64(self.block))
        out = np.empty_like(draws)
        for b in np.unique(block).tolist():
            at = block == b
            out[at] = self._block(b)[within[at].astype(np.int64)]
        return out


class SampleSources:
    """(dataset, sample) of global sample indices, reading no token: the loader draws its windows through
    it and ``smelt trace`` (tasks/trace) maps a trained sequence back to its documents with it, so the two
    cannot disagree. ``samples[k]`` is dataset ``names[k]``'s sample count, ``weights`` its normalised weight."""

    def __init__(self, names: list[str], weights: dict[str, float], samples: list[int], seed: int) -> None:
        self._chain = _chain([weights[n] for n in names], seed)
        self._orders = [_SampleOrder(n_samples, seed, name) for name, n_samples in zip(names, samples)]

    def __call__(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset number, sample within that dataset's stream) per index, both int64."""
        which, draw = _route(np.asarray(index, dtype=np.uint64), self._chain)
        sample = np.zeros(len(draw), dtype=np.int64)
        for k, order in enumerate(self._orders):
            rows = np.flatnonzero(which == k)
            if rows.size:
                sample[rows] = order(draw[rows]).astype(np.int64)
        return which, sample


# --------------------------------------------------------------------------------------------
# The loader.


class TokenLoader:
    """This rank's slice of each global batch of ``(inputs, targets)``, in a resumable order.

    ``datasets`` maps a name to a tokens dataset URL (one entry: no mixture). ``weights`` maps the
    same names to positive weights (normalised here); None weights each dataset by its sample count
    (each is then used up at the same pace). All datasets must share one tokenizer (same vocab and
    special ids). ``batch_at`` is not thread-safe: with ``prefetch > 0`` only the prefetch thread calls it.
    """

    def __init__(
        self,
        datasets: dict[str, str],
        weights: dict[str, float] | None,
        *,
        split: str,
        seq_len: int,
        global_batch: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        prefetch: int = 2,
        cache_dir: str | None = None,
    ) -> None:
        if not datasets:
            raise UserError("the loader needs at least one tokens dataset (name -> URL)")
        if seq_len < 1 or global_batch < 1:
            raise ValueError(f"seq_len ({seq_len}) and global_batch ({global_batch}) must be positive")
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size) with dp_size ({dp_size}) >= 1")
        if global_batch % dp_size:
            raise ValueError(
                f"global_batch ({global_batch}) must be divisible by the data-parallel size ({dp_size}); "
                "change data.global_batch or the number of data-parallel ranks"
            )
        self.names = sorted(datasets)
        self.urls = {n: datasets[n] for n in self.names}
        self.split, self.seq_len, self.global_batch, self.seed = split, seq_len, global_batch, seed
        self.dp_rank, self.dp_size, self.prefetch = dp_rank, dp_size, prefetch
        self.local_batch = global_batch // dp_size
        self._streams = [TokenStream(datasets[n], split, seq_len, cache_dir) for n in self.names]
        self._check_same_tokenizer()
        self.weights = self._normalised_weights(weights)
        self.sources = SampleSources(self.names, self.weights, [st.samples for st in self._streams], seed)
        self._samples_consumed = 0
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- identity and state ------------------------------------------------------------------

    def _check_same_tokenizer(self) -> None:
        keys = ("vocab_size", "eos_id", "bos_id", "pad_id")
        first = {k: self._streams[0].meta.get(k) for k in keys}
        for name, stream in zip(self.names, self._streams):
            other = {k: stream.meta.get(k) for k in keys}
            if other != first:
                raise ValueError(
                    f"tokens dataset {name!r} was made with a different tokenizer ({other} vs {first}); "
                    "tokenize every dataset of a mixture with the same tokenizer"
                )

    def _normalised_weights(self, weights: dict[str, float] | None) -> dict[str, float]:
        if weights is None:
            weights = {n: float(s.samples) for n, s in zip(self.names, self._streams)}
        if sorted(weights) != self.names:
            raise UserError(f"mixture weights name {sorted(weights)} but the datasets are {self.names}; use the same names")
        bad = [n for n, w in weights.items() if not (w > 0 and math.isfinite(w))]
        if bad:
            raise UserError(f"mixture weight of {bad[0]!r} must be a positive number, got {weights[bad[0]]!r}")
        total = sum(weights.values())
        return {n: round(weights[n] / total, 12) for n in self.names}

    @property
    def vocab_size(self) -> int:
        return int(self._streams[0].meta["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self._streams[0].meta["eos_id"])

    @property
    def samples_consumed(self) -> int:
        return self._samples_consumed

    @property
    def tokens_per_step(self) -> int:
        """Target tokens per optimizer step over all ranks (``global_batch * seq_len``)."""
        return self.global_batch * self.seq_len

    def _identity(self) -> dict:
        return {
            "datasets": {n: s.fingerprint for n, s in zip(self.names, self._streams)},
            "weights": dict(self.weights),
            "split": self.split,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "seed": self.seed,
        }

    def order(self) -> dict:
        """Everything that maps a global sample index to its tokens: ``SampleSources``' arguments, the
        datasets and the window length (``lineage.json`` in a run folder; read by tasks/trace)."""
        return {
            "datasets": dict(self.urls),
            "names": list(self.names),
            "weights": dict(self.weights),
            "samples": [int(s.samples) for s in self._streams],
            "fingerprints": {n: s.fingerprint for n, s in zip(self.names, self._streams)},
            "split": self.split,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "seed": self.seed,
        }

    def state_dict(self) -> dict:
        """Samples consumed plus what must not change on resume (the world size may)."""
        return {"samples_consumed": self._samples_consumed, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state["samples_consumed"]``; refuse if the data or the batch contract changed."""
        for key, now in self._identity().items():
            if key not in state:
                raise ValueError(f"loader state has no {key!r}; it was not saved by TokenLoader.state_dict")
            if state[key] != now:
                raise ValueError(
                    f"loader state does not match this run: {key} changed (checkpoint {state[key]!r}, now {now!r}); "
                    "restore the original setting or start a fresh run"
                )
        consumed = int(state["samples_consumed"])
        if consumed < 0 or consumed >= _MAX_SAMPLES:
            raise ValueError(f"loader state has an invalid samples_consumed ({consumed})")
        self._stop_prefetch()
        self._samples_consumed = consumed

    # -- reading -------------------------------------------------------------------------------

    def batch_at(self, start: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        """This rank's slice of the global batch that begins at global sample index ``start``."""
        import torch  # here, not at the top: smelt trace maps samples (SampleSources) without torch's import

        first = start + self.dp_rank * self.local_batch
        index = np.arange(first, first + self.local_batch, dtype=np.uint64)
        which, sample = self.sources(index)
        windows = np.empty((self.local_batch, self.seq_len + 1), dtype=np.int64)
        for k, stream in enumerate(self._streams):
            rows = np.flatnonzero(which == k)
            if rows.size:
                part = np.empty((rows.size, self.seq_len + 1), dtype=np.int64)
                stream.read_windows(sample[rows] * self.seq_len, part)
                windows[rows] = part
        inputs = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
        targets = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
        return inputs, targets

    def next_batch(self) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(inputs, targets), each ``(global_batch // dp_size, seq_len)`` int64; advances one step."""
        if self._closed:
            raise RuntimeError("the loader is closed; build a new TokenLoader")
        start = self._samples_consumed
        if self.prefetch <= 0:
            batch = self.batch_at(start)
        else:
            if self._thread is None:
                self._start_prefetch()
            got_start, batch = self._queue.get()
            if isinstance(batch, BaseException):
                self._stop_prefetch()
                raise batch
            if got_start != start:  # only possible if the prefetch thread outlived a reset
                raise RuntimeError(f"prefetched batch at sample {got_start}, expected {start}")
        self._samples_consumed = start + self.global_batch
        return batch

    def _start_prefetch(self) -> None:
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._produce, args=(self._samples_consumed, self._queue, self._stop),
            name=f"token-prefetch-r{self.dp_rank}", daemon=True,
        )
        self._thread.start()

    def _produce(self, start: int, out: queue.Queue, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = (start, self.batch_at(start))
            except Exception as e:  # handed to the consumer, who raises it where the step can see it
                item = (start, e)
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item[1], BaseException):
                return
            start += self.global_batch

    def _stop_prefetch(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            log.warning("token prefetch thread did not stop within 30 s")
        self._thread = self._queue = self._stop = None

    def close(self) -> None:
        """Stop the prefetch thread and unmap the shards."""
        self._stop_prefetch()
        for stream in self._streams:
            stream.close()
        self._closed = True

    def __enter__(self) -> "TokenLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
