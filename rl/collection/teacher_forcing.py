"""Teacher forcing: the task's expert acts in the policy's place with a given probability.

AllenAct's teacher forcing for imitation stages: at each step of a rollout, where the task
gives an expert action (its ``expert_actions`` step field, :mod:`rl.tasks.fields`), it replaces
the policy's sampled action with that probability; the rollout records the action taken and its
log-probability under the policy, so the update sees what the environment saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rl.models.policy import PolicyStep
from rl.tasks.fields import EXPERT_ACTIONS

__all__ = ["check_field_names", "teacher_force"]


def teacher_force(
    prob: float, step: PolicyStep, task_fields: Mapping[str, torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """ALGO: take the expert's action with probability ``prob`` where the task gives one.

    Returns:
        ``(actions taken, their log-probabilities under the policy, how many were forced)``:
        the storage records the action taken, so the update sees what the env saw.

    Raises:
        ValueError: The task declares no ``expert_actions`` step field, or the policy's
            actions are not single discrete actions (the expert's are), e.g. a Box action
            space.
    """
    expert = task_fields.get(EXPERT_ACTIONS)
    if expert is None:
        raise ValueError(
            f"teacher forcing takes the task's expert actions (step field {EXPERT_ACTIONS!r}, "
            "info['expert_action']), but the task declares no such field "
            "(rl.tasks.fields: StepField); teacher forcing needs a task with an expert"
        )
    actions, logprobs = step.actions, step.logprobs
    if actions.shape != expert.shape or actions.is_floating_point():
        raise ValueError(
            "teacher forcing takes the task's expert actions (one discrete action per "
            f"environment), but the policy's actions have shape {tuple(actions.shape)} "
            f"and dtype {actions.dtype}: teacher forcing needs a Discrete action space"
        )
    forced = (torch.rand(actions.shape).to(device) < prob) & (expert >= 0)
    if forced.any():
        actions = torch.where(forced, expert, actions)
        logprobs = step.dist.log_prob(actions)
    return actions, logprobs, int(forced.sum())


def check_field_names(task_fields: Mapping[str, Any], extras: Mapping[str, Any]) -> None:
    """A task's step field and a policy's extra of one name would overwrite each other."""
    clash = sorted(set(task_fields) & set(extras))
    if clash:
        raise ValueError(
            f"the task's step fields and the policy's extras share the name(s) {clash}: both "
            "are recorded in the rollout; rename one (rl.tasks.fields / PolicyStep.extras)"
        )
