"""The rule of every hang watchdog here: a warning at half of a call's budget, then the end.

Child processes (:meth:`~rl.utils.processes.ChildProcesses.gather`), collection workers
(:class:`~rl.collection.worker_calls.WorkerCalls`) and their rollouts in flight each wait on
processes that may hang; a serial sampler's environments are watched from a thread
(:class:`~rl.sampling.watchdog.Watchdog`). Each keeps a :class:`Deadline` per call and asks it
when to wake (:meth:`Deadline.seconds_left`), whether the warning naming the late worker is due
(:meth:`Deadline.should_warn`, once) and whether the call counts as hung
(:meth:`Deadline.expired`); what to say and what to raise is the caller's.
"""

from __future__ import annotations

import time

__all__ = ["WARN_FRACTION", "Deadline"]

# A warning names a worker that has not answered once this fraction of its budget has passed.
WARN_FRACTION = 0.5


class Deadline:
    """One call's budget: a warning once :data:`WARN_FRACTION` of it has passed, then the end.

    Args:
        budget: Seconds the call may take (None: none: it never warns nor expires). A
            caller may raise it later (``deadline.budget = ...``), e.g. when a longer rollout
            was asked for meanwhile.
        start: When the call began (``time.monotonic()``; default: now).
    """

    def __init__(self, budget: float | None, start: float | None = None) -> None:
        self.budget = budget
        self.start = time.monotonic() if start is None else start
        self.warned = False

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the call began."""
        return (time.monotonic() if now is None else now) - self.start

    def seconds_left(self, now: float | None = None) -> float | None:
        """Seconds until the next event, the warning (until given) or the end; None: never."""
        if self.budget is None:
            return None
        fraction = 1.0 if self.warned else WARN_FRACTION
        return max(0.0, self.budget * fraction - self.elapsed(now))

    def should_warn(self, now: float | None = None) -> bool:
        """Whether the warning is due now; True once per deadline."""
        if self.budget is None or self.warned:
            return False
        if self.elapsed(now) >= WARN_FRACTION * self.budget:
            self.warned = True
            return True
        return False

    def expired(self, now: float | None = None) -> bool:
        """Whether the whole budget has passed (the call counts as hung)."""
        return self.budget is not None and self.elapsed(now) >= self.budget
