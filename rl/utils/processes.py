"""The one process runtime: every child process of a run started, called, watched and ended alike.

Each child serves one object built from plain arguments (sampler workers, collection workers,
the validation process). Calls go down a pipe as ``(call id, method, args)`` and come back as
``(call id, ok, value)``; rows of data go through :mod:`rl.utils.shared_memory` instead. The
parent waits on the pipes and the children's pidfds together, so a dead child is noticed at
once, and a child never outlives its parent. DDP ranks are started elsewhere
(:mod:`rl.distributed.launch`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import itertools
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import multiprocessing.util as mp_util
import os
import pickle
import queue
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NoReturn

import torch

from rl.utils.deadline import Deadline

log = logging.getLogger(__name__)

_START = -1  # call id of a child's start (its object built)
_DEAD = -2  # key of a dead child's result: the result of every call still pending
_CLOSE = -3  # call id of the close sent while ending the children (its reply is not read)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# ------------------------------------------------------------------------- start methods
def resolve_start_method(method: str | None, key: str = "mp_start_method") -> str:
    """``method`` (None: ``forkserver``) if available; a missing ``forkserver`` is ``spawn``.

    Another missing method is a ValueError naming the setting ``key``.
    """
    method = method or "forkserver"
    available = mp.get_all_start_methods()
    if method in available:
        return method
    if method == "forkserver":
        log.info("start method 'forkserver' is not available here; using 'spawn'")
        return "spawn"
    raise ValueError(f"{key}={method!r} is not available (have {available})")


def process_context(method: str | None, preload: Sequence[str] = ()) -> Any:
    """The ``multiprocessing`` context for ``method``; a fork server imports ``preload`` once."""
    resolved = resolve_start_method(method)
    context = mp.get_context(resolved)
    if resolved == "forkserver" and preload:
        context.set_forkserver_preload(list(preload))
    return context


# ------------------------------------------------------------------------------- messages
class _ByValue(pickle.Pickler):
    """Pickles CPU tensors (of a NumPy dtype, outside autograd) by value, as NumPy arrays.

    A pipe's own pickler sends a shared-memory handle, a file descriptor round trip per tensor
    (about 7 ms per update for a small policy's weights, against well under 1 ms by value).
    """

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and not obj.requires_grad
            and obj.dtype in _NUMPY_DTYPES
        ):
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


_NUMPY_DTYPES = frozenset(
    {
        torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    }
)  # fmt: skip


def send(conn: mpc.Connection, obj: Any) -> None:
    """Send ``obj`` through a pipe, its CPU tensors by value (:class:`_ByValue`)."""
    buffer = io.BytesIO()
    _ByValue(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    conn.send_bytes(buffer.getbuffer())


def receive_from(conn: mpc.Connection) -> Any:
    """What :func:`send` sent."""
    return pickle.loads(conn.recv_bytes())


# --------------------------------------------------------------------------- the child
def die_with_parent(parent_pid: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent ends, even while busy; call it first thing.

    When the forking process is the parent (``parent_pid`` None or ours) the kernel does it
    (``PR_SET_PDEATHSIG``). A ``forkserver`` child watches ``parent_pid`` through a pidfd instead:
    a SIGTERM to the process group (the learner's signal to save and stop) ends the fork server
    at once, while its children must live on until closed. Without pidfds (Linux < 5.3) the
    fork server's end counts after all.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if parent_pid is None or parent_pid == os.getppid():
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if parent_pid is None or parent_pid == os.getppid():  # not ended in between
            return
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)  # the parent is gone already
    except (AttributeError, OSError):
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        return  # no pidfds (Linux < 5.3): the closed pipe still ends an idle child

    def watch() -> None:
        select.select([pidfd], [], [])  # readable once the parent process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


@dataclasses.dataclass(frozen=True)
class _Failure:
    """What a call that raised sends back: its traceback and where it failed (if known)."""

    traceback: str
    site: str | None = None
    site_index: int | None = None


def _failure(obj: Any) -> _Failure:
    """The exception being handled, with ``obj.failure_site()`` (``(words, index)``) if any."""
    text = traceback.format_exc()
    site = getattr(obj, "failure_site", None)
    if site is not None:
        with contextlib.suppress(Exception):
            words, index = site()
            return _Failure(text, words, index)
    return _Failure(text)


def serve(
    conn: mpc.Connection,
    factory: Callable[..., Any],
    kwargs: Mapping[str, Any],
    parent_pid: int,
    control: frozenset[str],
    ignored: tuple[int, ...],
    environment: Mapping[str, str] | None = None,
) -> None:
    """A child process's body: build ``factory(**kwargs)``, then run the calls that arrive.

    A call that raises answers with a :class:`_Failure` and the child serves on (its parent
    decides what a failure ends). The child ends after ``close``, when the pipe closes (closing
    the object first), or with its parent.
    """
    die_with_parent(parent_pid)
    os.environ.update(environment or {})
    for number in ignored:
        signal.signal(number, signal.SIG_IGN)
    send_lock = threading.Lock()

    def reply(call_id: int, ok: bool, value: Any) -> None:
        with send_lock:
            send(conn, (call_id, ok, value))

    try:
        obj = factory(**kwargs)
    except BaseException:
        with contextlib.suppress(OSError):
            reply(_START, False, _failure(None))
        return
    closed = False
    try:
        reply(_START, True, os.getpid())
        for call_id, method, args in _calls(conn, obj, control, reply):
            try:
                ok, value = True, _run(obj, method, args)
            except BaseException:
                ok, value = False, _failure(obj)
            closed = method == "close"
            try:
                reply(call_id, ok, value)
            except OSError:
                raise
            except BaseException:  # e.g. a result that does not pickle
                reply(call_id, False, _failure(obj))
            if closed:
                return
    except OSError:
        pass  # the parent is gone: nobody to reply to
    finally:
        if not closed:  # the parent went without closing the object
            with contextlib.suppress(Exception):
                _run(obj, "close", ())
        with contextlib.suppress(Exception):
            conn.close()


def _run(obj: Any, method: str, args: tuple[Any, ...]) -> Any:
    if method == "close" and not hasattr(obj, "close"):
        return None
    return getattr(obj, method)(*args)


def _calls(
    conn: mpc.Connection,
    obj: Any,
    control: frozenset[str],
    reply: Callable[[int, bool, Any], None],
) -> Any:
    """The calls to run in order: read here, or (with ``control`` methods) by a thread."""
    if not control:
        while True:
            try:
                yield receive_from(conn)
            except (EOFError, OSError):
                return  # the parent is gone
    calls: queue.Queue[tuple[int, str, tuple[Any, ...]] | None] = queue.Queue()

    def receive() -> None:
        try:
            while True:
                call_id, method, args = receive_from(conn)
                if method not in control:
                    calls.put((call_id, method, args))
                    continue
                try:
                    reply(call_id, True, _run(obj, method, args))
                except OSError:
                    raise
                except BaseException:
                    reply(call_id, False, _failure(obj))
        except (EOFError, OSError):
            calls.put(None)  # the parent is gone

    threading.Thread(target=receive, name="control-calls", daemon=True).start()
    while (item := calls.get()) is not None:
        yield item


# -------------------------------------------------------------------------- the parent
class ChildFailed(RuntimeError):
    """A child process failed: a call raised, the child died, or it did not answer in time.

    Attributes:
        child: Index of the child.
        site: Where the call raised, in the served object's words (``environment 3``; None:
            unknown, or the child died or hung), and ``site_index`` the index that goes with it.
        traceback: The call's traceback in the child (None if the child died or hung).
    """

    def __init__(
        self,
        message: str,
        *,
        child: int,
        site: str | None = None,
        site_index: int | None = None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.child = child
        self.site = site
        self.site_index = site_index
        self.traceback = traceback


class Call:
    """A handle on one call to a child (its result read with :meth:`ChildProcesses.result`)."""

    __slots__ = ("call_id", "child")

    def __init__(self, child: int, call_id: int) -> None:
        self.child, self.call_id = child, call_id

    def __repr__(self) -> str:
        return f"Call(child={self.child}, call_id={self.call_id})"


class ChildProcesses:
    """Child processes, each serving one object built from its arguments.

    ``forkserver`` by default, its server having imported the served class's module once: a
    child costs a fork, not an interpreter's imports.

    Args:
        factory: The served class (or function), importable by module and name.
        kwargs: Its keyword arguments, one mapping per child (picklable).
        name: The children's process names (``name-0``, ...) and, without ``label``, their
            name in messages; ``label(i, pid)`` names child ``i`` otherwise.
        daemon: Daemonic children (they may not start children of their own).
        start_timeout: Seconds the children may take to build their objects (None: no limit).
        control: Methods served at once, beside the call in progress.
        ignored_signals: Signals the children ignore. By default Ctrl-C and SIGTERM: both reach
            the whole process group, and the parent handles them (a trainer saves, then closes
            its children).
        error: The :class:`ChildFailed` subclass raised for this set's failures.
        timeout_key: The setting that sets the watchdog's budget, for messages.
        environment: Variables added to each child's environment.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        kwargs: Sequence[Mapping[str, Any]],
        *,
        name: str,
        label: Callable[[int, int | None], str] | None = None,
        start_method: str | None = "forkserver",
        daemon: bool = True,
        start_timeout: float | None = 300.0,
        control: Collection[str] = (),
        ignored_signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
        error: type[ChildFailed] = ChildFailed,
        timeout_key: str = "timeout",
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._label = label
        self._error = error
        self.timeout_key = timeout_key
        self.closed = False
        self.processes: list[Any] = []
        self._conns: list[mpc.Connection] = []
        self._results: list[dict[int, tuple[bool, Any]]] = []
        self._ids = itertools.count()
        ignored = tuple(int(s) for s in ignored_signals)
        # SIGTERM does nothing to a child that ignores it
        self._signals = ("kill",) if int(signal.SIGTERM) in ignored else ("terminate", "kill")
        # A pidfd per child, readable once it has ended. A ``forkserver`` child's own sentinel
        # is a pipe from the fork server, which fires (exit code 255) when the server ends,
        # child alive or not: a SIGTERM to the process group ends the server at once.
        self._pidfds: list[int | None] = []
        # Runs at garbage collection, at interpreter exit (before multiprocessing waits for
        # non-daemonic children) and from close.
        self._finalizer = mp_util.Finalize(
            self,
            _end_children,
            args=(self.processes, self._conns, self._pidfds, self._signals),
            exitpriority=10,
        )
        module = getattr(factory, "__module__", None)
        preload = ["__main__", __name__, *([module] if module else [])]
        context = process_context(start_method, preload=preload)
        served, env = frozenset(control), dict(environment or {})
        try:
            for i, kw in enumerate(kwargs):
                parent, child = context.Pipe(duplex=True)
                process = context.Process(
                    target=serve,
                    args=(child, factory, dict(kw), os.getpid(), served, ignored, env),
                    name=f"{name}-{i}",
                    daemon=daemon,
                )
                process.start()
                child.close()
                self.processes.append(process)
                self._pidfds.append(_pidfd(process.pid))
                self._conns.append(parent)
                self._results.append({})
            #: Process ids of the children, by index.
            self.pids: list[int] = [p.pid for p in self.processes]
            starts = [Call(i, _START) for i in range(len(self.processes))]
            self.gather(starts, start_timeout, "starting")
        except BaseException:
            self.close(grace=0.0)
            raise

    def label(self, child: int) -> str:
        """How messages name ``child``."""
        pid = self.processes[child].pid if child < len(self.processes) else None
        if self._label is not None:
            return self._label(child, pid)
        return f"{self.name} {child} (pid {pid})"

    def call(self, child: int, method: str, *args: Any) -> Call:
        """Send ``child`` the call ``method(*args)``; returns its handle at once."""
        if self.closed:
            raise RuntimeError(f"{self.name}: the child processes are closed")
        call = Call(child, next(self._ids))
        try:
            send(self._conns[child], (call.call_id, method, args))
        except (BrokenPipeError, OSError):
            self._died(child)  # the call's result is the child's death
        return call

    def call_each(self, children: Sequence[int], method: str, *args: Any) -> list[Call]:
        """The same call to each of ``children``."""
        return [self.call(child, method, *args) for child in children]

    def done(self, call: Call) -> bool:
        """Whether ``call``'s result (or its child's death) has arrived."""
        results = self._results[call.child]
        return call.call_id in results or _DEAD in results

    def wait(
        self, calls: Sequence[Call], num_returns: int, timeout: float | None
    ) -> tuple[list[Call], list[Call]]:
        """``(done, not done)`` once ``num_returns`` of ``calls`` are done or ``timeout`` passed.

        A child's death is the result of its pending calls.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = [c for c in calls if self.done(c)]
            left = None if deadline is None else deadline - time.monotonic()
            if len(ready) >= num_returns or (left is not None and left <= 0):
                return ready, [c for c in calls if not self.done(c)]
            busy = {c.child for c in calls if not self.done(c)}
            pipes = {self._conns[w]: w for w in busy}
            sentinels = {self._sentinel(w): w for w in busy}
            for obj in mpc.wait([*pipes, *sentinels], left):
                if obj in pipes:
                    self._receive(pipes[obj])
                elif not self._readable(self._conns[sentinels[obj]]):
                    self._died(sentinels[obj])

    def result(self, call: Call, what: str = "answering") -> Any:
        """The call's result, waiting for it; a failure raises this set's :class:`ChildFailed`.

        ``what`` is what the child was doing, for the message (``stepping``).
        """
        self.wait([call], 1, None)
        ok, value = self._peek(call)
        self._results[call.child].pop(call.call_id, None)
        if ok:
            return value
        raise self._failed(call.child, value, what)

    def gather(self, calls: Sequence[Call], timeout: float | None, what: str) -> list[Any]:
        """The results of ``calls``, in order, under the hang watchdog; any failure ends all.

        A child silent for half of ``timeout`` (seconds for all; None: no limit) is named in a
        warning; one silent for all of it, one whose call raised and one that died are this
        set's ``error``, raised after every child is ended.
        """
        deadline = Deadline(timeout)
        waiting = list(calls)
        while waiting:
            now = time.monotonic()
            if deadline.should_warn(now):
                log.warning(
                    "no reply for %.1f s while %s from %s; it counts as hung after %s s (%s)",
                    deadline.elapsed(now), what, self._labels(waiting), timeout,
                    self.timeout_key,
                )  # fmt: skip
            ready, waiting = self.wait(waiting, 1, deadline.seconds_left(now))
            for call in ready:
                ok, value = self._peek(call)
                if not ok:
                    self._fail(self._failed(call.child, value, what))
            if waiting and not ready and deadline.expired():
                self._fail(
                    self._error(
                        f"no reply within {timeout} s while {what} from "
                        f"{self._labels(waiting)} (hung? {self.timeout_key})",
                        child=waiting[0].child,
                    )
                )
        return [self.result(call, what) for call in calls]

    def close(self, grace: float = 2.0) -> None:
        """Close every child's object and end the children (idempotent; never hangs).

        Children still running after ``grace`` seconds in all get SIGTERM (unless they ignore
        it), then SIGKILL.
        """
        if self.closed:
            return
        self.closed = True
        self._finalizer.cancel()
        _end_children(self.processes, self._conns, self._pidfds, self._signals, grace)

    def _labels(self, calls: Sequence[Call]) -> str:
        return ", ".join(self.label(w) for w in sorted({c.child for c in calls}))

    def _peek(self, call: Call) -> tuple[bool, Any]:
        results = self._results[call.child]
        return results[call.call_id] if call.call_id in results else results[_DEAD]

    def _receive(self, child: int) -> None:
        try:
            call_id, ok, value = receive_from(self._conns[child])
        except (EOFError, OSError):
            self._died(child)
            return
        self._results[child][call_id] = (ok, value)

    def _sentinel(self, child: int) -> Any:
        pidfd = self._pidfds[child] if child < len(self._pidfds) else None  # (none once closed)
        return self.processes[child].sentinel if pidfd is None else pidfd

    def _died(self, child: int) -> None:
        process = self.processes[child]
        process.join(1.0)
        self._results[child][_DEAD] = (False, exit_reason(process.exitcode))

    @staticmethod
    def _readable(conn: mpc.Connection) -> bool:
        try:
            return conn.poll()
        except (EOFError, OSError):
            return False

    def _failed(self, child: int, value: Any, what: str) -> ChildFailed:
        label = self.label(child)
        if isinstance(value, _Failure):
            if what == "starting":
                head = f"{label}: failed while starting"
            else:
                head = f"{label}: {value.site or 'a call'} raised while {what}"
            return self._error(
                f"{head}; original traceback:\n{value.traceback.rstrip()}",
                child=child,
                site=value.site,
                site_index=value.site_index,
                traceback=value.traceback,
            )
        return self._error(f"{label} {value} while {what}", child=child)

    def _fail(self, error: ChildFailed) -> NoReturn:
        self.close()
        raise error


def _pidfd(pid: int | None) -> int | None:
    """A descriptor of process ``pid``, readable once it has ended (None: none)."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None  # ended already, or no pidfds (Linux < 5.3): the sentinel is used


