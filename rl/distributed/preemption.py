"""Straggler preemption (DD-PPO; PyTorchRL's ``fraction_samples``) through the group's store.

Shortened rollouts are fine downstream: the gradient average weighs each rank by its batch
size. Polling costs one store round trip a step, once a rank has its minimum.
"""

from __future__ import annotations

import math

import torch.distributed as dist


class RolloutPreemption:
    """Per-rollout "how many ranks are done" counters in the process group's store.

    A straggler ends its rollout once ``sync_frac`` of the ``world_size`` ranks have finished
    theirs and it has at least ``min_rollout_frac`` of its steps.
    """

    metric = "distributed/rollout_frac"

    def __init__(
        self,
        *,
        sync_frac: float,
        min_rollout_frac: float,
        world_size: int,
        store: dist.Store | None = None,
    ) -> None:
        if not 0.0 < sync_frac <= 1.0:
            raise ValueError(f"distributed.sync_frac must be in (0, 1], got {sync_frac}")
        if not 0.0 <= min_rollout_frac <= 1.0:
            raise ValueError(
                f"distributed.min_rollout_frac must be in [0, 1], got {min_rollout_frac}"
            )
        self.min_rollout_frac = min_rollout_frac
        self.threshold = math.ceil(sync_frac * world_size - 1e-9)
        self.store = dist.distributed_c10d._get_default_store() if store is None else store
        self._key = ""

    def start(self, rollout_index: int) -> None:
        """Begin rollout ``rollout_index`` (the same sequence on every rank)."""
        self._key = f"rl/preempt/{rollout_index}"

    def min_steps(self, num_steps: int) -> int:
        """The fewest steps a rank collects in a rollout of ``num_steps`` (at least 1)."""
        return max(1, math.ceil(self.min_rollout_frac * num_steps - 1e-9))

    def should_stop(self, steps_done: int, num_steps: int) -> bool:
        """True if enough ranks are done and this one has its minimum of ``num_steps``."""
        if steps_done >= num_steps or steps_done < self.min_steps(num_steps):
            return False
        return int(self.store.add(self._key, 0)) >= self.threshold

    def finished(self) -> None:
        """Count this rank as done with the rollout (it collected every step)."""
        self.store.add(self._key, 1)
