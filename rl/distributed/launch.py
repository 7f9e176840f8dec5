"""Starting distributed training: under torchrun, or as ranks spawned by ``train.py``.

Under torchrun only rank 0 plans the start (resume, ``init_from``, run folder: Hydra's
``${hydra:runtime.output_dir}`` may differ between ranks) and broadcasts it. Spawned ranks get
the plan as plain data, never a live ``DictConfig``: Hydra's resolvers do not work in children.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from rl.distributed.reduce import broadcast_object
from rl.distributed.settings import DistributedSettings
from rl.distributed.setup import DistContext, init_distributed, teardown
from rl.utils.files import NoFollowFileHandler

log = logging.getLogger(__name__)

# train_fn(plan, ctx) -> outcome; the launcher knows nothing of training.
TrainFn = Callable[[dict[str, Any], DistContext], Any]


def launched_by_torchrun() -> bool:
    """True when a launcher (torchrun, or srun exporting the same variables) set the rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    """A TCP port that was free on this machine a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_torchrun_rank(
    settings: DistributedSettings,
    device: str,
    make_plan: Callable[[], dict[str, Any]],
    train_fn: TrainFn,
) -> Any:
    """One rank under torchrun: rank 0 runs ``make_plan``, every rank ``train_fn`` with it.

    Raises:
        RuntimeError: Rank 0 failed to plan the start (on the other ranks).
    """
    ctx = init_distributed(settings, device)
    try:
        plan: dict[str, Any] | None = None
        error: str | None = None
        if ctx.is_main:
            try:
                plan = make_plan()
            except BaseException as e:
                error = f"{type(e).__name__}: {e}"
                broadcast_object({"error": error})
                raise
        shared = broadcast_object(plan)
        if "error" in shared:
            raise RuntimeError(f"rank 0 could not start the run: {shared['error']}")
        outcome = train_fn(shared, ctx)
        teardown(wait=True)
        return outcome
    finally:
        teardown()


def _spawned_rank(
    index: int,
    world_size: int,
    port: int,
    settings: DistributedSettings,
    device: str,
    plan: dict[str, Any],
    train_fn: TrainFn,
    results: Any,
) -> None:
    """Entry point of spawned rank ``index``."""
    gc.freeze()  # the imports' objects live as long as the rank (as in load_engine)
    os.environ.update(
        RANK=str(index),
        LOCAL_RANK=str(index),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    fmt = f"[%(asctime)s][rank {index}][%(name)s][%(levelname)s] - %(message)s"
    level = logging.INFO if index == 0 else logging.WARNING
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    if index == 0:
        output_dir = Path(plan["config"]["output_dir"])
        output_dir.mkdir(parents=True, exist_ok=True)
        handler = NoFollowFileHandler(output_dir / "train.log")
        handler.setFormatter(logging.Formatter(fmt))
        logging.getLogger().addHandler(handler)
    ctx = init_distributed(settings, device)
    try:
        outcome = train_fn(plan, ctx)
        if ctx.is_main:
            results.put(outcome)
        teardown(wait=True)
    finally:
        teardown()


@contextlib.contextmanager
def _forward_signals(context: Any) -> Iterator[None]:
    """Forward SIGTERM/SIGUSR1 to the ranks (Ctrl-C reaches them through the terminal)."""

    def handler(signum: int, frame: Any) -> None:
        for p in context.processes:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    previous = {}
    try:
        for name in ("SIGTERM", "SIGUSR1"):
            sig = getattr(signal, name, None)
            if sig is not None:
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# A rank that fails closes its sockets, and the others then fail inside their next collective
# with an error that names no cause. Which failure the launcher sees first is a race.
_ECHOES = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def _first_cause(context: Any, error: ProcessException) -> tuple[int, str]:
    """The failed rank to report: ``error``'s, unless it only echoes another's failure.

    The first traceback in the ranks' error files (torch's spawn wrapper) that is not an echo
    of a closed peer names the cause.
    """
    if not any(echo in str(error) for echo in _ECHOES):
        return error.error_index, str(error)
    for index, path in enumerate(context.error_files):
        if index == error.error_index or not os.access(path, os.R_OK):
            continue
        with contextlib.suppress(Exception), open(path, "rb") as fh:
            # Written by a process this launcher started (torch.multiprocessing).
            trace = str(pickle.load(fh))
            if not any(echo in trace for echo in _ECHOES):
                return index, f"\n\n-- Process {index} failed with:\n{trace}"
    return error.error_index, str(error)


def spawn_ranks(
    ranks: int,
    settings: DistributedSettings,
    device: str,
    plan: dict[str, Any],
    train_fn: TrainFn,
) -> Any:
    """Run ``train_fn(plan, ctx)`` on local spawned ranks; return what it returned on rank 0.

    A free local port is the rendezvous; SIGTERM and SIGUSR1 are forwarded to the ranks.

    Raises:
        RuntimeError: A rank failed or died (the others are terminated), named.
    """
    port = free_port()
    mpctx = mp.get_context("spawn")
    results = mpctx.SimpleQueue()
    log.info("spawning %d ranks (rendezvous 127.0.0.1:%d)", ranks, port)
    context = mp.start_processes(
        _spawned_rank,
        args=(ranks, port, settings, device, plan, train_fn, results),
        nprocs=ranks,
        join=False,
        start_method="spawn",
    )
    try:
        with _forward_signals(context):
            while not context.join(timeout=1.0):
                pass
    except ProcessException as e:
        index, detail = _first_cause(context, e)
        for path in context.error_files:  # read: not left in /tmp
            with contextlib.suppress(OSError, TypeError):
                os.unlink(path)
        raise RuntimeError(
            f"distributed training failed: rank {index} ({detail}); the other "
            "ranks were terminated"
        ) from None
    if results.empty():
        raise RuntimeError("distributed training: rank 0 exited without a result")
    return results.get()
