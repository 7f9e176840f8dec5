"""Where collection workers live: Ray actors, or child processes of this one.

:class:`~rl.collection.worker_set.CollectionWorkerSet` drives its workers through
:class:`Actors`: ``call`` a worker's method (a handle comes back at once), ``wait`` for some
handles, ``get`` a result. Two implementations:

- :class:`RayActors` (``backend: ray``): one Ray actor per worker, on this machine or a cluster;
- :class:`ProcessActors` (``backend: process``): one child process per worker on this machine,
  no Ray: the children fork from a ``forkserver`` that has imported the worker's modules
  once, so a worker starts in the time it takes to build its environments. Calls
  run in order in the child; ``stop_collecting`` (the straggler rule) is served at once by the
  child's receiving thread, as Ray serves it in its own concurrency group. The children are
  not daemonic (each may run a multiprocess sampler of its own) and never outlive the learner:
  closed, ended at interpreter exit, and on Linux killed by the kernel with it.

A failed call or a dead worker is a :class:`CollectionWorkerError` naming the worker, its pid
and the original traceback.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing.util as mp_util
import os
import queue
import re
import signal
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from rl.collection.pipes import receive_from, send
from rl.sampling.mp_worker import die_with_parent
from rl.utils.processes import end_processes, process_context

log = logging.getLogger(__name__)

# Methods served while the worker is busy with an earlier call (Ray: concurrency group).
CONTROL_METHODS = frozenset({"stop_collecting"})
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its error text


class CollectionWorkerError(RuntimeError):
    """A collection worker raised or died; the message names it and carries its traceback."""


class Actors(Protocol):
    """Workers of one class, each a remote object whose methods are called asynchronously."""

    pids: list[int]

    def call(self, worker: int, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on ``worker``; returns a handle at once."""

    def wait(
        self, handles: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """``(ready, not ready)`` once ``num_returns`` handles are done or ``timeout`` passed."""

    def get(self, handle: Any, worker: int) -> Any:
        """The result of a call (:class:`CollectionWorkerError` if it failed)."""

    def share(self, value: Any) -> Any:
        """``value`` in a form that is sent once to several calls."""

    def close(self, timeout: float) -> None:
        """Call every worker's ``close``, then end them (and what this object started)."""


# ---------------------------------------------------------------------------------------- Ray
class RayActors:
    """One Ray actor per worker (``backend: ray``).

    Args:
        cls: The worker class.
        kwargs: Constructor arguments, one mapping per worker.
        address: None: start a private Ray instance with ``len(kwargs) * cpus_per_worker``
            CPUs, on loopback with token authentication (shut down by :meth:`close`); ``auto``
            or ``HOST:PORT``: join that cluster (see :func:`~rl.collection.ray_runtime.init_ray`).
        cpus_per_worker: Ray CPUs reserved per worker.
        gpus_per_worker: Ray GPUs reserved per worker (PyTorchRL's ``worker_remote_config``).
        memory_per_worker: Ray memory reserved per worker, in bytes (None: none reserved).
        start_timeout: Seconds the workers may take to start.
        allow_unauthenticated: Join a cluster even without token authentication.
        owner: Prefix of the workers' names in errors (``"rank 1 "`` under DDP).
    """

    def __init__(
        self,
        cls: type,
        kwargs: Sequence[Mapping[str, Any]],
        *,
        address: str | None,
        cpus_per_worker: float,
        start_timeout: float,
        gpus_per_worker: float = 0.0,
        memory_per_worker: int | None = None,
        allow_unauthenticated: bool = False,
        owner: str = "",
    ) -> None:
        import ray

        self.owner = owner

        from rl.collection.ray_runtime import RayRuntime, init_ray

        self._ray = ray
        self._runtime: RayRuntime | None = None  # the Ray this object started or joined
        if not ray.is_initialized():
            num_cpus = max(1, math.ceil(len(kwargs) * cpus_per_worker))
            self._runtime = init_ray(
                address=address,
                num_cpus=num_cpus if address is None else None,
                allow_unauthenticated=allow_unauthenticated,
                logging_level=logging.WARNING,
            )

        class RayWorker(cls):  # type: ignore[valid-type,misc]
            @ray.method(concurrency_group="control")
            def stop_collecting(self, *args: Any) -> Any:
                return super().stop_collecting(*args)

        RayWorker.__name__ = RayWorker.__qualname__ = cls.__name__
        # Ray's type stub lacks concurrency_groups (a documented option of actors).
        options: dict[str, Any] = {"concurrency_groups": {"control": 1}, "max_restarts": 0}
        if gpus_per_worker:
            options["num_gpus"] = gpus_per_worker
        if memory_per_worker:
            options["memory"] = int(memory_per_worker)
        remote: Any = ray.remote(num_cpus=cpus_per_worker, **options)(RayWorker)
        self.workers = [remote.remote(**kw) for kw in kwargs]
        self.pids: list[int] = []
        refs = [w.pid.remote() for w in self.workers]
        ready, late = ray.wait(refs, num_returns=len(refs), timeout=start_timeout)
        if late:
            raise CollectionWorkerError(
                f"{self.owner}collection workers {[refs.index(r) for r in late]} did not start "
                f"within {start_timeout:.0f} s (are the resources they reserve available?)"
            )
        self.pids = [self.get(r, i) for i, r in enumerate(refs)]

    def call(self, worker: int, method: str, *args: Any) -> Any:
        """``worker.method.remote(*args)``."""
        return getattr(self.workers[worker], method).remote(*args)

    def wait(
        self, handles: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """``ray.wait``."""
        ready, waiting = self._ray.wait(list(handles), num_returns=num_returns, timeout=timeout)
        return list(ready), list(waiting)

    def get(self, handle: Any, worker: int) -> Any:
        """``ray.get``, a failure named after its worker."""
        from ray.exceptions import RayError

        try:
            return self._ray.get(handle)
        except RayError as e:
            pid = self.pids[worker] if worker < len(self.pids) else "?"
            cause = getattr(e, "cause", None)
            what = f"{type(cause).__name__}: {cause}" if cause is not None else type(e).__name__
            detail = _ANSI.sub("", str(e))
            raise CollectionWorkerError(
                f"{self.owner}collection worker {worker} (pid {pid}) failed: {what}\n"
                f"in the worker:\n{detail}"
            ) from None

    def share(self, value: Any) -> Any:
        """``ray.put``: one copy in the object store for every worker."""
        return self._ray.put(value)

    def close(self, timeout: float) -> None:
        """Close and kill every actor; shut Ray down if this object started it."""
        ray, workers, self.workers = self._ray, self.workers, []
        try:
            if workers:
                calls = [w.close.remote() for w in workers]
                ray.wait(calls, num_returns=len(workers), timeout=timeout)
        finally:
            for w in workers:
                ray.kill(w, no_restart=True)
            runtime, self._runtime = self._runtime, None
            if runtime is not None:
                runtime.shutdown()  # Ray ends here, the environment it changed is restored


# ------------------------------------------------------------------------------ processes
def _serve(conn: Connection, cls: type, kwargs: Mapping[str, Any], learner_pid: int) -> None:
    """A worker process: build ``cls(**kwargs)``, then run the calls that arrive, in order.

    Ctrl-C and SIGTERM sent to the whole process group are the learner's to handle (it stops
    at a rollout boundary, saves, then closes its workers); the worker ends when told to, when
    the learner's end of the pipe closes (after the call it is running; it closes ``obj``
    first), or, on Linux, at once when the learner process ends, even killed with SIGKILL
    (:func:`~rl.sampling.mp_worker.die_with_parent`; its own sampler workers then go too).
    """
    die_with_parent(learner_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    send_lock = threading.Lock()

    def reply(call_id: int, ok: bool, value: Any) -> None:
        with send_lock:
            send(conn, (call_id, ok, value))

    def failure() -> str:
        return traceback.format_exc()

    try:
        obj = cls(**kwargs)
    except BaseException:
        reply(-1, False, failure())
        return
    reply(-1, True, os.getpid())
    calls: queue.Queue[tuple[int, str, tuple[Any, ...]] | None] = queue.Queue()

    def receive() -> None:  # control calls at once, the rest in order on the main thread
        try:
            while True:
                call_id, method, args = receive_from(conn)
                if method in CONTROL_METHODS:
                    try:
                        reply(call_id, True, getattr(obj, method)(*args))
                    except BaseException:
                        reply(call_id, False, failure())
                else:
                    calls.put((call_id, method, args))
        except (EOFError, OSError):
            calls.put(None)  # the learner is gone

    threading.Thread(target=receive, daemon=True).start()
    while (item := calls.get()) is not None:
        call_id, method, args = item
        try:
            ok, value = True, getattr(obj, method)(*args)
        except BaseException:
            ok, value = False, failure()
        try:
            try:
                reply(call_id, ok, value)
            except OSError:
                raise
            except BaseException:  # e.g. a result that does not pickle
                reply(call_id, False, failure())
        except OSError:
            break  # the learner is gone: nobody to reply to
        if method == "close":
            return
    close = getattr(obj, "close", None)  # the learner went without closing this worker
    if close is not None:
        with contextlib.suppress(Exception):
            close()


class _Call:
    """A handle on a call to a worker process."""

    __slots__ = ("call_id", "worker")

    def __init__(self, worker: int, call_id: int) -> None:
        self.worker, self.call_id = worker, call_id


class ProcessActors:
    """One child process per worker on this machine (``backend: process``).

    The workers are not daemonic, so they may start processes of their own (a
    ``sampler=multiprocess`` in each worker). None outlives this process: :meth:`close`
    ends them, so does interpreter exit (a ``multiprocessing`` finalizer, run before the
    interpreter waits for its non-daemonic children), and on Linux each worker kills itself
    when this process ends in any other way, SIGKILL included (it watches this process, not the
    fork server it was forked from: :func:`~rl.sampling.mp_worker.die_with_parent`).

    Args:
        cls: The worker class (importable: the children are started with ``forkserver``,
            ``spawn`` where it is missing).
        kwargs: Constructor arguments, one mapping per worker (picklable).
        start_timeout: Seconds the workers may take to build.
        owner: Prefix of the workers' names in errors (``"rank 1 "`` under DDP).
    """

    def __init__(
        self,
        cls: type,
        kwargs: Sequence[Mapping[str, Any]],
        *,
        start_timeout: float,
        owner: str = "",
    ) -> None:
        self.owner = owner
        # Workers fork from a server that has imported the worker's modules once (torch among
        # them): starting one costs a fork, not a fresh interpreter's imports.
        context = process_context("forkserver", preload=["__main__", __name__, cls.__module__])
        self._conns: list[Connection] = []
        self._processes: list[Any] = []
        self._results: list[dict[int, tuple[bool, Any]]] = []
        self._ids = itertools.count()
        self._finalizer = mp_util.Finalize(
            self, _end_processes, args=(self._processes, self._conns), exitpriority=10
        )
        for i, kw in enumerate(kwargs):
            parent, child = context.Pipe()
            process = context.Process(
                target=_serve,
                args=(child, cls, kw, os.getpid()),
                name=f"collection-worker-{i}",
                daemon=False,  # it may have children of its own (a multiprocess sampler)
            )
            process.start()
            child.close()
            self._conns.append(parent)
            self._processes.append(process)
            self._results.append({})
        self.pids: list[int] = [p.pid for p in self._processes]
        starts = [_Call(i, -1) for i in range(len(kwargs))]
        ready, late = self.wait(starts, len(starts), start_timeout)
        if late:
            self._terminate()
            raise CollectionWorkerError(
                f"{self.owner}collection workers {[c.worker for c in late]} did not start within "
                f"{start_timeout:.0f} s"
            )
        for call in starts:
            self.get(call, call.worker)

    def call(self, worker: int, method: str, *args: Any) -> _Call:
        """Send the call; its result is read by :meth:`wait` / :meth:`get`."""
        call_id = next(self._ids)
        try:
            send(self._conns[worker], (call_id, method, args))
        except (BrokenPipeError, OSError):
            self._results[worker][call_id] = (False, self._death(worker))
        return _Call(worker, call_id)

    def _death(self, worker: int) -> str:
        process = self._processes[worker]
        process.join(timeout=1.0)
        return f"the worker process exited (exit code {process.exitcode})"

    def _receive(self, worker: int) -> None:
        """Read one result of ``worker`` (its death is a result of every pending call)."""
        try:
            call_id, ok, value = receive_from(self._conns[worker])
        except (EOFError, OSError):
            self._results[worker][_DEAD] = (False, self._death(worker))
            return
        self._results[worker][call_id] = (ok, value)

    def _done(self, call: _Call) -> bool:
        results = self._results[call.worker]
        return call.call_id in results or _DEAD in results

    def wait(
        self, handles: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """Read results until ``num_returns`` of ``handles`` are done or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = [h for h in handles if self._done(h)]
            if len(ready) >= num_returns:
                return ready, [h for h in handles if not self._done(h)]
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return ready, [h for h in handles if not self._done(h)]
            busy = {h.worker for h in handles if not self._done(h)}
            for conn in wait([self._conns[w] for w in busy], timeout=left):
                self._receive(self._conns.index(conn))  # type: ignore[arg-type]

    def get(self, handle: Any, worker: int) -> Any:
        """The call's result, waiting for it; a failure is a :class:`CollectionWorkerError`."""
        self.wait([handle], 1, None)
        results = self._results[worker]
        ok, value = results.pop(handle.call_id) if handle.call_id in results else results[_DEAD]
        if ok:
            return value
        raise CollectionWorkerError(
            f"{self.owner}collection worker {worker} (pid {self.pids[worker]}) failed:\n"
            "in the worker:\n"
            f"{value}"
        )

    def share(self, value: Any) -> Any:
        """The value itself: each call pickles it through its worker's pipe."""
        return value

    def close(self, timeout: float) -> None:
        """``close`` on every worker, then end the processes that did not exit.

        A worker that did not close within ``timeout`` (busy, or hung) is killed at once.
        """
        try:
            calls = [self.call(i, "close") for i in range(len(self._conns))]
            _, late = self.wait(calls, len(calls), timeout)
            for call in late:
                self._processes[call.worker].kill()
        finally:
            self._terminate()

    def _terminate(self) -> None:
        self._finalizer()  # once: _end_processes empties the lists


def _end_processes(processes: list[Any], conns: list[Connection], grace: float = 2.0) -> None:
    """Close the pipes, give the processes ``grace`` seconds in all to exit, kill the rest.

    An idle worker exits on its closed pipe; a busy or hung one is killed (it ignores SIGTERM,
    see :func:`_serve`). Empties both lists.
    """
    for conn in conns:
        conn.close()
    end_processes(processes, grace, signals=("kill",), wait=2.0, release=False)
    processes.clear()
    conns.clear()


_DEAD = -2  # key of a dead worker's result


__all__ = ["Actors", "CollectionWorkerError", "ProcessActors", "RayActors"]
