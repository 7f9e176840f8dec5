"""A multiprocess sampler's child process: its block of environments and their shared rows.

Each child process of a :class:`~rl.sampling.MultiprocessSampler` serves one
:class:`SamplerProcess` through the process runtime (:class:`~rl.utils.processes.ChildProcesses`,
the same one process collection workers and validation use): a
:class:`~rl.sampling.SerialSampler` over its contiguous block of environments whose results go
straight into its rows of the sampler's shared arrays. Nothing but the step's finished episodes
comes back through the pipe.

The shared arrays (:class:`~rl.utils.shared_memory.SharedArrays`) are named by the step
``TensorDict``'s keys (:func:`~rl.sampling.base.step_tensordict`): observation key ``k`` is
``obs/k`` (:func:`obs_key`), its final observation ``final_obs/k`` (:func:`final_key`), a task's
step field its own name; :func:`step_key` turns a name back into the nested key.
:func:`sampler_array_specs` plans them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from tensordict import TensorDict

from rl.sampling.base import EpisodeRecord, finished_episodes
from rl.sampling.serial import SerialSampler
from rl.tasks.fields import StepField
from rl.tasks.spaces import action_array_spec
from rl.utils.shared_memory import SharedArrays

__all__ = ["SamplerProcess", "final_key", "obs_key", "sampler_array_specs", "step_key"]


def obs_key(key: str) -> str:
    """The shared array holding observation ``key``."""
    return f"obs/{key}"


def final_key(key: str) -> str:
    """The shared array holding the final observation ``key`` of truncated episodes."""
    return f"final_obs/{key}"


def step_key(name: str) -> str | tuple[str, str]:
    """The step ``TensorDict`` key of shared array ``name`` (``obs/k`` -> ``("obs", "k")``)."""
    head, sep, tail = name.partition("/")
    return (head, tail) if sep else name


def sampler_array_specs(
    observation_space: gym.spaces.Dict,
    num_envs: int,
    action_space: gym.Space | None = None,
    step_fields: Mapping[str, StepField] | None = None,
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The sampler's shared arrays, ``name -> (shape, dtype)``, for :meth:`SharedArrays.plan`.

    Args:
        observation_space: The environments' (dict) observation space.
        num_envs: Rows of every array (one per environment).
        action_space: The environments' action space (None: one int64 action per row).
        step_fields: The task's step fields (:mod:`rl.tasks.fields`).

    Returns:
        An observation and a final-observation array per observation key, then the actions,
        rewards, termination/truncation and paused flags, then an array per step field.
    """
    n = num_envs
    action_shape: tuple[int, ...] = ()
    action_dtype: Any = np.int64
    if action_space is not None:
        action_shape, action_dtype = action_array_spec(action_space)
    specs: dict[str, tuple[tuple[int, ...], Any]] = {}
    for key, space in observation_space.spaces.items():
        shape = tuple(space.shape or ())
        specs[obs_key(key)] = ((n, *shape), space.dtype)
        specs[final_key(key)] = ((n, *shape), space.dtype)
    specs.update(
        actions=((n, *action_shape), action_dtype),
        rewards=((n,), np.float32),
        terminated=((n,), np.bool_),
        truncated=((n,), np.bool_),
        paused=((n,), np.bool_),
    )
    for key, field in (step_fields or {}).items():
        specs[key] = ((n, *field.shape), field.dtype)
    return specs


class SamplerProcess:
    """The object a sampler's child process serves: its environments, writing their shared rows.

    Args:
        raw: The sampler's shared block (a ``RawArray`` of bytes).
        layout: Its layout (:meth:`~rl.utils.shared_memory.SharedArrays.plan`).
        task: Plain (resolved) task config.
        row_offset: Shared-array row of this process's first environment.
        env_offset: Global index of its first environment.
        num_envs: Its environments.
        total_envs: Size of the global seed stream.
        seed: The sampler's seed.
        episode_seeds: Evaluation mode: this process's share of the episode seeds.
    """

    def __init__(
        self,
        *,
        raw: Any,
        layout: dict[str, tuple[int, tuple[int, ...], str]],
        task: dict[str, Any],
        row_offset: int,
        env_offset: int,
        num_envs: int,
        total_envs: int,
        seed: int | None,
        episode_seeds: list[int] | None,
    ) -> None:
        self.rows = _Rows(SharedArrays(raw, layout).arrays, row_offset)
        self.sampler = SerialSampler(
            task=task,
            num_envs=num_envs,
            seed=seed,
            episode_seeds=episode_seeds,
            env_offset=env_offset,
            total_envs=total_envs,
        )

    def step(self) -> list[EpisodeRecord] | None:
        """Step the active environments with their shared actions; write the results.

        Returns:
            The episodes that finished, or None if none did.
        """
        return self.rows.step(self.sampler)

    def reset(self) -> None:
        """Reset every environment; write the first observations."""
        self.rows.restart(self.sampler.num_envs, self.sampler.reset())

    def new_episodes(self) -> None:
        """Cut every episode and start new ones; write the first observations."""
        self.rows.restart(self.sampler.num_envs, self.sampler.new_episodes())

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight of this block (:meth:`SerialSampler.state_dict`)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this block's episodes; write what the saved sampler was about to act on."""
        self.rows.restart(self.sampler.num_envs, self.sampler.load_state_dict(state))

    def failure_site(self) -> tuple[str | None, int | None]:
        """The environment that was running when a call raised (global index)."""
        env = self.sampler.current_env
        return (None, None) if env is None else (f"environment {env}", env)

    def close(self) -> None:
        """Close the environments."""
        self.sampler.close()


def _is_final(key: str | tuple[str, str]) -> bool:
    return isinstance(key, tuple) and key[0] == "final_obs"


class _Rows:
    """One process's writer into its rows (``row_offset ..``) of the shared arrays.

    Every shared array but the actions and the final observations holds the step
    ``TensorDict`` entry of its name (:func:`step_key`), so a task's own step fields are written
    like the observations, with no list of fields here.

    Args:
        arrays: The shared arrays, by name.
        row_offset: Shared-array row of the process's first environment.
    """

    def __init__(self, arrays: dict[str, np.ndarray], row_offset: int) -> None:
        self.row_offset = row_offset
        self.actions, self.paused = arrays["actions"], arrays["paused"]
        self.per_step = [(a, step_key(k)) for k, a in arrays.items() if k != "actions"]
        self.finals = [(a, key) for a, key in self.per_step if _is_final(key)]
        self.per_step = [(a, key) for a, key in self.per_step if not _is_final(key)]
        # what a reset writes: the observations and the task's fields
        flags = ("rewards", "terminated", "truncated", "paused")
        self.on_reset = [(a, key) for a, key in self.per_step if key not in flags]

    def step(self, sampler: SerialSampler) -> list[EpisodeRecord] | None:
        rows = np.asarray(sampler.active_indices, dtype=np.int64) + self.row_offset
        step = sampler.step(self.actions[rows])
        for buf, key in self.per_step:
            buf[rows] = step.get(key).numpy()
        if "final_obs" in step.keys():
            truncated = step.get("truncated").numpy()
            for buf, key in self.finals:
                buf[rows[truncated]] = step.get(key).numpy()[truncated]
        return finished_episodes(step) or None

    def restart(self, num_envs: int, first: TensorDict) -> None:
        """Write the first observations (and fields) of all ``num_envs`` environments."""
        rows = np.arange(self.row_offset, self.row_offset + num_envs)
        for buf, key in self.on_reset:
            buf[rows] = first.get(key).numpy()
        self.paused[rows] = False
