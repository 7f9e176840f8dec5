"""Rollout storage (a TensorDict of time-major rows), advantage estimators, expert data."""

from rl.storage.estimators import (
    GAE,
    AdvantageEstimator,
    DiscountedReturns,
    VTrace,
    compute_discounted_returns,
    compute_gae,
    compute_vtrace,
)
from rl.storage.expert_data import (
    ExpertTrajectoryIterator,
    expert_batch,
    generate_expert_trajectories,
)
from rl.storage.rollout import RolloutStorage, advantage_stats_of, sequence_start_state

__all__ = [
    "GAE",
    "AdvantageEstimator",
    "DiscountedReturns",
    "ExpertTrajectoryIterator",
    "RolloutStorage",
    "VTrace",
    "advantage_stats_of",
    "compute_discounted_returns",
    "compute_gae",
    "compute_vtrace",
    "expert_batch",
    "generate_expert_trajectories",
    "sequence_start_state",
]
