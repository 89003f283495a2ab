"""Per-sample losses: the mean loss of every sequence of every step, with its global sample index (issue 42).

What is written, beside ``metrics.jsonl`` in the run folder (any fsspec URL):

- ``sample_losses/part-<first step>-<last step>-r<rank>-<time ns>.parquet``: columns ``step``, ``sample`` (the global
  sample index, tasks/train/data.py) and ``loss`` (the sequence's mean per-token loss, fp32). Each rank that
  computes a loss writes its own data-parallel slice, so no collective is added to a step; one part per flush:
  at every checkpoint save (``on_save_end``) and every ``flush_steps`` steps. Steps tried more than once (a
  restart redoing them, a loss-guard rollback) leave rows for each try; readers keep those of the final
  trajectory (tasks/trace). A rank killed between flushes loses its unflushed rows; ``metrics.jsonl``, which
  carries each step's sample range (``samples``), stays the ledger's source.
- ``lineage.json`` (rank 0, at every start): the loader's order (datasets, normalised weights, sample counts,
  seq_len, global batch, seed), everything ``smelt trace`` needs to map a sample back to its tokens.

Cost: the per-token losses come from the loss's own softmax (``cross_entropy.token_cross_entropy``); a step
keeps one vector of ``local_batch`` floats on the device and copies nothing to the host until a flush.

Layouts: under pipeline parallelism only the last stage sees logits, so only its ranks record (each its
data-parallel slice); the schedule hands the loss a pipeline micro-batch's targets, a view of the micro-batch
this module was shown, whose storage offset gives its rows. Under tensor parallelism (``loss_parallel``) the
per-token losses are gathered across the vocabulary shards (B·T floats) and tensor rank 0 writes them.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import torch

from tasks import storage
from tasks.train.callbacks import Callback

log = logging.getLogger(__name__)

FOLDER = "sample_losses"
LINEAGE = "lineage.json"
FLUSH_STEPS = 500  # at most this many steps are held before a part is written, checkpoints or not


def write_lineage(run_dir: str, loader) -> dict:
    """``lineage.json``: how global sample indices map to datasets and windows (``TokenLoader.order``)."""
    record = loader.order()
    with storage.atomic_write(storage.join(storage.normalize_url(run_dir), LINEAGE), "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True))
    return record


class SampleLosses(Callback):
    """Collects this rank's per-sequence losses step by step and writes them in parts (module docstring).

    ``records``: whether this rank computes the loss it should record (last pipeline stage, tensor rank 0);
    ``first_row``: this data-parallel rank's offset in the global batch (``dp_rank × local_batch``)."""

    def __init__(self, run_dir: str, *, rank: int, records: bool, first_row: int, flush_steps: int = FLUSH_STEPS) -> None:
        self.dir = storage.join(storage.normalize_url(run_dir), FOLDER)
        self.rank, self.records, self.first_row, self.flush_steps = rank, records, first_row, flush_steps
        self.enabled = True
        self._pending: list[tuple[int, int, torch.Tensor]] = []  # (step, first sample, per-sequence losses)
        self._steps: set[int] = set()
        self._step = self._first = self._cursor = self._base_row = 0
        self._base: torch.Tensor | None = None

    # -- the step ----------------------------------------------------------------------------------

    def begin_step(self, step: int, batch_start: int) -> None:
        """Step ``step`` trains the global batch starting at sample ``batch_start``."""
        if len(self._steps) >= self.flush_steps:
            self.flush()
        self._step, self._first, self._cursor, self._base = step, batch_start + self.first_row, 0, None

    def micro_batch(self, targets: torch.Tensor, row: int) -> None:
        """The next micro-batch's targets start at row ``row`` of this rank's slice."""
        self._base, self._base_row, self._cursor = targets, row, row

    def add(self, targets: torch.Tensor, per_token: torch.Tensor) -> None:
        """Record the sequences of ``targets`` (B, T) from their per-token losses (B·T,)."""
        if not (self.records and self.enabled):
            return
        rows = targets.shape[0]
        row = self._cursor
        base = self._base
        if base is not None and targets.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
            row = self._base_row + (targets.storage_offset() - base.storage_offset()) // base.stride(0)
        self._cursor = row + rows
        self._pending.append((self._step, self._first + row, per_token.detach().view(rows, -1).mean(1)))
        self._steps.add(self._step)

    # -- writing -----------------------------------------------------------------------------------

    def on_save_end(self, step: int, started: bool, checkpointer) -> None:
        if started:
            self.flush()

    def flush(self) -> None:
        """Write what is held as one part (one device-to-host copy)."""
        if not self._pending:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        losses = torch.cat([p[2] for p in self._pending]).float().cpu().numpy()
        steps = np.concatenate([np.full(len(p[2]), p[0], dtype=np.int64) for p in self._pending])
        samples = np.concatenate([np.arange(p[1], p[1] + len(p[2]), dtype=np.int64) for p in self._pending])
        first, last = int(steps.min()), int(steps.max())
        table = pa.table({"step": steps, "sample": samples, "loss": losses})
        name = f"part-{first:08d}-{last:08d}-r{self.rank:05d}-{time.time_ns():020d}.parquet"  # steps first: readers pick by name
        with storage.atomic_write(storage.join(self.dir, name)) as f:
            pq.write_table(table, f, compression="zstd")
        self._pending.clear()
        self._steps.clear()
