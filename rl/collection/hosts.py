"""Where collection workers live: Ray actors, or child processes of this one.

A failed call or a dead worker is a :class:`CollectionWorkerError` naming the worker, its pid
and the original traceback.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rl.utils.processes import Call, ChildFailed, ChildProcesses
from rl.utils.threads import CORES_ENV

__all__ = ["CollectionWorkerError", "ProcessHosts", "RayHosts", "WorkerHosts"]

log = logging.getLogger(__name__)

# Methods served while the worker is busy with an earlier call (Ray: concurrency group).
CONTROL_METHODS = frozenset({"stop_collecting"})
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its error text


class CollectionWorkerError(ChildFailed):
    """A collection worker raised, died or hung; the message names it (and its traceback)."""

    def __init__(self, message: str, *, child: int = -1, **details: Any) -> None:
        super().__init__(message, child=child, **details)


class WorkerHosts(Protocol):
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


class RayHosts:
    """One Ray actor per worker (``backend: ray``).

    Args:
        kwargs: Constructor arguments, one mapping per worker.
        address: None: start a private Ray instance with ``len(kwargs) * cpus_per_worker``
            CPUs (shut down by :meth:`close`); ``auto`` or ``HOST:PORT``: join that cluster
            (:func:`~rl.collection.ray_runtime.init_ray`).
        memory_per_worker: Ray memory reserved per worker, in bytes (None: none reserved).
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

        from rl.collection.ray_runtime import RayRuntime, init_ray

        self.owner = owner
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

        share = str(max(1, math.floor(cpus_per_worker)))

        class RayWorker(cls):
            def __init__(self, **kwargs: Any) -> None:
                os.environ[CORES_ENV] = share  # its reserved CPUs (auto counts inside it)
                super().__init__(**kwargs)

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


class ProcessHosts:
    """One child process per worker on this machine (``backend: process``).

    Calls run in order in the child; :data:`CONTROL_METHODS` are served at once by its
    receiving thread. The workers are not daemonic, so they may start processes of their own (a
    ``sampler=multiprocess``), and they ignore SIGTERM (the learner's signal to save, then close
    them). None outlives this process: :meth:`close`, interpreter exit, and on Linux the death
    of this process, SIGKILL included, end them.

    Args:
        cls: The worker class (importable: the children start with ``forkserver``).
        kwargs: Constructor arguments, one mapping per worker (picklable).
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
        try:
            self._children = ChildProcesses(
                cls,
                kwargs,
                name="collection-worker",
                label=lambda i, pid: f"{owner}collection worker {i} (pid {pid})",
                daemon=False,
                start_timeout=start_timeout,
                control=CONTROL_METHODS,
                error=CollectionWorkerError,
                timeout_key="collector.timeout",
                environment={CORES_ENV: "1"},  # a worker's share: its own core (auto counts)
            )
        except CollectionWorkerError as e:
            raise CollectionWorkerError(f"{owner}collection workers did not start: {e}") from None
        self.pids: list[int] = list(self._children.pids)

    def call(self, worker: int, method: str, *args: Any) -> Call:
        """Send the call; its result is read by :meth:`wait` / :meth:`get`."""
        return self._children.call(worker, method, *args)

    def wait(
        self, handles: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """Read results until ``num_returns`` of ``handles`` are done or ``timeout`` passed."""
        return self._children.wait(handles, num_returns, timeout)

    def get(self, handle: Any, worker: int) -> Any:
        """The call's result, waiting for it; a failure is a :class:`CollectionWorkerError`."""
        try:
            return self._children.result(handle)
        except ChildFailed as e:
            detail = e.traceback if e.traceback is not None else str(e)
            raise CollectionWorkerError(
                f"{self.owner}collection worker {worker} (pid {self.pids[worker]}) failed:\n"
                f"in the worker:\n{detail}"
            ) from None

    def share(self, value: Any) -> Any:
        """The value itself: each call pickles it through its worker's pipe."""
        return value

    def close(self, timeout: float) -> None:
        """``close`` on every worker; those not done within ``timeout`` (busy, hung) are killed."""
        self._children.close(grace=timeout)
