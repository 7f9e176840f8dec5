"""Tasks: environments, building them from configs, and the framework's gymnasium registrations.

``factory`` builds an environment from a task config and reads a task's spaces and name;
``nav`` is the grid PointNav task, ``nav3d`` PointNav from pixels in MiniWorld interiors,
``gym`` any registered gymnasium environment, ``minigrid`` MiniGrid's for the nav CNN, ``debug``
small environments for tests; ``splits`` holds the train/valid/test split mechanism both
navigation tasks share; ``spaces`` says which observation and action spaces policies handle and
flattens nested observations; ``fields`` declares the per-step values a task reports in
``info`` for the rollout (:class:`StepField`, e.g. the navigation tasks' ``expert_actions``).

Importing this package registers with gymnasium (idempotently) ``rl/PointNav-v0`` (19x19, 2x2
rooms, 100 steps), ``rl/PointNavSmall-v0`` (9x9, 2x2 rooms, 50 steps), ``rl/PointNav3D-v0``
(3x3 rooms of 3-5 m, 500 steps) and ``rl/PointNav3DSmall-v0`` (1x2 rooms of 3-4 m, 150 steps).
Importing it starts no OpenGL: a 3D environment starts EGL when it is built.
"""

from __future__ import annotations

from typing import Any

import gymnasium

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
from rl.tasks.gym import make_gym_env  # binds the submodule name `gym` here, hence `gymnasium`
from rl.tasks.minigrid import make_minigrid_env
from rl.tasks.nav import Actions, PointNavEnv
from rl.tasks.nav3d import PointNav3DEnv, RenderingUnavailableError
from rl.tasks.spaces import SpaceError

__all__ = [
    "TaskLayout",
    "Actions",
    "PointNav3DEnv",
    "PointNavEnv",
    "RenderingUnavailableError",
    "SpaceError",
    "StepField",
    "build_env",
    "dict_space",
    "make_gym_env",
    "make_minigrid_env",
    "task_id",
    "task_layout",
    "task_spaces",
    "with_split",
]

_REGISTRATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "rl/PointNav-v0": (
        "rl.tasks.nav:PointNavEnv",
        {"size": 19, "rooms_per_side": 2, "max_steps": 100},
    ),
    "rl/PointNavSmall-v0": (
        "rl.tasks.nav:PointNavEnv",
        {"size": 9, "rooms_per_side": 2, "max_steps": 50},
    ),
    "rl/PointNav3D-v0": (
        "rl.tasks.nav3d:PointNav3DEnv",
        {"rooms": (3, 3), "room_size": (3.0, 5.0), "max_steps": 500},
    ),
    "rl/PointNav3DSmall-v0": (
        "rl.tasks.nav3d:PointNav3DEnv",
        {"rooms": (1, 2), "room_size": (3.0, 4.0), "max_steps": 150},
    ),
}


def _register() -> None:
    """Register the navigation envs with gymnasium, skipping ids already registered."""
    for env_id, (entry_point, kwargs) in _REGISTRATIONS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))


_register()
