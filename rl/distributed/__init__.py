"""Distributed training over processes and machines (torch.distributed; gloo or nccl).

``launch`` starts the ranks, ``setup`` joins them in a process group, ``reduce`` holds the
collectives, ``preemption`` ends stragglers' rollouts early (DD-PPO).
"""

from rl.distributed.preemption import RolloutPreemption
from rl.distributed.reduce import (
    advantage_stats,
    all_reduce_sum,
    average_gradients,
    distributed_weighted_sum,
    is_distributed,
    weighted_mean,
)
from rl.distributed.settings import DistributedSettings, distributed_errors
from rl.distributed.setup import (
    DistContext,
    init_distributed,
    synchronize_model,
    teardown,
)

__all__ = [
    "DistContext",
    "DistributedSettings",
    "RolloutPreemption",
    "advantage_stats",
    "all_reduce_sum",
    "average_gradients",
    "distributed_errors",
    "distributed_weighted_sum",
    "init_distributed",
    "is_distributed",
    "synchronize_model",
    "teardown",
    "weighted_mean",
]
