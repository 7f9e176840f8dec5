"""Depth prediction: decode a coarse depth map from the policy's embedding of the RGB image.

The encoder learns geometry that a navigation reward teaches slowly, so an RGB agent learns from
depth without seeing it. The task must give depth (``task.depth=true`` for nav3d) and the policy
must ignore it (``model.ignore_keys=[depth]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated

import gymnasium as gym
import numpy as np
from tensordict import TensorDict
from torch import nn

from rl.losses.auxiliary import AuxiliaryLoss, mlp
from rl.losses.base import LossOutput
from rl.models.policy import PolicyOutput
from rl.utils.config import Check


class DepthPredictionLoss(AuxiliaryLoss):
    """Mean absolute error of the predicted coarse depth map, in units of the maximum depth.

    Args:
        key: The depth observation entry (``[H, W, 1]`` floats, metres).
        feature: The policy feature decoded (``visual``: with ``model.ignore_keys=[depth]``,
            the RGB encoder's output).
        size: ``[height, width]`` of the predicted map (the depth image average-pooled).
        hidden_size: Hidden layer of the decoder (0: linear).
    """

    def __init__(
        self,
        *,
        key: str = "depth",
        feature: str = "visual",
        size: Sequence[int] = (15, 20),
        hidden_size: Annotated[int, Check(ge=0)] = 0,
    ) -> None:
        super().__init__()
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"DepthPredictionLoss: size must be [height, width], got {size}")
        self.key = key
        self.feature_key = feature
        self.size = (int(size[0]), int(size[1]))
        self.hidden_size = hidden_size
        self.scale = 1.0
        self.decoder: nn.Module = nn.Identity()

    def build(
        self,
        *,
        features: Mapping[str, int],
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
    ) -> None:
        """A decoder ``[F] -> [hidden] -> [height * width]``; depth scaled by the space's max."""
        space = observation_space.spaces.get(self.key)
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3 or space.shape[2] != 1:
            raise ValueError(
                f"{self.name}: the task has no depth image {self.key!r} ([H, W, 1] Box; it has "
                f"{sorted(observation_space.spaces)}): for nav3d set task.depth=true, and "
                f"model.ignore_keys=[{self.key}] so that the policy predicts what it does not see"
            )
        high = float(np.max(space.high))
        self.scale = 1.0 / high if math.isfinite(high) and high > 0 else 1.0
        size = self.feature_size(features, self.feature_key, "feature")
        hidden = [self.hidden_size] if self.hidden_size else []
        self.decoder = mlp([size, *hidden, self.size[0] * self.size[1]])

    def forward(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """L1 between the decoded map and the pooled depth image, over every step."""
        phi = self.feature(output, self.feature_key)  # [T, n, F]
        depth = batch["obs", self.key]  # [T, n, H, W, 1]
        t_len, n = depth.shape[:2]
        target = (
            nn.functional.adaptive_avg_pool2d(
                depth.reshape(t_len * n, 1, *depth.shape[2:4]).float(), self.size
            ).view(t_len, n, -1)
            * self.scale
        )
        predicted = self.decoder(phi)
        loss = (predicted - target).abs().mean()
        return LossOutput(total=loss, terms={"depth_loss": loss.item()}, diagnostics={})
