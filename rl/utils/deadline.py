"""The rule of every hang watchdog here: a warning at half of a call's budget, then the end.

What to say and what to raise is the caller's.
"""

from __future__ import annotations

import time

WARN_FRACTION = 0.5


class Deadline:
    """One call's budget in seconds: a warning once :data:`WARN_FRACTION` of it has passed.

    ``budget`` None never warns nor expires (a caller may set it later).
    """

    def __init__(self, budget: float | None) -> None:
        self.budget = budget
        self.start = time.monotonic()
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
