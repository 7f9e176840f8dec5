"""How many threads torch uses in each process of a run, and how many processes run.

``auto`` process counts (``collector.num_workers``, ``sampler.num_processes``) are this
process's share of the cores, less one for the learner's own process (:func:`auto_count`): on 2
cores one worker beside the learner, on 16 cores 15. The share (:func:`available_cores`) is the
cores the process may run on (its CPU affinity), divided among the learners of the machine under
DDP (``LOCAL_WORLD_SIZE``, set by torchrun and by ``distributed.nprocs``: 4 ranks on 64 cores
take 16 each, so 15 workers each), and one core in a collection worker (``RL_CORES``, which
the worker sets: a multiprocess sampler inside it with ``auto`` runs one process). The
``torch_threads`` settings:

``torch_threads: auto`` (the default of ``train.yaml`` and ``evaluate.yaml``) is one thread per
process on the CPU: the framework's networks are small, so a second intra-op thread barely
speeds a process up on an idle machine and, on a busy one (a shared node, parallel sweep jobs,
collection workers beside the learner), oversubscribes the cores and slows it down severalfold
(the figures are in the docs' Speed page). Parallelism comes from processes instead (samplers,
collection workers). With a GPU the learner's CPU threads only feed it: up to 4. An integer sets
the count; ``null`` leaves torch's default (one thread per core).
"""

from __future__ import annotations

import os

import torch

AUTO = "auto"
#: The environment variable that fixes this process's share of the cores (a collection worker
#: sets it to 1 for itself and what it starts).
CORES_ENV = "RL_CORES"


def available_cores() -> int:
    """The share of the cores this process may use, at least 1.

    ``RL_CORES`` if set; else the cores the process may run on (its CPU affinity) divided by
    the learners on this machine (``LOCAL_WORLD_SIZE`` under DDP).
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
    """A process count setting as a number: ``auto`` is :func:`available_cores` less one.

    The learner keeps one core; ``auto`` is never less than 1.

    Args:
        setting: An integer or ``auto``.
        cap: The most it may be (e.g. the environments to share; None: no cap).
        what: The setting's name, for the error.

    Raises:
        ValueError: ``setting`` is another string.
    """
    if setting == AUTO:
        count = max(1, available_cores() - 1)
        return count if cap is None else max(1, min(count, cap))
    if isinstance(setting, str):
        raise ValueError(f"{what}: expected an integer or auto, got {setting!r}")
    return int(setting)


def torch_thread_count(setting: int | str | None, device: str | torch.device) -> int | None:
    """The thread count a ``torch_threads`` setting means for a process on ``device``.

    Args:
        setting: An integer, ``auto``, or None (torch's default: nothing to set).
        device: Where the process computes.

    Raises:
        ValueError: ``setting`` is another string.
    """
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
