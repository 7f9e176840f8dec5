"""Named losses that pipeline stages combine with weights.

The policy's objectives (PPO, A2C, imitation) and auxiliary losses with heads of their own
(:mod:`rl.losses.auxiliary`: inverse dynamics, CPC|A, depth prediction).
"""

from rl.losses.a2c import A2CLoss
from rl.losses.auxiliary import AuxiliaryLoss, LossBindError, bind_losses
from rl.losses.base import Loss, LossOutput, explained_variance
from rl.losses.cpca import CPCALoss
from rl.losses.depth import DepthPredictionLoss
from rl.losses.imitation import ImitationLoss
from rl.losses.inverse_dynamics import InverseDynamicsLoss
from rl.losses.ppo import PPOLoss

__all__ = [
    "A2CLoss",
    "AuxiliaryLoss",
    "LossBindError",
    "CPCALoss",
    "DepthPredictionLoss",
    "ImitationLoss",
    "InverseDynamicsLoss",
    "Loss",
    "LossOutput",
    "PPOLoss",
    "bind_losses",
    "explained_variance",
]
