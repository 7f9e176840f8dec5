"""Off-policy updates between on-policy rollouts (AllenAct's ``OffPolicyPipelineComponent``).

E.g. behaviour cloning on stored expert trajectories after each rollout's on-policy update.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

log = logging.getLogger(__name__)


@runtime_checkable
class ShardableData(Protocol):
    """A data iterator that can give each distributed worker its own share."""

    def shard(self, rank: int, world_size: int) -> None:
        """Draw only from worker ``rank``'s share of ``world_size``."""
        ...


class OffPolicyPipelineComponent:
    """Losses fed by a data iterator, run ``updates`` times per rollout.

    Args:
        data_iterator: Batches with ``obs``, ``episode_starts`` (``[T, B, ...]``) and whatever
            its losses read (e.g. ``expert_actions``); restarted whenever it ends.
        loss_names: Names of the losses (keys of the pipeline's ``named_losses``).
        updates: Optimiser steps on off-policy batches after every rollout.
        loss_weights: One weight per loss name (default: all 1).
    """

    def __init__(
        self,
        *,
        data_iterator: Iterable[Any],
        loss_names: Sequence[str],
        updates: int,
        loss_weights: Sequence[float] | None = None,
    ) -> None:
        self.data_iterator = data_iterator
        self.loss_names = list(loss_names)
        if not self.loss_names:
            raise ValueError("an off-policy component needs at least one loss name")
        if updates < 1:
            raise ValueError(f"off-policy updates per rollout must be >= 1, got {updates}")
        self.updates = int(updates)
        self.loss_weights = (
            [1.0] * len(self.loss_names) if loss_weights is None else list(loss_weights)
        )
        if len(self.loss_weights) != len(self.loss_names):
            raise ValueError("off-policy loss_weights needs one weight per loss name")
        self._iterator: Any = None

    @property
    def weighted_losses(self) -> dict[str, float]:
        """``{loss_name: weight}``."""
        return dict(zip(self.loss_names, self.loss_weights, strict=True))

    def shard(self, rank: int, world_size: int) -> None:
        """Give worker ``rank`` its own share of the data where the iterator can, else warn."""
        if isinstance(self.data_iterator, ShardableData):
            self.data_iterator.shard(rank, world_size)
        elif rank == 0:
            log.warning(
                "off-policy data iterator %s cannot be sharded: every worker draws the same "
                "batches",
                type(self.data_iterator).__name__,
            )

    @property
    def generator(self) -> torch.Generator | None:
        """``data_iterator.generator`` where it has one (checkpoints save it)."""
        generator = getattr(self.data_iterator, "generator", None)
        return generator if isinstance(generator, torch.Generator) else None

    def next_batch(self) -> Any:
        """The next batch, restarting the iterator when it is exhausted."""
        if self._iterator is None:
            self._iterator = iter(self.data_iterator)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.data_iterator)
            return next(self._iterator)
