"""The seam between collecting and learning: a :class:`Collector` fills rollouts.

The trainer asks for one rollout at a time with a :class:`RolloutRequest` (the current stage's
rollout length and teacher forcing) and gets a :class:`Rollout`: the filled storage, the value
to bootstrap from, the episodes that finished, and what collecting cost. Where and how the
steps are taken (in the trainer's process, in worker processes, on other machines) is the
collector's business; the training loop is the same for every collector.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from rl.pipeline.schedules import Schedule
from rl.sampling.base import EpisodeRecord
from rl.storage.rollout import RolloutStorage


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    """What the learner asks of the next rollout.

    Attributes:
        num_steps: Steps per environment (a collector may stop early: straggler preemption).
        teacher_forcing: Probability of taking the expert's action, as a function of the
            stage's env steps (None: never).
        stage_steps: Env steps the stage had taken before this rollout (the schedule's
            position at the rollout's first step).
        steps_per_step: Env steps one collection step adds to the stage over every worker
            (``num_envs * world_size``): step ``t`` of the rollout is at stage step
            ``stage_steps + t * steps_per_step``.
    """

    num_steps: int
    teacher_forcing: Schedule | None = None
    stage_steps: int = 0
    steps_per_step: int = 1

    def teacher_forcing_probability(self, t: int) -> float:
        """The expert's probability at step ``t`` of the rollout (0 without teacher forcing)."""
        if self.teacher_forcing is None:
            return 0.0
        return float(self.teacher_forcing(self.stage_steps + t * self.steps_per_step))


@dataclasses.dataclass
class Rollout:
    """One collected rollout, ready for advantages and the update.

    A collector may reuse its storage for the next rollout: a ``Rollout`` is valid until the
    collector's next :meth:`~Collector.collect`.

    Attributes:
        storage: The filled storage (``storage.step`` steps of every environment).
        next_value: ``[N]`` value of the observation after the last step, from the policy
            that collected the rollout (what the returns bootstrap from).
        episodes: Episodes that finished during the rollout.
        stats: Per-step statistics as ``{"sums": ..., "counts": ...}`` of a
            :class:`~rl.pipeline.ScalarMeanTracker` (e.g. ``pipeline/teacher_ratio``).
        teacher_forced: Steps whose action was the expert's by teacher forcing.
        env_seconds: Time spent stepping environments.
        inference_seconds: Time spent in the policy and in storage inserts.
    """

    storage: RolloutStorage
    next_value: torch.Tensor
    episodes: list[EpisodeRecord]
    stats: dict[str, dict[str, float]]
    teacher_forced: int = 0
    env_seconds: float = 0.0
    inference_seconds: float = 0.0

    @property
    def num_steps(self) -> int:
        """Steps per environment actually collected."""
        return self.storage.step


class Collector(Protocol):
    """Produces rollouts for the learner (PyTorchRL's collection workers, seen from the loop).

    A collector owns its environments and whatever is carried from one rollout into the next
    (observations, recurrent state), and saves and restores that for exact resume.
    """

    @property
    def num_envs(self) -> int:
        """Environments this collector steps (per distributed worker)."""
        ...

    def collect(self, request: RolloutRequest) -> Rollout:
        """Collect one rollout with the current policy."""
        ...

    def new_episodes(self) -> None:
        """Cut every environment's episode and start new ones before the next rollout."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": ..., "rollout": ...}``: episodes in flight and the carried state.

        Either may be None when the collector cannot save it (a resume then starts fresh
        episodes). The result must load with ``torch.load(weights_only=True)``.
        """
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (instead of resetting the environments)."""
        ...

    def close(self) -> None:
        """Release the environments (idempotent)."""
        ...
