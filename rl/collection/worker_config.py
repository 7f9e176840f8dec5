"""The rules of the ``collector`` settings of collection workers, and the workers' shares.

Each setting is declared once, typed and ranged, by :class:`~rl.collection.CollectionWorkerSet`'s
signature (what the config check reads before anything is built); its value for a run comes
from ``conf/collector/ray.yaml`` (``process.yaml`` changes a few), the one place of the defaults.
The rules between settings live here once, over plain values: :func:`collector_errors` is applied
by the config check (``rl.engine.settings.verify_train_cfg``) and by the constructor.
:func:`worker_kwargs` splits the environments over the workers.
"""

from __future__ import annotations

from typing import Any

from rl.collection.base import CollectionSpec
from rl.utils.misc import evenly_distribute_count_into_bins
from rl.utils.threads import AUTO, auto_count

__all__ = ["BACKENDS", "MODES", "collector_errors", "worker_kwargs"]

MODES = ("sync", "async")
BACKENDS = ("ray", "process")


def collector_errors(
    *,
    num_workers: int | str,
    num_envs: int,
    mode: str,
    rollouts_per_update: int | None,
    address: str | None,
) -> list[str]:
    """The rules between the ``collector`` settings, one message each.

    Single settings' types and ranges are :class:`~rl.collection.CollectionWorkerSet`'s
    annotations (the config check reads them); these are the rules between settings and the
    run's ``sampler.num_envs``. ``num_workers`` may be ``auto`` (resolved on this machine).
    """
    if num_workers == AUTO and address is not None:
        return [
            "collector.num_workers: auto counts this machine's cores; joining a cluster "
            f"(collector.address={address}) needs a number"
        ]
    if num_workers == AUTO:
        num_workers = auto_count(num_workers, num_envs, "collector.num_workers")
    if not isinstance(num_workers, int) or num_workers < 1:
        return []  # (its annotation names it)
    errors = []
    if num_envs < num_workers:
        errors.append(
            f"collector.num_workers={num_workers} > sampler.num_envs={num_envs}: every "
            "worker needs at least one environment"
        )
    per_update = num_workers if rollouts_per_update is None else rollouts_per_update
    if not isinstance(per_update, int):
        return errors
    if per_update > num_workers:
        errors.append(
            f"collector.rollouts_per_update: must be in [1, num_workers={num_workers}] or null "
            f"(every worker's), got {rollouts_per_update}"
        )
    elif mode == "async" and per_update < num_workers and num_envs % num_workers:
        errors.append(
            f"collector.rollouts_per_update={per_update} < num_workers={num_workers} "
            f"needs the environments split evenly: sampler.num_envs={num_envs} is not a "
            f"multiple of {num_workers}"
        )
    return errors


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
