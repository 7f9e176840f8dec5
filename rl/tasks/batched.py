"""The batched-environment contract: N environments stepped at once, tensors in, tensors out.

A :class:`BatchedEnv` runs ``num_envs`` environments of one task on one device and resets an
episode that ends inside the same call (auto-reset); nothing is copied to the host per step.
Implementations: the torch grid PointNav (:mod:`rl_envs.pointnav.batched`), any gymnasium
``VectorEnv`` (:mod:`rl.tasks.gym_vector`), and one's own (docs/concepts/samplers.md).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDict

from rl.tasks.fields import StepField

__all__ = ["BatchedEnv", "EPISODE_KEY"]

EPISODE_KEY = "episode"  # a step's metrics of the episodes that ended in it


class BatchedEnv(abc.ABC):
    """``num_envs`` environments of one task, stepped together on :attr:`device`.

    Attributes:
        device: Where observations, actions and everything returned live.
        observation_space: One environment's observations: a flat ``gymnasium.spaces.Dict``.
        action_space: One environment's action space.
        step_fields: The task's per-step fields (:mod:`rl.tasks.fields`).
    """

    num_envs: int
    device: torch.device
    observation_space: gym.spaces.Dict
    action_space: gym.Space
    step_fields: dict[str, StepField]

    @abc.abstractmethod
    def reset(self, seeds: Sequence[int | None]) -> TensorDict:
        """Start a new episode in every environment.

        Args:
            seeds: One per environment: the episode's seed, or None to go on with the
                environment's own random stream (an unseeded ``gymnasium`` reset).

        Returns:
            Batch ``[N]``: ``obs`` (by key) and the task's step fields (a transition field:
            its ``missing`` value).
        """

    @abc.abstractmethod
    def step(
        self, actions: torch.Tensor, next_seeds: Sequence[int | None] | None = None
    ) -> TensorDict:
        """Step every environment; those whose episode ends start the next one at once.

        Args:
            actions: ``[N, *action_shape]`` on :attr:`device`.
            next_seeds: The seed of the episode an environment starts if its episode ends in
                this step (None, or a None entry: its own random stream).

        Returns:
            Batch ``[N]``, as :func:`rl.sampling.base.step_tensordict` describes a step:
            ``obs`` (the next episode's first where one ended), ``rewards`` (float32, or
            float64 as Python environments give them), ``terminated`` and ``truncated``
            (never both), ``final_obs`` (each truncated episode's last observation, zeros in
            other rows; may be left out where none was), the task's step fields, and
            ``episode`` (:data:`EPISODE_KEY`): the ended episodes' metrics, floats by name
            (NaN where an ended episode has no such metric; may be left out where none
            ended).
        """

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight, exactly (``torch.load(weights_only=True)``-safe)."""
        raise NotImplementedError(f"{type(self).__name__} cannot save its episodes in flight")

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore what :meth:`state_dict` saved; return what :meth:`reset` returns.

        ``state`` may come from someone else's checkpoint: check each value's kind, shape and
        range before using it (:func:`rl.utils.saved.saved_tensor`), and raise ``ValueError``
        naming it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot restore episodes in flight")

    def render(self, index: int = 0) -> Any:
        """An RGB frame of environment ``index`` (None: this environment does not render)."""
        return None

    def close(self) -> None:  # noqa: B027  (nothing to release by default)
        """Release what the environments hold (idempotent)."""
