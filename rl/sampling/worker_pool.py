"""The multiprocess sampler's worker processes, seen from the main process.

:class:`WorkerPool` starts the worker processes (each running
:func:`~rl.sampling.mp_worker.worker_main`), sends them commands and collects their replies.
Faults never hang: it waits on the pipes and the process sentinels together, so a worker that
dies (killed, segfault, ``os._exit``) is noticed at once; an environment that raises sends its
traceback. Both stop every worker and raise :class:`SamplerWorkerError` naming the worker, the
global environment index and the original traceback. A live worker that does not reply is
a hang (:class:`~rl.utils.deadline.Deadline`): a warning names it (its pid and environments)
once half of the timeout has passed, and the timeout ends it with the same kind of error.
:meth:`WorkerPool.close` (also run by the garbage collector and at interpreter exit) stops
every worker with :func:`stop_workers`, escalating to SIGTERM and SIGKILL after short grace
periods.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import signal
import time
import weakref
from collections.abc import Sequence
from typing import Any, NoReturn

from rl.sampling.mp_worker import CLOSE, worker_main
from rl.utils.deadline import Deadline
from rl.utils.processes import end_processes

__all__ = ["SamplerWorkerError", "WorkerPool", "exit_reason", "stop_workers"]

log = logging.getLogger(__name__)

_DEAD = object()  # marks a pipe closed by a dead worker


class SamplerWorkerError(RuntimeError):
    """A sampler worker failed: an environment raised, or the process died.

    Attributes:
        worker_index: Index of the worker process.
        env_index: Global index of the environment that raised (None if unknown, e.g. a
            worker that died).
    """

    def __init__(self, message: str, *, worker_index: int, env_index: int | None) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_index = env_index


class WorkerPool:
    """Sampler worker processes: start them, send commands, gather replies, stop them.

    Args:
        ctx: The multiprocessing context to start the workers with.
        env_ranges: ``(first, last)`` global environment indices of each worker (for error
            messages).
    """

    def __init__(self, ctx: Any, env_ranges: Sequence[tuple[int, int]]) -> None:
        self.ctx = ctx
        self.env_ranges = list(env_ranges)
        self.processes: list[mp.process.BaseProcess] = []
        self.conns: list[mpc.Connection] = []
        self.pids: list[int | None] = []
        self.closed = False
        self._finalizer = weakref.finalize(self, stop_workers, self.processes, self.conns, 2.0)

    def start(self, worker_args: Sequence[tuple[Any, ...]], timeout: float) -> None:
        """Start each worker ``w`` as ``worker_main(w, conn, *worker_args[w])``; await them all.

        On any failure (or Ctrl-C) every worker started so far is stopped before re-raising.

        Args:
            worker_args: Per worker, the arguments of :func:`worker_main` after the pipe.
            timeout: Seconds allowed for the workers to build their environments.
        """
        try:
            for w, args in enumerate(worker_args):
                parent, child = self.ctx.Pipe(duplex=True)
                proc = self.ctx.Process(
                    target=worker_main,
                    name=f"rl-sampler-{w}",
                    args=(w, child, *args),
                    daemon=True,
                )
                proc.start()
                child.close()
                self.processes.append(proc)
                self.pids.append(proc.pid)
                self.conns.append(parent)
            self.gather(range(len(worker_args)), timeout, "starting")
        except BaseException:
            self.close()
            raise

    def broadcast(self, workers: Sequence[int], cmd: bytes) -> None:
        """Send the one-byte command ``cmd`` to each of ``workers``."""
        for w in workers:
            try:
                self.conns[w].send_bytes(cmd)
            except (BrokenPipeError, OSError):
                pass  # dead: gather reports it through the sentinel

    def send(self, w: int, cmd: bytes, payload: Any) -> None:
        """Send worker ``w`` the command ``cmd`` followed by the pickled ``payload``."""
        try:
            self.conns[w].send_bytes(cmd)
            self.conns[w].send(payload)
        except (BrokenPipeError, OSError):
            pass  # dead: gather reports it through the sentinel

    def gather(self, workers: Sequence[int], timeout: float | None, what: str) -> list[Any]:
        """Collect one reply from each of ``workers`` (in worker order); fail fast on death.

        Waits on the pipes and the process sentinels together, so a worker that dies is
        reported as soon as the operating system reaps it, not after a timeout. A live worker
        silent for half of ``timeout`` is named in a warning (once per call).

        Args:
            workers: The workers to hear from.
            timeout: Seconds to wait for all replies (None: as long as the workers live).
            what: What the workers are doing, for error messages (``"stepping"``).

        Returns:
            The replies, in the order of ``workers``.

        Raises:
            SamplerWorkerError: A worker replied with an error, died, or did not reply in time
                (every worker is stopped first).
        """
        replies: dict[int, Any] = {}
        pending = {w: self.conns[w] for w in workers}
        deadline = Deadline(timeout)
        while pending:
            now = time.monotonic()
            if deadline.should_warn(now):
                log.warning(
                    "no reply for %.1f s while %s from %s; it counts as hung after %s s "
                    "(sampler.timeout)",
                    deadline.elapsed(now),
                    what,
                    ", ".join(self._label(w) for w in pending),
                    timeout,
                )
            sentinels = {self.processes[w].sentinel: w for w in pending}
            ready = set(mpc.wait([*pending.values(), *sentinels], deadline.seconds_left(now)))
            if not ready and deadline.expired():
                late = ", ".join(self._label(w) for w in pending)
                self._fail(
                    f"no reply within {timeout} s while {what} from {late} (hung? "
                    "sampler.timeout)",
                    next(iter(pending)),
                    None,
                )
            for w in [w for w, c in pending.items() if c in ready]:
                try:
                    msg = pending[w].recv()
                except (EOFError, OSError):
                    msg = _DEAD
                if msg is _DEAD:
                    self._died(w, what)
                del pending[w]
                replies[w] = self._handle(w, msg, what)
            for sentinel in ready.intersection(sentinels):
                w = sentinels[sentinel]
                if w in pending and not self._poll(pending[w]):
                    self._died(w, what)
        return [replies[w] for w in workers]

    def close(self) -> None:
        """Stop every worker (idempotent; never hangs: SIGTERM, then SIGKILL)."""
        if self.closed:
            return
        self.closed = True
        self._finalizer()

    def _fail(self, message: str, worker: int, env_index: int | None) -> NoReturn:
        self.close()
        raise SamplerWorkerError(message, worker_index=worker, env_index=env_index)

    def _label(self, w: int) -> str:
        lo, hi = self.env_ranges[w]
        envs = f"environment {lo}" if lo == hi else f"environments {lo}..{hi}"
        return f"sampler worker {w} (pid {self.pids[w]}, {envs})"

    def _handle(self, w: int, msg: Any, what: str) -> Any:
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            _, env_index, tb = msg
            where = (
                f"environment {env_index} raised"
                if env_index is not None
                else "failed while building its environments"
                if what == "starting"
                else "failed"
            )
            self._fail(
                f"{self._label(w)}: {where} while {what}; original traceback:\n{tb.rstrip()}",
                w,
                env_index,
            )
        return msg

    def _died(self, w: int, what: str) -> NoReturn:
        proc = self.processes[w]
        proc.join(1.0)
        self._fail(f"{self._label(w)} {exit_reason(proc.exitcode)} while {what}", w, None)

    @staticmethod
    def _poll(conn: mpc.Connection) -> bool:
        try:
            return conn.poll()
        except (EOFError, OSError):
            return False


def stop_workers(
    processes: Sequence[mp.process.BaseProcess], conns: Sequence[mpc.Connection], grace: float
) -> None:
    """Ask every worker to close, then SIGTERM and SIGKILL the ones still alive; reap all."""
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.send_bytes(CLOSE)
    end_processes(processes, grace)
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()


def exit_reason(exitcode: int | None) -> str:
    """How a worker ended, for error messages (``died with SIGKILL``, ``exited with code 1``)."""
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died with {name}"
    return f"exited with code {exitcode}"
