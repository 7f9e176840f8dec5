"""Test helper: run a function on 2 gloo ranks in processes of their own.

The ranks are forked from a ``forkserver`` that has imported the engine once (for the session's
test process), not spawned: a spawned rank imports torch and the engine itself, about 5 CPU
seconds each, twice a test. What the tests check is the ranks' training, not how they start
(``spawn_ranks`` and the CLI's launchers have tests of their own).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.distributed.launch import free_port
from rl.distributed.setup import teardown
from rl.utils.processes import process_context

WORLD = 2
# What the ranks import: loaded once in the fork server (where it is not started yet).
PRELOAD = ("rl.engine.run", "rl.collection.worker_set", "rl.sampling")


def _entry(rank: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    fn(rank, *args)
    teardown(wait=True)


def run_ranks(fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(rank, *args)`` on 2 gloo ranks; raises if either fails."""
    method = process_context("forkserver", preload=PRELOAD).get_start_method()
    mp.start_processes(
        _entry, args=(free_port(), fn, args), nprocs=WORLD, join=True, start_method=method
    )
