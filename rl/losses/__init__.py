"""Named losses that pipeline stages combine with weights."""

from rl.losses.a2c import A2CLoss
from rl.losses.base import Loss, LossOutput, explained_variance
from rl.losses.imitation import ImitationLoss
from rl.losses.ppo import PPOLoss

__all__ = ["A2CLoss", "ImitationLoss", "Loss", "LossOutput", "PPOLoss", "explained_variance"]
