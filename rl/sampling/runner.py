"""The one loop that runs an actor against a sampler's environments: act, step, next.

:func:`run_steps` is that loop: the actor acts on its step (what it made of the sampler's
last: observations, the task's step fields, whatever it carries, such as a policy's recurrent
state), the sampler steps, the caller's ``on_step`` sees both, and the actor makes the next
step from the sampler's result, environments that ran out of episodes (evaluation) left out.
Everything an actor carries from one step to the next is in the step; nothing is kept beside
it. Collection (:class:`~rl.collection.acting.RolloutRecorder`, which records each step
into the rollout storage as it makes the next), evaluation on fixed episode lists
(:func:`~rl.collection.episodes.run_episode_list`: a policy,
:class:`~rl.collection.acting.PolicyActor`, or :class:`ExpertActor`, the task's expert), probe
videos (:func:`~rl.evaluation.video.record_episode`, a frame after each step) and expert
trajectories (:func:`~rl.storage.expert_data.generate_expert_trajectories`) all run through
it. (:class:`~rl.evaluation.InferenceAgent` takes one step at a time for a caller's own loop,
through the same policy step.)
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
        """Actions ``[N, ...]`` for the actor's ``step`` (written into it where it records them).

        NumPy, or a tensor on the device of the sampler's steps (a batched sampler's on an
        accelerator takes it there: :func:`~rl.collection.acting.actions_for`).
        """
        ...

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None
    ) -> TensorDict:
        """The step to act on next, after the sampler's ``result`` of acting on ``step``.

        ``keep``: the environments that stay (``[N]`` bool; None: all). Episode starts are
        ``result["terminated"] | result["truncated"]``.
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
        actor: What acts (:class:`Actor`).
        step: The actor's first step (made from a reset's, or the last step of a previous run).
        on_step: ``on_step(t, step, result)`` after each step ``t`` (the step acted on and the
            sampler's result, before paused environments leave it); True ends the run.
        max_steps: Steps at most (None: until every environment is paused).

    Returns:
        The actor's next step (the active environments'), for a run that goes on.
    """
    t = 0
    while sampler.num_active and (max_steps is None or t < max_steps):
        # A tensor only for a sampler whose steps are on its device (one that takes tensors).
        result = sampler.step(actor.act(step))  # type: ignore[arg-type]
        stop = on_step is not None and on_step(t, step, result)
        # Some environments paused (evaluation) when fewer are active than were stepped.
        keep = None if sampler.num_active == len(result) else ~result.get("paused")
        step = actor.next_step(step, result, keep)
        t += 1
        if stop:
            break
    return step


class ExpertActor:
    """The task's expert (its ``expert_actions`` step field) in a policy's place.

    Args:
        task: The task's name, for the error of a task without an expert.
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
        return np.asarray(expert.cpu())  # (a batched environment's may be on an accelerator)

    def start(self, first: TensorDict) -> TensorDict:
        """The sampler's reset itself."""
        return first

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None = None
    ) -> TensorDict:
        """The sampler's result itself (the active environments'): nothing to carry."""
        return result if keep is None else result[keep]
