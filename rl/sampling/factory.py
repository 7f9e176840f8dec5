"""Build any sampler from its (plain) config, for training or for an evaluation episode list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hydra.utils

from rl.sampling.agents import agent_rows
from rl.sampling.base import Sampler
from rl.utils.threads import auto_count


def sampler_num_envs(config: Mapping[str, Any]) -> int:
    """Total environments of a sampler config: ``num_envs``, else processes x envs each."""
    if config.get("num_envs") is not None:
        return int(config["num_envs"])
    processes = auto_count(config.get("num_processes", 1), None, "sampler.num_processes")
    return processes * int(config.get("envs_per_process", 1))


def build_sampler(
    config: Mapping[str, Any] | None,
    *,
    task: Mapping[str, Any],
    seed: int | None = 0,
    episode_seeds: Sequence[int] | None = None,
    num_envs: int | None = None,
    env_offset: int = 0,
    total_envs: int | None = None,
) -> Sampler:
    """Instantiate a plain sampler config (None: a ``SerialSampler``) for ``task``.

    Args:
        config: Plain sampler config (``_target_`` and its keys).
        task: Plain task config with a ``_target_``.
        seed: Seed of the environments' first resets (training mode).
        episode_seeds: Evaluation mode: the fixed episode list.
        num_envs: Overrides the config's environment count (e.g. ``eval.num_envs``).
        env_offset: Global index of the first environment (rank ``r`` of ranks with ``n``
            envs each: ``r * n``; they share one seed stream).
        total_envs: Size of that seed stream (default ``env_offset + num_envs``).

    Returns:
        The sampler (a context manager); a multi-agent task's has one row per agent
        (:class:`~rl.sampling.agents.AgentRows`).
    """
    cfg = dict(config or {"_target_": "rl.sampling.SerialSampler"})
    cfg["_partial_"] = True
    if num_envs is not None:
        cfg["num_envs"] = num_envs
    kwargs: dict[str, Any] = {"task": dict(task), "seed": seed}
    if episode_seeds is not None:
        kwargs["episode_seeds"] = list(episode_seeds)
    if env_offset or total_envs is not None:
        kwargs.update(env_offset=env_offset, total_envs=total_envs)
    sampler = hydra.utils.instantiate(cfg)(**kwargs)
    return agent_rows(sampler)
