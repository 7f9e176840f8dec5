"""The ``collector`` settings of collection workers: their choices, defaults and rules.

:func:`check_collector` names every problem of a
:class:`~rl.collection.CollectionWorkerSet`'s settings at once, before any worker starts (a
``ConfigError``); :func:`worker_kwargs` splits the environments over the workers.
"""

from __future__ import annotations

from typing import Any

from rl.collection.base import CollectionSpec
from rl.utils.config import ConfigError
from rl.utils.misc import evenly_distribute_count_into_bins

__all__ = ["BACKENDS", "DEFAULT_TIMEOUT_S", "MODES", "check_collector", "worker_kwargs"]

MODES = ("sync", "async")
BACKENDS = ("ray", "process")
# The watchdog's default (collector.timeout): seconds a worker may take to answer a call, per
# 128 steps of a rollout and per round of evaluation episodes (rl.collection.worker_calls).
# Generous: a worker's rollout of the slowest shipped task (nav3d: ~2 ms a step, ~30 ms a
# reset; 16 envs x 128 steps on one worker, policy included) takes about 5-10 s on 2 cores.
DEFAULT_TIMEOUT_S = 120.0


def check_collector(
    num_workers: int,
    mode: str,
    backend: str,
    fraction_samples: float,
    min_rollout_frac: float,
    max_policy_lag: int,
    spec: CollectionSpec,
    timeout: float | None,
    rollouts_per_update: int,
) -> None:
    """Problems of the ``collector`` settings, all at once (``ConfigError``)."""
    errors = []
    if timeout is not None and not timeout > 0:
        errors.append(f"collector.timeout: must be > 0 seconds or null (none), got {timeout}")
    if num_workers < 1:
        errors.append(f"collector.num_workers: must be >= 1, got {num_workers}")
    elif spec.num_envs < num_workers:
        errors.append(
            f"collector.num_workers={num_workers} > sampler.num_envs={spec.num_envs}: every "
            "worker needs at least one environment"
        )
    if mode not in MODES:
        errors.append(f"collector.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if backend not in BACKENDS:
        errors.append(f"collector.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if not 0.0 < fraction_samples <= 1.0:
        errors.append(f"collector.fraction_samples: must be in (0, 1], got {fraction_samples}")
    if not 0.0 <= min_rollout_frac <= 1.0:
        errors.append(f"collector.min_rollout_frac: must be in [0, 1], got {min_rollout_frac}")
    if max_policy_lag < 0:
        errors.append(f"collector.max_policy_lag: must be >= 0, got {max_policy_lag}")
    if not 1 <= rollouts_per_update <= max(1, num_workers):
        errors.append(
            f"collector.rollouts_per_update: must be in [1, num_workers={num_workers}] or null "
            f"(every worker's), got {rollouts_per_update}"
        )
    elif (
        mode == "async"
        and rollouts_per_update < num_workers
        and spec.num_envs % max(1, num_workers)
    ):
        errors.append(
            f"collector.rollouts_per_update={rollouts_per_update} < num_workers={num_workers} "
            f"needs the environments split evenly: sampler.num_envs={spec.num_envs} is not a "
            f"multiple of {num_workers}"
        )
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def worker_kwargs(
    spec: CollectionSpec,
    num_workers: int,
    *,
    compress: bool,
    shared_memory: bool,
    cpus_per_worker: float,
    min_rollout_frac: float | None,
) -> tuple[list[slice], list[dict[str, Any]]]:
    """Each worker's rows (contiguous blocks of the run's) and constructor arguments.

    A worker's rows are its environments, or their agents for a multi-agent task.
    """
    shares = evenly_distribute_count_into_bins(spec.num_envs, num_workers)
    starts = [sum(shares[:i]) for i in range(num_workers)]
    rows = spec.agents  # a worker's rows: its environments' agents
    slices = [slice(a * rows, (a + n) * rows) for a, n in zip(starts, shares, strict=True)]
    kwargs = [
        {
            "index": i,
            "spec": spec,
            "num_envs": shares[i],
            "env_offset": starts[i],
            "min_rollout_frac": min_rollout_frac,
            "compress": compress,
            "shared_memory": shared_memory,
            "torch_threads": max(1, int(cpus_per_worker)),
        }
        for i in range(num_workers)
    ]
    return slices, kwargs