def _ended(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _running(pidfds: list[int], seconds: float) -> list[int]:
    """Those of ``pidfds`` whose process is still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    alive = [fd for fd in pidfds if not _ended(fd)]
    while alive and (left := deadline - time.monotonic()) > 0:
        select.select(alive, [], [], left)
        alive = [fd for fd in alive if not _ended(fd)]
    return alive


def _end_children(
    processes: list[Any],
    conns: list[mpc.Connection],
    pidfds: list[int | None],
    signals: Sequence[str],
    grace: float = 2.0,
) -> None:
    """Ask each child to close, give them ``grace`` seconds in all, then ``signals``; reap all.

    Children with a pidfd are watched and signalled through it (a ``forkserver`` child's
    sentinel fires when its fork server ends); :func:`end_processes` ends the others.
    """
    for conn in conns:
        with contextlib.suppress(Exception):
            send(conn, (_CLOSE, "close", ()))
    pairs = list(zip(processes, pidfds, strict=True))
    watched = [(p, fd) for p, fd in pairs if fd is not None]
    end_processes([p for p, fd in pairs if fd is None], grace, signals)
    alive = _running([fd for _, fd in watched], grace)
    for name in signals:
        if not alive:
            break
        number = signal.SIGTERM if name == "terminate" else signal.SIGKILL
        for fd in alive:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, number)
        alive = _running(alive, 2.0)
    for process, _ in watched:
        with contextlib.suppress(Exception):
            process.join(0.5)  # reaped (by us, or reported by the fork server)
    for _, pidfd in watched:
        with contextlib.suppress(OSError):
            os.close(pidfd)
    pidfds.clear()
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()


def end_processes(processes: Sequence[Any], grace: float, signals: Sequence[str]) -> None:
    """End ``processes``: ``grace`` seconds in all to exit, then each of ``signals``; reap all.

    Each signal (``terminate``, ``kill``: ``Process`` methods) goes to those still alive, which
    then get 2 seconds.
    """
    started = [p for p in processes if p.pid is not None]
    deadline = time.monotonic() + grace
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for name in signals:
        alive = [p for p in started if p.exitcode is None]
        if not alive:
            break
        for process in alive:
            with contextlib.suppress(Exception):
                getattr(process, name)()
        deadline = time.monotonic() + 2.0
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))


def exit_reason(exitcode: int | None) -> str:
    """How a child ended, for messages (``died with SIGKILL``, ``exited with code 1``)."""
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died with {name}"
    return f"exited with code {exitcode}"
