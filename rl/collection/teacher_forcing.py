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

from rl.tasks.fields import EXPERT_ACTIONS

__all__ = ["check_field_names", "check_forced", "forced_actions"]


def forced_actions(
    prob: float, task_fields: Mapping[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """ALGO: the expert's action with probability ``prob`` where the task gives one, else -1.

    The policy takes them in place of a draw (the step's ``forced_actions``) and records their
    log-probabilities under itself, so the update sees what the environment saw.

    Raises:
        ValueError: The task declares no ``expert_actions`` step field.
    """
    expert = task_fields.get(EXPERT_ACTIONS)
    if expert is None:
        raise ValueError(
            f"teacher forcing takes the task's expert actions (step field {EXPERT_ACTIONS!r}, "
            "info['expert_action']), but the task declares no such field "
            "(rl.tasks.fields: StepField); teacher forcing needs a task with an expert"
        )
    forced = (torch.rand(expert.shape).to(device) < prob) & (expert >= 0)
    return torch.where(forced, expert, torch.full_like(expert, -1))


def check_forced(forced: torch.Tensor, actions: torch.Tensor, policy: object) -> int:
    """How many actions were forced; an error where the policy's actions cannot be forced.

    Raises:
        ValueError: The policy's actions are not single discrete actions (the expert's are),
            e.g. a Box action space, or the policy did not take the forced actions.
    """
    if actions.shape != forced.shape or actions.is_floating_point():
        raise ValueError(
            "teacher forcing takes the task's expert actions (one discrete action per "
            f"environment), but the policy's actions have shape {tuple(actions.shape)} "
            f"and dtype {actions.dtype}: teacher forcing needs a Discrete action space"
        )
    where = forced >= 0
    if not torch.equal(actions[where], forced[where].to(actions.dtype)):
        raise ValueError(
            f"policy {type(policy).__name__} did not take the step's forced_actions (teacher "
            "forcing): its act() must take them where >= 0 (rl.models.policy.write_step does)"
        )
    return int(where.sum())


def check_field_names(task_fields: Mapping[str, torch.Tensor], step: Any) -> None:
    """A policy that wrote over a task's step field of the same name (both are recorded)."""
    clash = sorted(k for k, v in task_fields.items() if step.get(k) is not v)
    if clash:
        raise ValueError(
            f"the policy's act() wrote the task's step field(s) {clash}: both are recorded in "
            "the rollout; rename the policy's (rl.tasks.fields / the keys act() writes)"
        )
