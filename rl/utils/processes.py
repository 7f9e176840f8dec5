"""Child processes of a run, started and ended one way (sampler, collection and validation).

Sampler workers, collection workers and the validation process are started from
:func:`process_context`: a ``multiprocessing`` context of the asked start method
(``forkserver`` falls back to ``spawn`` where it is missing), the modules a fork server imports
once given up front. They are ended by :func:`end_processes`, which never hangs: the processes
get a grace period to exit by themselves (their caller has asked them to), then each escalation
signal in turn (SIGTERM, SIGKILL) with a short wait, and every one is reaped. DDP ranks are the
exception: ``torch.multiprocessing.start_processes`` starts and ends them
(:mod:`rl.distributed.launch`), as torchrun's are.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["end_processes", "process_context", "resolve_start_method"]

log = logging.getLogger(__name__)


def resolve_start_method(method: str | None, key: str = "mp_start_method") -> str:
    """The start method to use: ``method`` if available, else ``spawn`` (``forkserver`` first).

    Args:
        method: ``forkserver``, ``spawn``, ``fork`` or None (``forkserver``).
        key: The setting that chose it, for the error.

    Returns:
        An available start method; ``forkserver`` falls back to ``spawn`` where it is missing.

    Raises:
        ValueError: Another method that this platform does not have (naming ``key``).
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
    """The ``multiprocessing`` context to start children with (see :func:`resolve_start_method`).

    Args:
        method: The start method asked for.
        preload: Modules a fork server imports once (``forkserver`` only): starting a child
            then costs a fork, not a fresh interpreter's imports.
    """
    resolved = resolve_start_method(method)
    context = mp.get_context(resolved)
    if resolved == "forkserver" and preload:
        context.set_forkserver_preload(list(preload))
    return context


def end_processes(
    processes: Sequence[Any],
    grace: float,
    *,
    signals: Sequence[str] = ("terminate", "kill"),
    wait: float = 1.0,
    release: bool = True,
) -> None:
    """End ``processes``: ``grace`` seconds in all to exit, then each of ``signals``; reap all.

    Args:
        processes: ``multiprocessing`` processes (unstarted ones are skipped).
        grace: Seconds, for all of them together, to exit by themselves.
        signals: Escalation, in order: ``terminate`` (SIGTERM), ``kill`` (SIGKILL); each is sent
            to those still alive, which then get ``wait`` seconds.
        wait: Seconds after each signal.
        release: Release the ended processes' resources (``Process.close``; their ``pid``
            and ``exitcode`` cannot be read afterwards).
    """
    started = [p for p in processes if p.pid is not None]
    deadline = time.monotonic() + grace
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for signal in signals:
        alive = [p for p in started if p.exitcode is None]
        if not alive:
            break
        for process in alive:
            with contextlib.suppress(Exception):
                getattr(process, signal)()
        deadline = time.monotonic() + wait
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
    for process in started if release else ():
        with contextlib.suppress(Exception):
            if process.exitcode is not None:
                process.close()
