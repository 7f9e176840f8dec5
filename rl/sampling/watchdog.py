"""A hang watchdog for environments stepped in this process (serial and batched samplers).

A hung ``step`` in the calling thread would stall the run for good (and a SIGTERM's checkpoint,
taken at the next rollout boundary, would never come). A thread watches each guarded call: at
half the timeout it warns, at the timeout it sends ``SIGUSR2`` to the main thread, whose
handler raises :class:`SamplerTimeoutError`. That interrupts Python code and blocking calls that
release the GIL; C code holding the GIL cannot be (use ``sampler=multiprocess``). It watches
only from the main thread (where Python runs signal handlers), and nothing with ``timeout=None``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rl.utils.deadline import Deadline

log = logging.getLogger(__name__)

_SIGNAL = signal.SIGUSR2
# Far above a step of 16 environments that all reset (about 5 s for nav3d).
DEFAULT_TIMEOUT_S = 60.0


class SamplerTimeoutError(RuntimeError):
    """An environment stepped in this process took longer than the sampler's timeout."""


# One SIGUSR2 handler for all watchdogs, installed while any is open: it raises the message the
# firing watchdog left (a stray SIGUSR2 with no message does nothing).
_lock = threading.Lock()
_open = 0
_previous: Any = None
_message: list[str] = []


def _on_signal(signum: int, frame: Any) -> None:
    if _message:
        raise SamplerTimeoutError(_message.pop())


def _install() -> None:
    global _open, _previous
    with _lock:
        if _open == 0:
            _previous = signal.signal(_SIGNAL, _on_signal)
        _open += 1


def _uninstall() -> None:
    global _open
    with _lock:
        _open -= 1
        if _open == 0:
            with contextlib.suppress(ValueError, TypeError):  # not the main thread any more
                signal.signal(_SIGNAL, _previous)


class Watchdog:
    """Interrupts a guarded call of the main thread that runs longer than ``timeout`` seconds.

    Args:
        timeout: Seconds a guarded call may take (None: no watchdog).
        describe: What is running now, for messages (``environment 3 (PointNav-v0)``).
    """

    def __init__(self, timeout: float | None, describe: Callable[[], str]) -> None:
        self.timeout = timeout
        self._describe = describe
        self._deadline: Deadline | None = None  # the guarded call's (None: none running)
        self._what = ""
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.active = (
            timeout is not None
            and threading.current_thread() is threading.main_thread()
            and hasattr(signal, "pthread_kill")
        )
        if self.active:
            _install()
            self._main = threading.main_thread().ident
            self._thread = threading.Thread(
                target=self._watch, name="sampler-watchdog", daemon=True
            )
            self._thread.start()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Watch the block (``what``: ``stepping``, ``resetting``, for messages)."""
        if not self.active:
            yield
            return
        self._what = what
        self._deadline = Deadline(self.timeout)
        self._wake.set()
        try:
            yield
        finally:
            self._deadline = None

    def _watch(self) -> None:
        while not self._stopped:
            deadline = self._deadline
            if deadline is None:
                self._wake.wait()
                self._wake.clear()
                continue
            now = time.monotonic()
            if deadline.should_warn(now):
                log.warning(
                    "%s has been %s for %.0f s (the sampler's timeout is %.0f s)",
                    self._describe(), self._what, deadline.elapsed(now), self.timeout,
                )  # fmt: skip
            if deadline.expired(now):
                _message[:] = [
                    f"{self._describe()} took more than {self.timeout:g} s {self._what} (the "
                    "sampler's timeout): a hung environment; raise sampler.timeout if it is "
                    "just slow, or null to wait forever"
                ]
                self._deadline = None
                signal.pthread_kill(self._main, _SIGNAL)  # type: ignore[arg-type]
                continue
            time.sleep(0.1)

    def close(self) -> None:
        """Stop watching and restore the previous ``SIGUSR2`` handler."""
        if not self.active:
            return
        self.active = False
        self._stopped = True
        self._deadline = None
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        _uninstall()


__all__ = ["DEFAULT_TIMEOUT_S", "SamplerTimeoutError", "Watchdog"]
