"""CPC|A: contrastive prediction of future embeddings given the actions taken.

Guo et al. 2018, "Neural Predictive Belief Representations" (Ye et al. 2020's strongest auxiliary
task for PointNav). A GRU rolls the actions ``a_t .. a_{t+k-1}`` forward from the belief ``b_t``;
a classifier tells the real ``o_{t+k}``'s embedding from other steps' (negatives).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import gymnasium as gym
import torch
from tensordict import TensorDict
from torch import nn

from rl.losses.auxiliary import AuxiliaryLoss, discrete_actions, same_episode
from rl.losses.base import LossOutput
from rl.models.policy import PolicyOutput
from rl.utils.config import Check


class CPCALoss(AuxiliaryLoss):
    """Binary cross-entropy of real vs. drawn future embeddings, ``horizon`` steps ahead.

    Negatives are ``phi`` of steps drawn uniformly from the minibatch by the global torch
    generator (checkpoints resume it exactly). The loss is the mean BCE of the positives plus
    that of the negatives, over the ``(t, k)`` whose ``t + k`` is in ``t``'s episode and the
    minibatch's sequence. Needs a ``Discrete`` action space.

    Args:
        horizon: How many steps ahead (Ye et al.'s CPC|A-k).
        feature: The predicted feature ``phi`` (``visual`` by default).
        belief: The feature predicting from (``belief``: the recurrent layers' output).
        num_negatives: Negatives per positive.
        action_embed_dim: Size of the action embedding fed to the action GRU.
        hidden_size: Hidden layer of the classifier on ``[z, phi]``.
    """

    def __init__(
        self,
        *,
        horizon: Annotated[int, Check(ge=1)] = 4,
        feature: str = "visual",
        belief: str = "belief",
        num_negatives: Annotated[int, Check(ge=1)] = 2,
        action_embed_dim: Annotated[int, Check(ge=1)] = 32,
        hidden_size: Annotated[int, Check(ge=1)] = 128,
    ) -> None:
        super().__init__()
        self.horizon = horizon
        self.feature_key = feature
        self.belief_key = belief
        self.num_negatives = num_negatives
        self.action_embed_dim = action_embed_dim
        self.hidden_size = hidden_size

    def build(
        self,
        *,
        features: Mapping[str, int],
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
    ) -> None:
        """The action embedding, the action GRU (state: the belief) and the classifier."""
        phi_size = self.feature_size(features, self.feature_key, "feature")
        belief_size = self.feature_size(features, self.belief_key, "belief")
        self.action_embed = nn.Embedding(
            discrete_actions(self, action_space), self.action_embed_dim
        )
        self.action_rnn = nn.GRU(self.action_embed_dim, belief_size)
        # The classifier's first layer on [z, phi] is W_z z + W_phi phi, applied to each term
        # apart: phi once per step of the minibatch, not once per pair.
        self.z_layer = nn.Linear(belief_size, self.hidden_size)
        self.phi_layer = nn.Linear(phi_size, self.hidden_size, bias=False)
        self.out_layer = nn.Linear(self.hidden_size, 1)

    def forward(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Mean BCE of positives plus mean BCE of negatives over the valid ``(t, k)``."""
        phi = self.feature(output, self.feature_key)  # [T, n, F]
        belief = self.feature(output, self.belief_key)  # [T, n, H]
        t_len, n, _ = phi.shape
        k_len = min(self.horizon, t_len - 1)
        valid = same_episode(batch["episode_starts"], max(k_len, 1))  # [T, K, n]
        if k_len < 1 or not bool(valid.any()):
            zero = phi.sum() * 0.0 + belief.sum() * 0.0
            return LossOutput(total=zero, terms={"cpca_loss": 0.0}, diagnostics={})
        steps = torch.arange(t_len, device=phi.device).unsqueeze(1)
        # Actions a_{t+j}, j = 0..K-1 (clamped past the end: those (t, k) are invalid anyway).
        acting = (steps + torch.arange(k_len, device=phi.device)).clamp(max=t_len - 1)  # [T, K]
        actions = batch["actions"].long()[acting]  # [T, K, n]
        inputs = self.action_embed(actions).permute(1, 0, 2, 3).reshape(k_len, t_len * n, -1)
        h0 = belief.reshape(1, t_len * n, -1).contiguous()
        z, _ = self.action_rnn(inputs, h0)  # [K, T * n, H]: after a_t .. a_{t+k-1}
        z = z.view(k_len, t_len, n, -1).transpose(0, 1)  # [T, K, n, H]
        target = (steps + torch.arange(1, k_len + 1, device=phi.device)).clamp(max=t_len - 1)
        projected = self.phi_layer(phi)  # [T, n, D]
        drawn = torch.randint(t_len * n, (self.num_negatives, t_len, k_len, n), device=phi.device)
        z_part = self.z_layer(z)  # [T, K, n, D]

        def logits(phi_part: torch.Tensor) -> torch.Tensor:
            return self.out_layer(torch.relu(z_part + phi_part))[..., 0]

        pos_logits = logits(projected[target])  # [T, K, n]: o_{t+k}
        neg_logits = logits(projected.reshape(t_len * n, -1)[drawn])  # [M, T, K, n]
        bce = nn.functional.binary_cross_entropy_with_logits
        pos_loss = bce(pos_logits[valid], torch.ones_like(pos_logits[valid]))
        neg_valid = valid.expand(self.num_negatives, -1, -1, -1)
        neg_loss = bce(neg_logits[neg_valid], torch.zeros_like(neg_logits[neg_valid]))
        loss = pos_loss + neg_loss
        with torch.no_grad():
            accuracy = 0.5 * (
                (pos_logits[valid] > 0).float().mean() + (neg_logits[neg_valid] < 0).float().mean()
            )
        return LossOutput(
            total=loss,
            terms={
                "cpca_loss": loss.item(),
                "positive_loss": pos_loss.item(),
                "negative_loss": neg_loss.item(),
            },
            diagnostics={"accuracy": accuracy.item()},
        )
