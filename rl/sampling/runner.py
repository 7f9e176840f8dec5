"""The one loop that runs an actor against a sampler: act, step, next step.

Collection, evaluation on episode lists, probe videos and expert trajectories all run through
:func:`run_steps`. Everything an actor carries between steps (e.g. a recurrent state) is in
its step, nothing beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDict

from rl.sampling.base import Sampler
from rl.tasks.agents import AGENT_ACTIVE
from rl.tasks.fields import EXPERT_ACTIONS

__all__ = ["Actor", "ExpertActor", "NoExpertError", "run_steps"]


class NoExpertError(ValueError):
    """The task gives no expert action (``info["expert_action"]``), so it cannot be evaluated."""


class Actor(Protocol):
    """What acts in the loop for the ``N`` environments of a sampler's step."""

    def start(self, first: TensorDict) -> TensorDict:
        """The actor's first step, of the sampler's reset ``first``."""
        ...

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step``: NumPy, or a tensor on the sampler's device."""
        ...

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None
    ) -> TensorDict:
        """The step to act on next, from the sampler's ``result`` of acting on ``step``.

        ``keep``: ``[N]`` bool, the environments that stay (None: all).
        """
        ...


def run_steps(
    sampler: Sampler,
    actor: Actor,
    step: TensorDict,
    on_step: Callable[[int, TensorDict, TensorDict], bool] | None = None,
    max_steps: int | None = None,
) -> TensorDict:
    """Run ``actor`` from ``step`` until no environment is active, ``max_steps`` or a stop.

    Args:
        sampler: The environments.
        actor: What acts.
        step: The actor's first step (from a reset, or a previous run's last step).
        on_step: ``on_step(t, step, result)`` after each step ``t`` (before paused
            environments leave); True ends the run.
        max_steps: Steps at most (None: until every environment is paused).

    Returns:
        The actor's next step, for a run that goes on.
    """
    t = 0
    while sampler.num_active and (max_steps is None or t < max_steps):
        # A tensor only for a sampler that takes tensors.
        result = sampler.step(actor.act(step))  # type: ignore[arg-type]
        stop = on_step is not None and on_step(t, step, result)
        # Fewer active than stepped: some paused (evaluation).
        keep = None if sampler.num_active == len(result) else ~result.get("paused")
        step = actor.next_step(step, result, keep)
        t += 1
        if stop:
            break
    return step


class ExpertActor:
    """The task's expert (its ``expert_actions`` step field) in a policy's place.

    Args:
        task: The task's name, for errors.
    """

    def __init__(self, task: str) -> None:
        self.task = task

    def act(self, step: Mapping[str, Any]) -> np.ndarray:
        """The expert's actions (a :class:`NoExpertError` where the task gives none)."""
        if EXPERT_ACTIONS not in step.keys():
            raise NoExpertError(
                f"task {self.task!r} declares no expert (the step field {EXPERT_ACTIONS!r}: "
                "step_fields = {'expert_actions': rl.tasks.fields.expert_field()} on the env "
                'class, reading info["expert_action"]); running the expert needs a task with one'
            )
        expert = step[EXPERT_ACTIONS]
        missing = expert < 0
        if AGENT_ACTIVE in step.keys():  # agents out of their episode act for nothing
            missing &= step[AGENT_ACTIVE]
            expert = expert.clamp(min=0)
        if missing.any():
            raise NoExpertError(
                f'task {self.task!r} gave no expert action (info["expert_action"]) at a step; '
                "running the expert needs one at every step"
            )
        return np.asarray(expert.cpu())  # a batched environment's may be on an accelerator

    def start(self, first: TensorDict) -> TensorDict:
        """The sampler's reset itself."""
        return first

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None = None
    ) -> TensorDict:
        """The sampler's result itself: nothing to carry."""
        return result if keep is None else result[keep]
