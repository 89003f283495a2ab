"""Trainer callbacks: the points of a step where code outside the loop may act.

The trainer calls one ``Callbacks`` fan-out at each point, in the order a step meets them; every
hook is a no-op by default, so a callback implements only what it needs. Fault injection
(``tasks/train/faults.py``) is one such callback, given by the rank's entry point (tasks/train/main.py):
the trainer itself has no code for tests.
"""

from __future__ import annotations

import torch


class Callback:
    """Override any of these; arguments are what the hook needs, not the trainer (callbacks stay testable alone)."""

    def on_step_start(self, step: int, checkpointer) -> None:
        """Before ``step`` draws its batch."""

    def on_loss(self, step: int, loss: torch.Tensor, params) -> torch.Tensor:
        """After backward, before clipping: may replace this rank's loss share (and touch the gradients)."""
        return loss

    def on_step_end(self, step: int, compute_s: float) -> None:
        """After the optimizer step, before the step-end sync; ``compute_s`` is this rank's time so far."""

    def on_save_start(self, step: int) -> None:
        """Before the (possible) checkpoint save of an accepted step."""

    def on_save_end(self, step: int, started: bool, checkpointer) -> None:
        """After ``maybe_save``; ``started`` says whether a save began."""

    def on_snapshot(self, step: int, snapshots) -> None:
        """Just after the in-memory snapshot of ``step`` started (its copy and replication in flight)."""

    def on_checkpoint_written(self, step: int) -> None:
        """This rank's files of the step-``step`` checkpoint are on storage, its manifest not yet written
        (on the checkpointer's commit thread, not the training loop's)."""


class Callbacks(Callback):
    """Calls each callback in turn (``on_loss`` threads the loss through them)."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = list(callbacks)

    def on_step_start(self, step: int, checkpointer) -> None:
        for cb in self.callbacks:
            cb.on_step_start(step, checkpointer)

    def on_loss(self, step: int, loss: torch.Tensor, params) -> torch.Tensor:
        for cb in self.callbacks:
            loss = cb.on_loss(step, loss, params)
        return loss

    def on_step_end(self, step: int, compute_s: float) -> None:
        for cb in self.callbacks:
            cb.on_step_end(step, compute_s)

    def on_save_start(self, step: int) -> None:
        for cb in self.callbacks:
            cb.on_save_start(step)

    def on_save_end(self, step: int, started: bool, checkpointer) -> None:
        for cb in self.callbacks:
            cb.on_save_end(step, started, checkpointer)

    def on_snapshot(self, step: int, snapshots) -> None:
        for cb in self.callbacks:
            cb.on_snapshot(step, snapshots)

    def on_checkpoint_written(self, step: int) -> None:
        for cb in self.callbacks:
            cb.on_checkpoint_written(step)
