"""Building a policy from its config for given observation and action spaces."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import hydra.utils
from torch import nn

from rl.models.checks import check_policy
from rl.models.policy import Policy


def build_policy(
    model_cfg: Mapping[str, Any],
    observation_space: gym.spaces.Dict,
    action_space: gym.Space,
    *,
    groups: Sequence[Any] | None = None,
) -> Any:
    """Instantiate a model config (a ``_partial_`` ``_target_``) for the given spaces.

    The one way the framework builds a policy: ``build_policy(cfg["model"],
    *task_spaces(cfg["task"]))``, with ``groups`` for a task with groups of agents
    (:attr:`rl.tasks.TaskLayout.groups`). The policy is checked against the
    :class:`~rl.models.policy.Policy` protocol, its outputs' shapes included.
    """
    build = hydra.utils.instantiate(dict(model_cfg))
    kwargs: dict[str, Any] = {}
    if groups:
        if "groups" not in _parameters(build):
            names = ", ".join(f"{g.name} (agents {list(g.agents)})" for g in groups)
            raise ValueError(
                f"the task has groups of agents with spaces of their own ({names}), one policy "
                f"each, but model._target_={model_cfg.get('_target_')!r} takes no groups: use "
                "model=grouped (rl.models.GroupedPolicy)"
            )
        kwargs["groups"] = tuple(groups)
    policy = build(observation_space=observation_space, action_space=action_space, **kwargs)
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


def _parameters(build: Any) -> set[str]:
    try:
        return set(inspect.signature(build).parameters)
    except (TypeError, ValueError):  # (no signature to read: pass nothing more)
        return set()
