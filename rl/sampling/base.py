"""The sampler interface the engine drives, and what one step returns."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np


@dataclasses.dataclass
class EpisodeRecord:
    """One finished episode.

    Attributes:
        env_index: Global index of the environment that ran it.
        metrics: ``return``, ``length`` and the task's own ``info["episode_metrics"]``.
        episode_seed: The seed the episode was reset with (evaluation mode), else None.
    """

    env_index: int
    metrics: dict[str, float]
    episode_seed: int | None = None


@dataclasses.dataclass
class StepBatch:
    """What a sampler returns for one step of its (active) environments, ``[N, ...]`` arrays.

    ``obs`` is the observation to act on next: for an environment whose episode just ended it is
    already the first observation of its next episode (auto-reset); the last observation of a
    truncated episode is in ``final_obs`` so its value can be bootstrapped.

    Attributes:
        obs: Next observations by key.
        rewards: ``[N]`` float32.
        terminated: ``[N]`` bool.
        truncated: ``[N]`` bool (never both).
        expert_actions: ``[N]`` int64, -1 where the task gives none.
        final_obs: Last observations of the truncated episodes by key, ``[K, ...]``.
        final_obs_indices: ``[K]`` positions (in this batch) of those environments.
        episodes: Episodes that finished in this step.
        paused: ``[N]`` bool (evaluation mode): the environment ran out of episodes and leaves
            the active set after this step; its ``obs`` row is meaningless.
    """

    obs: dict[str, np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    expert_actions: np.ndarray
    final_obs: dict[str, np.ndarray]
    final_obs_indices: np.ndarray
    episodes: list[EpisodeRecord]
    paused: np.ndarray


# The most environments one sampler runs: far above any experiment (16 to 256), far below what
# exhausts memory before the first step (100,000 ran 176 s into a MemoryError).
MAX_NUM_ENVS = 4096


class Sampler(abc.ABC):
    """A batch of environments stepped together.

    Training mode auto-resets forever; evaluation mode (``episode_seeds`` given) runs each
    environment through its share of a fixed list of seeded episodes and then pauses it.
    """

    num_envs: int
    observation_space: gym.spaces.Dict
    action_space: gym.Space

    @abc.abstractmethod
    def reset(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Reset every environment; return ``(obs [N, ...], expert_actions [N])``."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> StepBatch:
        """Step the active environments with ``actions`` (``[N_active]`` int)."""

    @property
    @abc.abstractmethod
    def num_active(self) -> int:
        """Environments still running (all of them in training mode)."""

    def new_episodes(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Cut every environment's episode and start a new one (training mode).

        AllenAct's forced scene advance (``advance_scene_rollout_period``): the interrupted
        episodes are not reported as finished. Returns ``(obs [N, ...], expert_actions [N])``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot start new episodes on demand")

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environments (idempotent)."""

    def state_dict(self) -> dict[str, Any]:
        """What is needed to restore the episodes in flight (for exact resume).

        The result must load with ``torch.load(weights_only=True)`` (plain containers, numbers,
        strings, tensors). Samplers that cannot do this keep this default, and a resumed run
        starts fresh episodes instead.

        Raises:
            NotImplementedError: This sampler cannot save its episodes in flight.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot save its episodes in flight (no state_dict); "
            "a resumed run starts fresh episodes"
        )

    def load_state_dict(self, state: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Restore the episodes in flight saved by :meth:`state_dict` (instead of :meth:`reset`).

        Args:
            state: What :meth:`state_dict` returned, on a sampler built with the same arguments.

        Returns:
            ``(obs [N, ...], expert_actions [N])`` as :meth:`reset` returns them: the
            observations the saved sampler was about to act on.

        Raises:
            NotImplementedError: This sampler cannot restore episodes.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot restore episodes in flight (no load_state_dict)"
        )

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
