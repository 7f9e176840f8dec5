"""Named losses that pipeline stages combine with weights."""

from rl.losses.base import Loss, LossOutput, explained_variance
from rl.losses.ppo import PPOLoss

__all__ = ["Loss", "LossOutput", "PPOLoss", "explained_variance"]
