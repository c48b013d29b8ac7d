"""Signals: a stop flag for preemption, and SIGTERM turned into an exception.

The handlers only set a flag or raise: no collectives and no I/O run inside them. The training loop
checks the flag at step boundaries, agrees on it across ranks, and checkpoints there.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch

from scalelab.runtime import dist


class StopFlag:
    """Set by a signal handler; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def arm(self, *signums: int) -> StopFlag:
        for signum in signums:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    def everywhere(self, device: torch.device) -> bool:
        """True on every rank once any rank got the signal (a one-element all-reduce)."""
        return dist.any_rank(self.signal is not None, device.type)


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM, so that the run is marked KILLED, not left RUNNING."""


def raise_on_sigterm() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        # one shot: torchrun forwards SIGTERM again, and a repeat must not interrupt the final
        # flush and status update (torchrun sends SIGKILL 30 s later; finishing takes <= ~20 s)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)


REQUEUE_DEADLINE_S = 300.0  # how long a preempted task waits for SLURM to end it for the requeue


class NotRequeued(RuntimeError):
    """A preempted task was not ended by its requeue within the deadline."""


def wait_for_requeue(deadline_s: float = REQUEUE_DEADLINE_S) -> None:
    """A preempted SLURM task whose checkpoint is on disk waits for the requeue to end it: SLURM's
    SIGTERM (sent to every task of a requeued job) ends the wait at once, with `Terminated`; no
    SIGTERM within `deadline_s` raises NotRequeued (no stale result is returned either way)."""
    import threading

    requeued = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: requeued.set())
    if requeued.wait(deadline_s):
        raise Terminated(128 + signal.SIGTERM)
    raise NotRequeued(f"preempted, but the job was not requeued within {deadline_s:.0f} s")
