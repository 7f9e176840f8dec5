"""Stopping training cleanly: signals, the agreement between ranks, exit codes.

SIGTERM, SIGUSR1 and a first Ctrl-C save a checkpoint at the end of the current rollout and stop
(:class:`TrainingStopped`); a second Ctrl-C or SIGTERM aborts at once (checkpoints are written
atomically, so the last one on disk stays valid). Under DDP every rank must leave the loop at the
same rollout: :class:`StopAgreement` folds the requests into the all-reduce each rollout makes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from rl.distributed.reduce import all_reduce_sum
from rl.distributed.setup import DistContext

log = logging.getLogger(__name__)

# Exit codes of train.py after a signal-triggered stop (a checkpoint has been saved).
EXIT_SIGTERM = 143  # 128 + SIGTERM, what a killed process reports: "stopped, not finished"
EXIT_REQUEUE = 3  # SIGUSR1: "checkpointed, requeue me" for a scheduler's requeue rule
EXIT_SIGINT = 130  # 128 + SIGINT (Ctrl-C)
_EXIT_CODES = {"SIGTERM": EXIT_SIGTERM, "SIGUSR1": EXIT_REQUEUE, "SIGINT": EXIT_SIGINT}

# Stop requests agreed across ranks: the highest code wins (4: any other reason).
_STOP_CODES = {"SIGINT": 1, "SIGTERM": 2, "SIGUSR1": 3}
_STOP_NAMES = {v: k for k, v in _STOP_CODES.items()}


class TrainingStopped(Exception):
    """Training stopped early on a signal, after saving a checkpoint.

    Attributes:
        reason: The signal's name (``SIGTERM``, ``SIGUSR1``, ``SIGINT``).
        exit_code: What ``train.py`` exits with (:data:`EXIT_SIGTERM` and the others).
        checkpoint: The checkpoint saved at the stop.
    """

    def __init__(self, reason: str, checkpoint: Path | None) -> None:
        self.reason = reason
        self.exit_code = _EXIT_CODES.get(reason, 1)
        self.checkpoint = checkpoint
        super().__init__(
            f"training stopped by {reason}; checkpoint {checkpoint} (resume with "
            f"resume={checkpoint.parent.parent if checkpoint else '<run dir>'})"
        )


class StopAgreement:
    """Stop requests of this rank, and the one every rank agreed on.

    Args:
        dist: This process's place among the ranks (None: one process, where a
            request is agreed at once).
    """

    def __init__(self, dist: DistContext | None = None) -> None:
        self.distributed = dist is not None and dist.enabled
        self.stop_reason: str | None = None  # this rank's request (the first one is kept)
        self.agreed: str | None = None

    def request_stop(self, reason: str) -> None:
        """Ask to stop (signal-safe; the first reason is kept)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    @property
    def stopping(self) -> bool:
        """Whether the loop ends now: a local request, or (distributed) an agreed one."""
        return (self.agreed if self.distributed else self.stop_reason) is not None

    def sync(self, local_steps: int, device: torch.device) -> int:
        """Global env steps of a rollout, agreeing on stop requests (one all-reduce).

        Args:
            local_steps: Env steps this rank collected.
            device: Where the collective's tensor lives (CUDA under nccl).
        """
        if not self.distributed:
            return local_steps
        code = _STOP_CODES.get(self.stop_reason, 4) if self.stop_reason else 0
        # [steps, how many ranks asked to stop with code 1, 2, 3, 4]; the highest code wins.
        requests = [float(code == c) for c in range(1, 5)]
        steps, *counts = all_reduce_sum([float(local_steps), *requests], device)
        asked = [c for c in range(1, 5) if counts[c - 1] > 0]
        if asked and self.agreed is None:
            self.agreed = _STOP_NAMES.get(max(asked), "SIGTERM")
        return int(round(steps))

    def settle(self) -> str | None:
        """The reason training stopped once the loop has ended (None: it finished).

        Distributed, a request that came after the last agreement is ignored (with a warning),
        so that every rank takes the same path.
        """
        if self.distributed and self.stop_reason != self.agreed:
            if self.stop_reason is not None:
                log.warning("%s arrived after training finished; ignored", self.stop_reason)
            self.stop_reason = self.agreed
        return self.stop_reason


class Stoppable(Protocol):
    """What :func:`stop_on_signals` drives (a :class:`StopAgreement`, or the trainer)."""

    @property
    def stop_reason(self) -> str | None:
        """Why training is stopping (None: it is not)."""
        ...

    def request_stop(self, reason: str) -> None:
        """Stop at the next rollout boundary, after saving a checkpoint."""
        ...


@contextlib.contextmanager
def stop_on_signals(trainer: Stoppable) -> Iterator[None]:
    """Within the block, SIGTERM / SIGUSR1 / SIGINT call ``trainer.request_stop(name)``.

    A second SIGINT raises ``KeyboardInterrupt``, a second SIGTERM ``SystemExit(143)``: abort
    without saving, as the rollout boundary may never come (a hung environment); the parts are
    closed on the way out. Handlers are installed only in the main thread, and the previous ones
    are restored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and trainer.stop_reason is not None:
            raise KeyboardInterrupt
        if name == "SIGTERM" and trainer.stop_reason is not None:
            os.write(2, b"\nSIGTERM again: exiting now without saving (the last checkpoint on "
                        b"disk is valid)\n")  # fmt: skip
            raise SystemExit(EXIT_SIGTERM)
        if trainer.stop_reason is None:
            hint = " (Ctrl-C again to abort without saving)" if name == "SIGINT" else ""
            # os.write is safe in a signal handler (logging and print may not be).
            os.write(
                2,
                f"\n{name}: saving a checkpoint after this rollout, then exiting{hint}\n".encode(),
            )
        trainer.request_stop(name)

    previous = {}
    try:
        for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
            if hasattr(signal, name):
                sig = getattr(signal, name)
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
