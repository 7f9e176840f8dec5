"""Rollout storage, advantage estimation, and stored expert trajectories."""

from rl.storage.advantages import compute_discounted_returns, compute_gae
from rl.storage.expert_data import (
    ExpertBatch,
    ExpertTrajectoryIterator,
    generate_expert_trajectories,
)
from rl.storage.rollout import RolloutBatch, RolloutStorage

__all__ = [
    "ExpertBatch",
    "ExpertTrajectoryIterator",
    "RolloutBatch",
    "RolloutStorage",
    "compute_discounted_returns",
    "compute_gae",
    "generate_expert_trajectories",
]
