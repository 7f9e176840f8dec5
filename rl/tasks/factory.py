"""Environments from task configs: build one, read a task's spaces, name it.

A task config is a plain mapping with a ``_target_`` returning a ``gymnasium.Env`` (the config
group is the registry: ``conf/task/<name>.yaml``), and optionally ``observations``: partial
wrappers applied in order after the environment is built (:mod:`rl.tasks.observations`), and
``step_fields``: values of ``info`` to record in the rollout (:mod:`rl.tasks.fields`).
Everything that needs an environment built from a config (samplers, probe videos, expert data,
model building) goes through here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import hydra.utils

from rl.tasks.agents import AgentGroup, group_layouts, num_agents, unstack_space
from rl.tasks.fields import step_fields_of
from rl.tasks.spaces import check_action_space, flat_observation_space

# Keys of a task config the framework reads itself (not passed to the task's ``_target_``).
FRAMEWORK_KEYS = frozenset({"observations", "step_fields"})


def build_env(task: Mapping[str, Any], **kwargs: Any) -> gym.Env:
    """Instantiate the task config (a plain mapping with ``_target_``) into an environment.

    Its ``observations`` transforms (partial wrappers, :mod:`rl.tasks.observations`) are
    applied in order, innermost first.

    Args:
        task: Plain task config.
        **kwargs: Extra constructor arguments (e.g. ``render_mode="rgb_array"``).

    Raises:
        TypeError: The target did not build a ``gymnasium.Env``.
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
    """The per-episode metrics of an episode's last ``info``, for any task.

    The framework's tasks report ``info["episode_metrics"]`` (a dict of floats); environments
    of the ``is_success`` convention (gymnasium-robotics', stable-baselines3's) get it as
    ``success`` where ``episode_metrics`` does not give one.
    """
    metrics = {k: float(v) for k, v in (info.get("episode_metrics") or {}).items()}
    if "is_success" in info and "success" not in metrics:
        metrics["success"] = float(info["is_success"])
    return metrics


def dict_space(space: gym.Space, task: str = "?") -> gym.spaces.Dict:
    """``space`` as the flat Dict space samplers and policies see (:mod:`rl.tasks.spaces`).

    A non-dict space becomes ``{"obs": space}``, nested ``Dict``/``Tuple`` entries are named by
    their key path; ``task`` names the task in errors.

    Raises:
        SpaceError: An entry policies cannot encode (e.g. ``Text``).
    """
    return flat_observation_space(space, task)


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    """What a run reads of its task once: one agent's spaces and how many agents.

    Attributes:
        observation_space: The flat observation ``Dict`` space a policy sees (one agent's).
        action_space: The action space a policy acts in (one agent's).
        agents: Agents per environment (1 for a single-agent task; each is a row of the
            batch, :mod:`rl.tasks.agents`).
        groups: A multi-agent task's groups of agents with spaces of their own, one policy
            each (:class:`~rl.tasks.agents.AgentGroup`, with the spaces their policies see);
            None: one space for all, one shared policy.
    """

    observation_space: gym.spaces.Dict
    action_space: gym.Space
    agents: int = 1
    groups: tuple[AgentGroup, ...] | None = None

    @property
    def spaces(self) -> tuple[gym.spaces.Dict, gym.Space]:
        """``(observation_space, action_space)``, as :func:`task_spaces` returns them."""
        return self.observation_space, self.action_space


def task_layout(task: Mapping[str, Any]) -> TaskLayout:
    """The spaces and agents of a task (builds one env).

    Raises:
        SpaceError: An observation entry or an action space policies cannot handle, naming
            the task.
    """
    env = build_env(task)
    try:
        name = env_name(task, env)
        agents = num_agents(step_fields_of(task, env, name))
        observation_space = dict_space(env.observation_space, name)
        action_space = check_action_space(env.action_space, name, agents)
        if agents is None:
            return TaskLayout(observation_space, action_space)
        # A multi-agent task: one agent's spaces (every agent is a row of the batch).
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
    """``(flat observation Dict space, action space)`` of a task (builds one env).

    For a multi-agent task (:mod:`rl.tasks.agents`), one agent's: what its policy sees.

    Raises:
        SpaceError: An observation entry or an action space policies cannot handle, naming
            the task.
    """
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
    """``task`` drawing its episodes from ``split`` (tasks without splits are left as they are).

    A task has splits when its config has a ``split`` key (PointNav's ``conf/task`` files do),
    or its ``env`` has (a multi-agent task's environment, ``task=nav_multi``); ``split=None``
    keeps the task's own.
    """
    task = dict(task)
    if split is None:
        return task
    if "split" in task:
        task["split"] = split
    elif isinstance(task.get("env"), Mapping) and "split" in task["env"]:
        task["env"] = {**task["env"], "split": split}
    return task
