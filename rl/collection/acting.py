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

__all__ = ["ExpertActor", "NoExpertError", "PolicyActor", "policy_step"]


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


def actions_for(
    step: Mapping[str, Any],
    actions: torch.Tensor,
    to_host: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray | torch.Tensor:
    """``actions`` as the sampler that returned ``step`` takes them.

    A sampler whose steps live on the actions' accelerator (a batched environment on the GPU)
    takes the tensor where it is: nothing goes to the host. Every sampler takes NumPy
    (a CPU tensor's is a view, not a copy); ``to_host`` brings accelerator actions to the host
    (None: ``Tensor.cpu``; collection's pinned copy, :class:`~rl.utils.staging.PinnedTransfers`).
    """
    if actions.device.type != "cpu":
        first = next(iter(step["obs"].values()), None)
        if isinstance(first, torch.Tensor) and first.device == actions.device:
            return actions
        actions = actions.cpu() if to_host is None else to_host(actions)
    return actions.numpy()


class PolicyActor:
    """A policy acting for ``num_envs`` environments, its state and episode starts carried.

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
        self.model, self.device = model, torch.device(device)
        self.deterministic, self.generator, self.normalizer = deterministic, generator, normalizer
        self.state = model.initial_state(num_envs, self.device)
        self.starts = torch.ones(num_envs, dtype=torch.bool, device=self.device)

    def act(self, step: Mapping[str, Any]) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step["obs"]`` (``[N, ...]`` arrays or tensors).

        As the sampler takes them (:func:`actions_for`).
        """
        obs = {k: torch.as_tensor(v).to(self.device) for k, v in step["obs"].items()}
        actions, self.state = policy_step(
            self.model, obs, self.starts, self.state,
            deterministic=self.deterministic, generator=self.generator,
            normalizer=self.normalizer,
        )  # fmt: skip
        self.starts = torch.zeros_like(self.starts)
        return actions_for(step, actions)

    def advance(self, result: Mapping[str, Any], keep: torch.Tensor | None = None) -> None:
        """Episode starts where ``result`` ended one; environments not in ``keep`` dropped."""
        done = torch.as_tensor(result["terminated"]) | torch.as_tensor(result["truncated"])
        self.starts = done.to(self.device)
        if keep is not None:
            mask = keep.to(self.device)
            self.starts, self.state = self.starts[mask], self.state[mask]
