"""Tasks: the API an environment is written against, and building one from a config.

``factory`` builds environments from task configs; ``spaces``, ``fields``, ``observations``,
``splits`` and ``gym`` are the parts of a task config; ``batched`` and ``gym_vector`` step N
environments at once; ``agents`` and ``pettingzoo`` make a multi-agent environment's agents
rows of one batch. The example environments (:mod:`rl_envs`) use this API alone.
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
