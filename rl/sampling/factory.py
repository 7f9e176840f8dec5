"""Build any sampler from its (plain) config, for training or for an evaluation episode list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hydra.utils

from rl.sampling.base import Sampler


def build_sampler(
    config: Mapping[str, Any] | None,
    *,
    task: Mapping[str, Any],
    seed: int | None = 0,
    episode_seeds: Sequence[int] | None = None,
    num_envs: int | None = None,
) -> Sampler:
    """Instantiate a sampler config (``_target_``, ``_partial_``, its keys) for ``task``.

    Args:
        config: Plain sampler config, e.g. ``{"_target_": "rl.sampling.MultiprocessSampler",
            "_partial_": True, "num_processes": 2, "envs_per_process": 8}``; None builds a
            :class:`~rl.sampling.SerialSampler`.
        task: Plain task config with a ``_target_``.
        seed: Seed of the environments' first resets (training mode).
        episode_seeds: Evaluation mode: the fixed episode list.
        num_envs: Overrides the config's environment count (e.g. ``eval.num_envs``).

    Returns:
        The sampler (a context manager; close it).
    """
    cfg = dict(config or {"_target_": "rl.sampling.SerialSampler"})
    cfg["_partial_"] = True
    if num_envs is not None:
        cfg["num_envs"] = num_envs
    kwargs: dict[str, Any] = {"task": dict(task), "seed": seed}
    if episode_seeds is not None:
        kwargs["episode_seeds"] = list(episode_seeds)
    return hydra.utils.instantiate(cfg)(**kwargs)  # type: ignore[no-any-return]
