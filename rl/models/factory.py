"""Building a policy from its config for given observation and action spaces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import hydra.utils
from torch import nn

from rl.models.checks import check_policy
from rl.models.policy import Policy


def build_policy(
    model_cfg: Mapping[str, Any], observation_space: gym.spaces.Dict, action_space: gym.Space
) -> Any:
    """Instantiate a model config (a ``_partial_`` ``_target_``) for the given spaces.

    The one way every part of the framework builds a policy (training, collection workers,
    validation, evaluation, inference). Callers get the spaces of a task with
    :func:`rl.tasks.task_spaces`: ``build_policy(cfg["model"], *task_spaces(cfg["task"]))``.

    Raises:
        TypeError: The target did not build a ``torch.nn.Module`` implementing
            :class:`~rl.models.policy.Policy` (``initial_state``, ``forward``, ``act``), or
            one whose outputs do not have the protocol's shapes
            (:class:`~rl.models.checks.PolicyShapeError`, naming the output: checked once, on
            a small batch, by :func:`~rl.models.checks.check_policy`).
    """
    policy = hydra.utils.instantiate(dict(model_cfg))(
        observation_space=observation_space, action_space=action_space
    )
    if not isinstance(policy, nn.Module) or not isinstance(policy, Policy):
        missing = [m for m in ("initial_state", "forward", "act") if not hasattr(policy, m)]
        raise TypeError(
            f"model._target_={model_cfg.get('_target_')!r} built a {type(policy).__name__}, "
            "not a policy: a torch.nn.Module with initial_state, forward and act "
            "(rl.models.Policy; subclass rl.models.PolicyBase to get act)"
            + (f"; it lacks {', '.join(missing)}" if missing else "")
        )
    check_policy(policy, observation_space)
    return policy
