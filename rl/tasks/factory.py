"""Environments from task configs: build one, read a task's spaces, name it.

A task config is a plain mapping whose ``_target_`` returns a ``gymnasium.Env``
(``conf/task/<name>.yaml``), with optional ``observations`` (:mod:`rl.tasks.observations`) and
``step_fields`` (:mod:`rl.tasks.fields`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import hydra.utils

from rl.tasks.agents import AgentGroup, group_layouts, num_agents, unstack_space
from rl.tasks.fields import step_fields_of
from rl.tasks.spaces import check_action_space, dict_space

# Keys of a task config the framework reads itself, not passed to its ``_target_``.
FRAMEWORK_KEYS = frozenset({"observations", "step_fields"})


def build_env(task: Mapping[str, Any], **kwargs: Any) -> gym.Env:
    """The environment of a plain task config, its ``observations`` transforms applied in order.

    ``kwargs`` go to the constructor (e.g. ``render_mode="rgb_array"``).
    """
    transforms = task.get("observations") or ()
    if not isinstance(transforms, (list, tuple)):
        raise TypeError(
            f"task.observations: expected a list of transforms, got a {type(transforms).__name__}"
        )
    env = hydra.utils.instantiate(
        {k: v for k, v in task.items() if k not in FRAMEWORK_KEYS}, **kwargs
    )
    if not isinstance(env, gym.Env):
        raise TypeError(f"task._target_={task.get('_target_')!r} built {type(env)}, not a gym.Env")
    for i, transform in enumerate(transforms):
        wrap = hydra.utils.instantiate(transform) if isinstance(transform, Mapping) else transform
        if not callable(wrap):
            raise TypeError(
                f"task.observations.{i}: expected a partial wrapper "
                f"({{_target_: ..., _partial_: true}}), got {transform!r}"
            )
        env = wrap(env)
    return env


def episode_metrics(info: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of an episode's last ``info``: ``info["episode_metrics"]``.

    An environment of the ``is_success`` convention (gymnasium-robotics', stable-baselines3's)
    gets it as ``success`` where ``episode_metrics`` does not give one.
    """
    metrics = {k: float(v) for k, v in (info.get("episode_metrics") or {}).items()}
    if "is_success" in info and "success" not in metrics:
        metrics["success"] = float(info["is_success"])
    return metrics


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    """What a run reads of its task once: one agent's spaces and how many agents.

    Attributes:
        observation_space: The flat observation ``Dict`` space a policy sees (one agent's).
        action_space: The action space a policy acts in (one agent's).
        agents: Agents per environment (each a row of the batch, :mod:`rl.tasks.agents`).
        groups: A multi-agent task's groups of agents, one policy each, with the spaces their
            policies see; None: one policy shared by all.
    """

    observation_space: gym.spaces.Dict
    action_space: gym.Space
    agents: int = 1
    groups: tuple[AgentGroup, ...] | None = None

    @property
    def spaces(self) -> tuple[gym.spaces.Dict, gym.Space]:
        """``(observation_space, action_space)``."""
        return self.observation_space, self.action_space


def task_layout(task: Mapping[str, Any]) -> TaskLayout:
    """The spaces and agents of a task (builds one env; a :class:`SpaceError` names it)."""
    env = build_env(task)
    try:
        name = env_name(task, env)
        agents = num_agents(step_fields_of(task, env, name))
        observation_space = dict_space(env.observation_space, name)
        action_space = check_action_space(env.action_space, name, agents)
        if agents is None:
            return TaskLayout(observation_space, action_space)
        row_space = gym.spaces.Dict(
            {k: unstack_space(s) for k, s in observation_space.spaces.items()}
        )
        groups = getattr(env.unwrapped, "agent_groups", None)
        return TaskLayout(
            row_space,
            unstack_space(action_space),
            agents,
            group_layouts(groups, row_space) if groups else None,
        )
    finally:
        env.close()


def task_spaces(task: Mapping[str, Any]) -> tuple[gym.spaces.Dict, gym.Space]:
    """``(flat observation Dict space, action space)`` a task's policy sees (one agent's)."""
    return task_layout(task).spaces


def env_name(task: Mapping[str, Any], env: gym.Env) -> str:
    """The task's name in messages: ``task.env_id``, the env's gymnasium id or class."""
    if "env_id" in task:
        return str(task["env_id"])
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def task_id(task: Mapping[str, Any]) -> str:
    """Readable task identifier: the gymnasium id, else the environment class name."""
    if "env_id" in task:
        return str(task["env_id"])
    env = build_env(task)
    try:
        return env_name(task, env)
    finally:
        env.close()


def with_split(task: Mapping[str, Any], split: str | None) -> dict[str, Any]:
    """``task`` drawing its episodes from ``split`` (None: the task's own).

    A task has splits when its config, or its ``env`` (``task=nav_multi``), has a ``split`` key;
    others are left as they are.
    """
    task = dict(task)
    if split is None:
        return task
    if "split" in task:
        task["split"] = split
    elif isinstance(task.get("env"), Mapping) and "split" in task["env"]:
        task["env"] = {**task["env"], "split": split}
    return task
