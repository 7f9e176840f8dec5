"""Rollout storage and advantage estimation."""

from rl.storage.advantages import compute_discounted_returns, compute_gae
from rl.storage.rollout import RolloutBatch, RolloutStorage

__all__ = ["RolloutBatch", "RolloutStorage", "compute_discounted_returns", "compute_gae"]
