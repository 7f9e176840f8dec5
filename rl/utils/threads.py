"""How many threads torch uses in each process of a run, and how many processes run.

``torch_threads: auto`` is one thread per process on the CPU: the networks are small, so a
second intra-op thread barely helps on an idle machine and oversubscribes a busy one;
parallelism comes from processes. With a GPU the learner's CPU threads only feed it: up to 4.
"""

from __future__ import annotations

import os

import torch

AUTO = "auto"
#: Fixes this process's share of the cores (a collection worker sets 1 for what it starts).
CORES_ENV = "RL_CORES"


def available_cores() -> int:
    """The share of the cores this process may use, at least 1.

    ``RL_CORES`` if set; else the cores of its CPU affinity divided by the learners on this
    machine (``LOCAL_WORLD_SIZE`` under DDP).
    """
    share = os.environ.get(CORES_ENV)
    if share:
        return max(1, int(share))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    learners = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, cores // learners)


def auto_count(setting: int | str, cap: int | None = None, what: str = "count") -> int:
    """A process count ``setting`` as a number: ``auto`` is :func:`available_cores` less one.

    ``auto`` (less one: the learner's core) is at least 1 and at most ``cap``; another string
    is a ValueError naming ``what``.
    """
    if setting == AUTO:
        count = max(1, available_cores() - 1)
        return count if cap is None else max(1, min(count, cap))
    if isinstance(setting, str):
        raise ValueError(f"{what}: expected an integer or auto, got {setting!r}")
    return int(setting)


def torch_thread_count(setting: int | str | None, device: str | torch.device) -> int | None:
    """The thread count a ``torch_threads`` setting means on ``device`` (None: torch's default)."""
    if setting is None:
        return None
    if setting == AUTO:
        if str(device).startswith("cuda"):
            return min(4, available_cores())
        return 1
    if isinstance(setting, str):
        raise ValueError(f"torch_threads: expected an integer, auto or null, got {setting!r}")
    return int(setting)


def set_torch_threads(setting: int | str | None, device: str | torch.device) -> int:
    """Apply a ``torch_threads`` setting to this process; the thread count torch now uses."""
    count = torch_thread_count(setting, device)
    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()
