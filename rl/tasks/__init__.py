"""Tasks: the API an environment is written against, and building one from a config.

``factory`` builds an environment from a task config and reads a task's spaces and name;
``spaces`` says which observation and action spaces policies handle and flattens nested
observations; ``fields`` declares the per-step values a task reports in ``info`` for the rollout
(:class:`StepField`, e.g. the navigation tasks' ``expert_actions``); ``splits`` holds the
train/valid/test split mechanism; ``agents`` and ``pettingzoo`` make several agents in one
environment one batch of rows; ``batched`` is the contract of N environments stepped at once in
torch, ``gym_vector`` turns any ``gymnasium.vector.VectorEnv`` into one; ``gym`` builds any
registered gymnasium environment; ``observations`` holds the observation transforms a task
config lists.

The example environments (grid and 3D PointNav, MiniGrid, Atari, toys) are the package
:mod:`rl_envs` beside this one, written against this API alone.
"""

from __future__ import annotations

from rl.tasks.factory import (
    TaskLayout,
    build_env,
    dict_space,
    task_id,
    task_layout,
    task_spaces,
    with_split,
)
from rl.tasks.fields import StepField
from rl.tasks.gym import make_gym_env
from rl.tasks.spaces import SpaceError

__all__ = [
    "TaskLayout",
    "SpaceError",
    "StepField",
    "build_env",
    "dict_space",
    "make_gym_env",
    "task_id",
    "task_layout",
    "task_spaces",
    "with_split",
]
