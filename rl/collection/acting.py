"""The one policy step outside training: evaluation, probe videos and the inference agent.

:func:`policy_step` is that step: the run's observation normalisation applied (frozen), then
the policy's action, argmax or drawn. :class:`PolicyActor` takes it for ``N`` environments, the
recurrent state and the episode starts carried from one step to the next, environments that
are done dropped from the batch (their state too). Fixed episode lists
(:func:`~rl.collection.episodes.evaluate_policy`), probe videos
(:func:`~rl.evaluation.video.record_episode`) and :class:`~rl.evaluation.InferenceAgent` all
act through it, so a policy acts the same wherever it runs; :class:`ExpertActor` is the task's
expert in the same place of the same loop (:func:`~rl.collection.episodes.evaluate_expert`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.normalization import Normalizer
from rl.models.policy import ACTIONS, NEXT_STATE, Policy, policy_input
from rl.sampling.runner import ExpertActor, NoExpertError

__all__ = [
    "ExpertActor",
    "NoExpertError",
    "PolicyActor",
    "actions_for",
    "policy_step",
    "steps_device",
]


@torch.no_grad()
def policy_step(
    model: Policy,
    obs: Mapping[str, torch.Tensor],
    starts: torch.Tensor,
    state: TensorDict,
    *,
    deterministic: bool,
    generator: torch.Generator | None = None,
    normalizer: Normalizer | None = None,
) -> tuple[torch.Tensor, TensorDict]:
    """The one policy step: ``(actions [N, ...], the state after)`` for ``[N, ...]`` inputs.

    The observations are normalised as the run normalised them (``normalizer``, frozen), then
    the policy acts: the argmax (``deterministic``) or a draw from ``generator``.
    """
    if normalizer is not None:
        obs = normalizer.observations(obs)
    step = model.act(
        policy_input(obs, starts, state), deterministic=deterministic, generator=generator
    )
    return step.get(ACTIONS), step.get(NEXT_STATE)


def steps_device(step: Mapping[str, Any]) -> torch.device:
    """Where a sampler's ``step`` lives (its observations'; NumPy: the CPU)."""
    first = next(iter(step["obs"].values()), None)
    return first.device if isinstance(first, torch.Tensor) else torch.device("cpu")


def actions_for(
    actions: torch.Tensor,
    steps_on: torch.device,
    to_host: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray | torch.Tensor:
    """``actions`` as a sampler whose steps live ``steps_on`` takes them.

    A sampler whose steps live on the actions' accelerator (a batched environment on the GPU)
    takes the tensor where it is: nothing goes to the host. Every sampler takes NumPy
    (a CPU tensor's is a view, not a copy); ``to_host`` brings accelerator actions to the host
    (None: ``Tensor.cpu``; collection's pinned copy, :class:`~rl.utils.staging.PinnedTransfers`).
    """
    if actions.device.type != "cpu":
        if steps_on == actions.device:
            return actions
        actions = actions.cpu() if to_host is None else to_host(actions)
    return actions.numpy()


class PolicyActor:
    """A policy acting for ``num_envs`` environments; its state and episode starts in the step.

    :meth:`start` makes its first step of a sampler's reset (the observations on ``device``,
    normalised, every environment starting an episode, the policy's initial state); the policy
    writes into the step (:meth:`act`), and :meth:`next_step` makes the next one of the
    sampler's result, the state after and the episode starts carried, environments that are done
    dropped (their state too).

    Args:
        model: The policy (put in eval mode by the caller where it matters).
        num_envs: Environments it acts for (each starts an episode).
        device: Where the model runs.
        deterministic: Argmax actions instead of sampled ones.
        generator: Generator of sampled actions (None: the global one).
        normalizer: The run's observation normalisation, applied frozen (None: none).
    """

    def __init__(
        self,
        model: Policy,
        num_envs: int,
        *,
        device: torch.device | str,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        normalizer: Normalizer | None = None,
    ) -> None:
        self.model, self.num_envs, self.device = model, num_envs, torch.device(device)
        self.deterministic, self.generator, self.normalizer = deterministic, generator, normalizer
        self.steps_on = torch.device("cpu")  # where the sampler's steps live (start says)

    def _obs(self, step: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        obs = {k: torch.as_tensor(v).to(self.device) for k, v in step["obs"].items()}
        return obs if self.normalizer is None else dict(self.normalizer.observations(obs))

    def start(self, first: Mapping[str, Any]) -> TensorDict:
        """The first step, of a sampler's reset ``first`` (``[N, ...]`` arrays or tensors)."""
        starts = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.steps_on = steps_device(first)
        state = self.model.initial_state(self.num_envs, self.device)
        return policy_input(self._obs(first), starts, state)

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step``, as the sampler takes them (:func:`actions_for`)."""
        with torch.no_grad():
            self.model.act(step, deterministic=self.deterministic, generator=self.generator)
        return actions_for(step.get(ACTIONS), self.steps_on)

    def next_step(
        self, step: TensorDict, result: Mapping[str, Any], keep: torch.Tensor | None = None
    ) -> TensorDict:
        """Episode starts where ``result`` ended one, the state after; ``keep`` stays."""
        done = torch.as_tensor(result["terminated"]) | torch.as_tensor(result["truncated"])
        obs, done, state = self._obs(result), done.to(self.device), step.get(NEXT_STATE)
        if keep is not None:
            mask = keep.to(self.device)
            obs, done, state = {k: v[mask] for k, v in obs.items()}, done[mask], state[mask]
        return policy_input(obs, done, state)
