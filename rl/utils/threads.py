"""How many threads torch uses in each process of a run (the ``torch_threads`` settings).

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


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def torch_thread_count(
    setting: int | str | None, device: str | torch.device = "cpu"
) -> int | None:
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


def set_torch_threads(setting: int | str | None, device: str | torch.device = "cpu") -> int:
    """Apply a ``torch_threads`` setting to this process; the thread count torch now uses."""
    count = torch_thread_count(setting, device)
    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()
