"""Schedules ``schedule(env_steps) -> float`` (AllenAct's ``LinearDecay`` semantics).

The LR (a ``LambdaLR`` stepped *to* the env-step count), PPO's clip and teacher forcing use them.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Schedule(Protocol):
    """A scalar as a function of env steps."""

    def __call__(self, steps: int) -> float:
        """Value at ``steps`` env steps."""
        ...


class LinearDecay:
    """Linearly move from ``startp`` to ``endp`` over ``steps`` env steps, then stay at ``endp``.

    Args:
        steps: Number of env steps over which the value changes (> 0).
        startp: Value at step 0.
        endp: Value at ``steps`` and after.
    """

    def __init__(self, *, steps: int, startp: float = 1.0, endp: float = 0.0) -> None:
        if steps <= 0:
            raise ValueError(f"LinearDecay.steps must be positive, got {steps}")
        self.steps = int(steps)
        self.startp = float(startp)
        self.endp = float(endp)

    def __call__(self, steps: int) -> float:
        """Value at ``steps`` env steps."""
        frac = min(max(steps, 0) / self.steps, 1.0)
        return self.startp + (self.endp - self.startp) * frac

    def __repr__(self) -> str:
        return f"LinearDecay(steps={self.steps}, startp={self.startp}, endp={self.endp})"


class MultiLinearDecay:
    """:class:`LinearDecay` pieces in order, each starting where the last one ended.

    After the last piece the value stays at its ``endp``.
    """

    def __init__(self, *, schedule: Sequence[LinearDecay]) -> None:
        self.schedule = list(schedule)
        if not self.schedule:
            raise ValueError("MultiLinearDecay.schedule must not be empty")
        self.bounds: list[int] = []
        total = 0
        for piece in self.schedule:
            total += piece.steps
            self.bounds.append(total)

    def __call__(self, steps: int) -> float:
        """Value at ``steps`` env steps."""
        idx = bisect.bisect_right(self.bounds, steps)
        if idx >= len(self.schedule):
            return self.schedule[-1].endp
        start = self.bounds[idx - 1] if idx > 0 else 0
        return self.schedule[idx](steps - start)


class ConstantSchedule:
    """A schedule that always returns ``value``."""

    def __init__(self, *, value: float) -> None:
        self.value = float(value)

    def __call__(self, steps: int) -> float:
        """Return the constant."""
        return self.value


def step_lr_scheduler_to(scheduler: torch.optim.lr_scheduler.LRScheduler, env_steps: int) -> None:
    """Set ``scheduler`` (a ``LambdaLR`` over env steps) to the value at ``env_steps``.

    AllenAct's deprecated ``scheduler.step(epoch=env_steps)``.
    """
    scheduler.last_epoch = env_steps - 1
    with warnings.catch_warnings():
        # Stepping to an env-step count is deliberate, not the "step before optimizer" mistake.
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
