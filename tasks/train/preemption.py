"""Stop at a step boundary with a final checkpoint when the scheduler asks (SIGUSR1).

Slurm sends SIGUSR1 ahead of a job's time limit (``--signal``, infra/launch/slurm.py) and
Kubernetes can be told to; the trainer then checkpoints the step it is on and exits cleanly, so
the next job resumes there instead of at the last periodic checkpoint. SIGTERM is left alone:
torchrun uses it to stop ranks for a restart, when a peer may already be gone and a collective
save would only hang.

Ranks receive the signal at slightly different moments, possibly on either side of a step
boundary, so they agree through one all-reduce (MAX) of the flag per step: all stop at the same step.
"""

from __future__ import annotations

import logging
import signal
import threading

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class StopRequest:
    """Records SIGUSR1 in this process; ``agreed()`` says, identically on every rank, whether any got it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = signal.signal(signal.SIGUSR1, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def agreed(self) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = bool(flag.item())
        if stop and not self.requested:
            self.requested = True
        return stop

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGUSR1, self._previous)
            self._previous = None
