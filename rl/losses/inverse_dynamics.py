"""Inverse dynamics: predict ``a_t`` from the embeddings of ``o_t`` and ``o_{t+1}``.

Pathak et al. 2017's inverse model (an auxiliary task of Ye et al. 2020 for PointNav): it rewards
an embedding that sees what the actions change, which a navigation reward teaches slowly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import gymnasium as gym
import torch
from tensordict import TensorDict
from torch import nn

from rl.losses.auxiliary import AuxiliaryLoss, discrete_actions, mlp, same_episode
from rl.losses.base import LossOutput
from rl.models.policy import PolicyOutput
from rl.utils.config import Check


class InverseDynamicsLoss(AuxiliaryLoss):
    """Cross-entropy of ``a_t`` predicted from ``[phi(o_t), phi(o_{t+1})]``.

    Pairs whose second step starts a new episode are left out (the action ended the episode:
    there is no next observation of it). Needs a ``Discrete`` action space.

    Args:
        feature: The policy feature ``phi`` (:data:`~rl.losses.auxiliary.POLICY_FEATURES`).
        hidden_size: Hidden layer of the classifier (0: linear).
    """

    def __init__(
        self,
        *,
        feature: str = "visual",
        hidden_size: Annotated[int, Check(ge=0)] = 256,
    ) -> None:
        super().__init__()
        self.feature_key = feature
        self.hidden_size = hidden_size
        self.head: nn.Module = nn.Identity()

    def build(
        self,
        *,
        features: Mapping[str, int],
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
    ) -> None:
        """A classifier ``[2F] -> [hidden] -> [num_actions]``."""
        size = self.feature_size(features, self.feature_key, "feature")
        actions = discrete_actions(self, action_space)
        # The first layer on [phi_t, phi_t+1] is W_0 phi_t + W_1 phi_t+1: one matmul of every
        # step's phi by [W_0; W_1], then a sum per pair.
        first = self.hidden_size or actions
        self.pair_layer = nn.Linear(size, 2 * first)
        self.head = mlp([self.hidden_size, actions]) if self.hidden_size else nn.Identity()

    def forward(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Mean cross-entropy over the pairs of consecutive steps of one episode."""
        phi = self.feature(output, self.feature_key)  # [T, n, F]
        valid = same_episode(batch["episode_starts"], 1)[:, 0]  # [T, n]: t + 1 in t's episode
        pairs = valid[:-1]  # [T - 1, n]
        if not bool(pairs.any()):  # no pair in this minibatch: zero, with zero gradients
            return LossOutput(
                total=phi.sum() * 0.0, terms={"inverse_dynamics_loss": 0.0}, diagnostics={}
            )
        now, after = self.pair_layer(phi).chunk(2, dim=-1)  # [T, n, D] each
        first = (now[:-1] + after[1:])[pairs]  # [P, D]
        logits = self.head(torch.relu(first)) if self.hidden_size else first
        target = batch["actions"][:-1][pairs].long()
        loss = nn.functional.cross_entropy(logits, target)
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == target).float().mean()
        return LossOutput(
            total=loss,
            terms={"inverse_dynamics_loss": loss.item()},
            diagnostics={"accuracy": accuracy.item()},
        )
