"""The trainer's extension points: the :class:`Callback` protocol and what each rollout did.

Evaluation during training, probe videos and checkpoint validation are callbacks
(:mod:`rl.evaluation`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rl.collection.base import Rollout
from rl.pipeline.stages import TrainingSettings

if TYPE_CHECKING:  # for annotations only: the trainer imports this module
    from rl.training.trainer import OnPolicyTrainer


@dataclasses.dataclass(frozen=True)
class RolloutInfo:
    """What one iteration (rollout + updates) did.

    Attributes:
        stage_index: The stage the rollout belonged to.
        num_steps: Rollout length per environment of this rank (shortened at a stage's end,
            or by straggler preemption).
        env_steps: Env steps of the rollout over all ranks (``num_steps * num_envs`` on one
            process).
        total_steps: Global env steps after the rollout.
        settings: The stage's effective training settings.
        teacher_forced: Steps whose action was the expert's by teacher forcing.
        offpolicy_updates: Off-policy optimiser steps after the rollout.
        rollout: This rank's rollout; its storage is reused by the next rollout, so read it
            during the callback, do not keep it.
    """

    stage_index: int
    num_steps: int
    env_steps: int
    total_steps: int
    settings: TrainingSettings
    teacher_forced: int
    offpolicy_updates: int
    rollout: Rollout

    def crossed(self, interval: int) -> bool:
        """Whether this rollout's env steps crossed a multiple of ``interval``."""
        return self.total_steps // interval > (self.total_steps - self.env_steps) // interval


class Callback(Protocol):
    """Hooks the trainer calls on every callback, in list order.

    Any object with these hooks is a callback; subclass to inherit no-op defaults.
    """

    def on_train_start(self, trainer: OnPolicyTrainer) -> None:
        """Before the first rollout of :meth:`~OnPolicyTrainer.train` (after a resume's load)."""
        return None

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        """After each rollout's updates and schedule steps, before logging and saving."""
        return None

    def on_stage_end(self, trainer: OnPolicyTrainer, stage_index: int) -> None:
        """After stage ``stage_index`` ended and its checkpoint was saved."""
        return None

    def on_checkpoint(self, trainer: OnPolicyTrainer, path: Path) -> None:
        """After a checkpoint was written (rank 0 only under DDP)."""
        return None

    def on_train_end(self, trainer: OnPolicyTrainer, checkpoint: Path) -> None:
        """After the last stage, once the final ``checkpoint`` is written (not after a stop)."""
        return None
