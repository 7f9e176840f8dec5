"""The batched-environment contract: N environments stepped at once, tensors in, tensors out.

A :class:`BatchedEnv` runs ``num_envs`` environments of one task on one device. Actions come in
as one tensor, and one ``TensorDict`` of ``N`` rows comes out; an episode that ends is reset
inside the same call (auto-reset), so the returned observation row is already the next
episode's first, with the ended episode's last observation in ``final_obs`` where it was
truncated (its value is bootstrapped from it). Nothing is copied to the host per step: an
environment written in torch on a GPU keeps everything there.

:class:`~rl.sampling.batched.BatchedSampler` turns one into a
:class:`~rl.sampling.base.Sampler` (seeds, evaluation episode lists, finished-episode records,
finite checks, exact resume). Implementations: the grid PointNav written in torch
(:mod:`rl_envs.pointnav.batched`), any ``gymnasium.vector.VectorEnv`` (:mod:`rl.tasks.gym_vector`),
and a researcher's own.
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

# The entry of a step holding the task's metrics of the episodes that ended in it.
EPISODE_KEY = "episode"


class BatchedEnv(abc.ABC):
    """``num_envs`` environments of one task, stepped together on :attr:`device`.

    Attributes:
        num_envs: How many environments.
        device: Where observations, actions and everything returned live.
        observation_space: One environment's observations: a flat ``gymnasium.spaces.Dict``
            (what samplers hand policies; a key's rows are ``[N, *space.shape]``).
        action_space: One environment's action space.
        step_fields: The task's per-step fields (:mod:`rl.tasks.fields`), returned beside
            the observations they came with (``expert_actions``, ...).
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
            Batch ``[N]``: ``obs`` (by key) and the task's step fields (a
            :attr:`~rl.tasks.fields.StepField.transition` field: its ``missing`` value).
        """

    @abc.abstractmethod
    def step(
        self, actions: torch.Tensor, next_seeds: Sequence[int | None] | None = None
    ) -> TensorDict:
        """Step every environment; those whose episode ends start the next one at once.

        Args:
            actions: ``[N, *action_shape]`` on :attr:`device`.
            next_seeds: The seed of the episode an environment starts if its episode ends in
                this step (None, or a None entry: its own random stream). Evaluation passes
                each environment's next episode of its list.

        Returns:
            Batch ``[N]``, as :func:`rl.sampling.base.step_tensordict` describes a step:
            ``obs`` (the next episode's first where one ended), ``rewards`` (float32; or
            float64, which the sampler sums into returns before it casts them: an adapter
            over Python environments keeps their own values), ``terminated`` and
            ``truncated`` (bool, never both), ``final_obs`` (the last observation of each
            episode that was truncated, zeros in other rows; it may be left out of a step
            where none was), the task's step fields (with the returned observations; a
            :attr:`~rl.tasks.fields.StepField.transition` field: the step's own), and
            ``episode``: the task's metrics of the episodes that ended (floats by name, e.g.
            ``success``, ``spl``; NaN where an ended episode has no such metric; rows where
            none ended hold nothing meaningful; it may be left out of a step where none
            ended). Returns and lengths are the sampler's to count.
        """

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight, exactly (``torch.load(weights_only=True)``-safe).

        Raises:
            NotImplementedError: This environment cannot save its episodes in flight.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot save its episodes in flight")

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore what :meth:`state_dict` saved; return what :meth:`reset` returns.

        Raises:
            NotImplementedError: This environment cannot restore episodes.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot restore episodes in flight")

    def render(self, index: int = 0) -> Any:
        """An RGB frame of environment ``index`` (None: this environment does not render)."""
        return None

    def close(self) -> None:  # noqa: B027  (nothing to release by default)
        """Release what the environments hold (idempotent)."""
