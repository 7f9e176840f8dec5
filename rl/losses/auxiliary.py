"""Auxiliary losses: named pipeline losses that own a head (``torch.nn.Module``).

:func:`bind_losses` sizes each head from the policy's per-step features (:data:`POLICY_FEATURES`)
before training; docs/concepts/pipeline.md says how the optimizer and checkpoints treat them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from rl.losses.base import Loss, LossOutput
from rl.models.policy import Policy, PolicyOutput
from rl.utils.config import ConfigError

__all__ = [
    "POLICY_FEATURES",
    "AuxiliaryLoss",
    "LossBindError",
    "bind_losses",
    "loss_modules",
    "probe_features",
    "same_episode",
]

# The per-step features ActorCritic returns in PolicyOutput.extras, by name.
POLICY_FEATURES = {
    "visual": "the image encoders' outputs, concatenated (tasks with image observations)",
    "embedding": "the encoded observation after the trunk MLP (the recurrent layers' input)",
    "belief": "the recurrent layers' output (the heads' input; the embedding if memoryless)",
}


class LossBindError(ConfigError, ValueError):
    """An auxiliary loss that does not fit the policy or the task (a refused config)."""


class AuxiliaryLoss(nn.Module, Loss):
    """A loss with a head of its own, bound to the policy before use.

    Subclasses build their head in :meth:`build` and compute the loss in :meth:`forward`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bound = False

    @property
    def name(self) -> str:
        """How errors name this loss (its class)."""
        return type(self).__name__

    def bind(
        self,
        *,
        features: Mapping[str, int],
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
    ) -> None:
        """Build the head, once, for the policy's feature sizes and the task's spaces.

        Raises:
            ValueError: What the policy or the task lacks, and how to get it.
        """
        if self.bound:
            return
        self.build(
            features=features, observation_space=observation_space, action_space=action_space
        )
        self.bound = True

    @abc.abstractmethod
    def build(
        self,
        *,
        features: Mapping[str, int],
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
    ) -> None:
        """Create the head's modules (see :meth:`bind`)."""

    @abc.abstractmethod
    def forward(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """The loss on a minibatch ``[T, n]`` and the policy re-run on it."""

    def feature_size(self, features: Mapping[str, int], key: str, option: str) -> int:
        """The size of feature ``key``; a ValueError naming ``option`` when the policy lacks it."""
        if key not in features:
            raise ValueError(
                f"{self.name}: {option}={key!r} is not a feature of the policy (its extras "
                f"give {sorted(features) or 'none'}); ActorCritic gives "
                f"{', '.join(POLICY_FEATURES)} ('visual' needs an image observation)"
            )
        return features[key]

    def feature(self, output: PolicyOutput, key: str) -> torch.Tensor:
        """Feature ``key`` ``[T, n, F]`` of the policy's output."""
        value = output.extras.get(key)
        if value is None:
            raise ValueError(
                f"{self.name}: the policy's output has no {key!r} feature in its extras"
            )
        return value

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """:meth:`forward` through the module's hooks; a RuntimeError before :meth:`bind`."""
        if not self.bound:
            raise RuntimeError(
                f"{self.name} has no head yet: bind it to the policy first "
                "(rl.losses.bind_losses(pipeline.used_losses, policy, observation_space, "
                "action_space); the engine does this)"
            )
        return nn.Module.__call__(self, batch=batch, output=output, step_count=step_count)


def same_episode(episode_starts: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[T, horizon, n]``: whether step ``t + k`` (k = 1..horizon) is in step t's episode.

    False past the sequence's end and from the first episode start after ``t`` on.
    """
    t_len = episode_starts.shape[0]
    starts = torch.cumsum(episode_starts.long(), dim=0)  # episodes begun up to each step
    device = episode_starts.device
    ahead = torch.arange(t_len, device=device).unsqueeze(1) + torch.arange(
        1, horizon + 1, device=device
    )  # [T, K]
    inside = ahead < t_len
    later = starts[ahead.clamp(max=t_len - 1)]  # [T, K, n]
    return inside.unsqueeze(-1) & (later == starts.unsqueeze(1))


def loss_modules(losses: Mapping[str, Loss]) -> dict[str, nn.Module]:
    """The losses that own parameters or state (``torch.nn.Module`` losses), by name."""
    return {name: loss for name, loss in losses.items() if isinstance(loss, nn.Module)}


@torch.no_grad()
def probe_features(policy: Policy, observation_space: gym.spaces.Dict) -> dict[str, int]:
    """The size of each per-step feature in ``policy``'s extras (one step, its own sample)."""
    space = gym.spaces.Dict(dict(observation_space.spaces), seed=0)
    device = next((p.device for p in policy.parameters()), torch.device("cpu"))
    obs = {
        key: torch.as_tensor(np.asarray(value), device=device).reshape(1, 1, *np.shape(value))
        for key, value in space.sample().items()
    }
    starts = torch.ones(1, 1, dtype=torch.bool, device=device)
    output, _ = policy(obs, starts, policy.initial_state(1, device))
    return {key: int(np.prod(value.shape[2:])) for key, value in output.extras.items()}


def bind_losses(
    losses: Mapping[str, Loss],
    policy: Policy,
    observation_space: gym.spaces.Dict,
    action_space: gym.Space,
) -> list[nn.Parameter]:
    """Bind every auxiliary loss of ``losses`` to ``policy``; return their parameters.

    Heads are created on the policy's device from the global torch generator: call this at the
    same point of every run (the engine does) for reproducible runs.

    Raises:
        LossBindError: A loss refuses the policy or the task (naming its key).
    """
    aux = {name: loss for name, loss in losses.items() if isinstance(loss, AuxiliaryLoss)}
    if not aux:
        return []
    features = probe_features(policy, observation_space)
    device = next((p.device for p in policy.parameters()), torch.device("cpu"))
    params: list[nn.Parameter] = []
    for name, loss in aux.items():
        try:
            loss.bind(
                features=features, observation_space=observation_space, action_space=action_space
            )
        except ValueError as e:  # a feature or a space the loss needs: the config's fault
            raise LossBindError(f"pipeline.named_losses.{name}: {e}") from e
        loss.to(device)
        params += list(loss.parameters())
    return params


def discrete_actions(loss: AuxiliaryLoss, action_space: gym.Space) -> int:
    """The number of actions of a ``Discrete`` space; a ValueError naming ``loss`` otherwise."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"{loss.name}: needs a Discrete action space, the task has {action_space}"
        )
    return int(action_space.n)


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)
