"""The seam between collecting and learning: a :class:`Collector` fills rollouts.

The trainer asks for one rollout at a time with a :class:`RolloutRequest` and gets a
:class:`Rollout`; where the steps are taken (this process, worker processes, other machines) is
the collector's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import gymnasium as gym
import torch

from rl.collection.normalization import Normalizer, NormalizeSettings
from rl.pipeline.schedules import Schedule
from rl.sampling.base import EpisodeRecord
from rl.sampling.factory import sampler_num_envs
from rl.storage.rollout import RolloutStorage
from rl.tasks.agents import AgentGroup
from rl.tasks.factory import task_spaces

if TYPE_CHECKING:  # (an import cycle: episodes -> acting -> base)
    from rl.collection.episodes import EvalResult


@dataclasses.dataclass(frozen=True)
class CollectionSpec:
    """What a collector collects from, as plain configs (each collector builds where it runs).

    Attributes:
        sampler: Plain sampler config; its ``num_envs`` are this collector's environments.
        model: Plain model config (remote collectors build their own copy of the policy).
        seed: The run's seed (environment ``i`` first resets with ``env_seeds(total, seed)[i]``
            of its global index).
        env_offset: Global index of this collector's first environment (distributed ranks).
        total_envs: Size of the global seed stream (None: ``env_offset + num_envs``).
        spaces: The task's flat observation space and action space, read once by the run
            (None: read where needed, by building one environment).
        agents: Agents per environment (each is a row of the batch).
        groups: A multi-agent task's groups of agents, one policy each (None: one for all).
    """

    task: dict[str, Any]
    sampler: dict[str, Any]
    model: dict[str, Any]
    seed: int
    env_offset: int = 0
    total_envs: int | None = None
    normalize: dict[str, Any] | None = None
    spaces: tuple[gym.spaces.Dict, gym.Space] | None = None
    agents: int = 1
    groups: tuple[AgentGroup, ...] | None = None

    def task_spaces(self) -> tuple[gym.spaces.Dict, gym.Space]:
        """The task's flat observation space and action space (``spaces``, else the task's)."""
        return self.spaces if self.spaces is not None else task_spaces(self.task)

    def with_task(self, task: Mapping[str, Any]) -> CollectionSpec:
        """The spec for another task (its spaces read again when needed)."""
        return dataclasses.replace(self, task=dict(task), spaces=None)

    def build_normalizer(self, observation_space: gym.spaces.Dict) -> Normalizer | None:
        """The normalizer ``normalize`` asks for (None when it normalises nothing)."""
        if self.normalize is None:
            return None
        return Normalizer.build(observation_space, NormalizeSettings(**self.normalize))

    @property
    def num_envs(self) -> int:
        """Environments the sampler config asks for."""
        return sampler_num_envs(self.sampler)

    @property
    def num_rows(self) -> int:
        """Rows of the batch: the environments' agents (the environments, for one agent)."""
        return self.num_envs * self.agents


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    """What the learner asks of the next rollout.

    Attributes:
        num_steps: Steps per environment (a collector may stop early: straggler preemption).
        teacher_forcing: Probability of taking the expert's action, as a function of the
            stage's env steps (None: never).
        stage_steps: Env steps the stage had taken before this rollout.
        steps_per_step: Env steps one collection step adds to the stage over every worker:
            step ``t`` of the rollout is at stage step ``stage_steps + t * steps_per_step``.
        stage: Index of the pipeline stage the rollout is for (asynchronous collection drops
            data collected for another stage).
        gamma: The stage's discount, for reward normalisation's returns (None: no stage).
    """

    num_steps: int
    teacher_forcing: Schedule | None = None
    stage_steps: int = 0
    steps_per_step: int = 1
    stage: int = 0
    gamma: float | None = None

    def teacher_forcing_probability(self, t: int) -> float:
        """The expert's probability at step ``t`` of the rollout (0 without teacher forcing)."""
        if self.teacher_forcing is None:
            return 0.0
        return float(self.teacher_forcing(self.stage_steps + t * self.steps_per_step))


@dataclasses.dataclass
class Rollout:
    """One collected rollout, valid until the collector's next :meth:`~Collector.collect`.

    Attributes:
        storage: The filled storage (``storage.step`` steps of every environment).
        next_value: ``[N]`` value of the observation after the last step, from the policy
            that collected the rollout (what the returns bootstrap from).
        stats: A :class:`~rl.pipeline.ScalarMeanTracker` state of per-step statistics.
        teacher_forced: Steps whose action was the expert's by teacher forcing.
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


class Preemption(Protocol):
    """A rule that may end a rollout before ``num_steps`` (straggler preemption).

    Attributes:
        metric: Key under which the fraction of each rollout collected is logged.
    """

    metric: str

    def start(self, rollout_index: int) -> None:
        """Rollout ``rollout_index`` begins."""
        ...

    def should_stop(self, steps_done: int, num_steps: int) -> bool:
        """Whether the rollout ends now, after ``steps_done`` of ``num_steps`` steps."""
        ...

    def finished(self) -> None:
        """The rollout collected every step."""
        ...


class Collector(Protocol):
    """Produces rollouts for the learner.

    A collector owns its environments and what one rollout carries into the next (observations,
    recurrent state), and saves and restores that for exact resume.

    Attributes:
        supports_distributed: Whether each DDP rank may drive its own collector.
    """

    supports_distributed: ClassVar[bool]

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

    def evaluate(
        self,
        *,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None = None,
    ) -> EvalResult:
        """Run the learner's current policy once on each episode of a fixed list.

        ``split``: the task's episode split (None: the training task's own).
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the collector carries between rollouts, as top-level checkpoint entries.

        It must load with ``torch.load(weights_only=True)``.
        """
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint holding :meth:`state_dict`'s entries."""
        ...

    def close(self) -> None:
        """Release the environments (idempotent)."""
        ...
