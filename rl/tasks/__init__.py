"""Tasks: environments, building them from configs, and the framework's gymnasium registrations.

``factory`` builds an environment from a task config and reads a task's spaces and name;
``nav`` is the PointNav task, ``gym`` any registered gymnasium environment, ``debug`` small
environments for tests.

Importing this package registers ``rl/PointNav-v0`` (19x19, 2x2 rooms, 100 steps) and
``rl/PointNavSmall-v0`` (9x9, 2x2 rooms, 50 steps) with gymnasium (idempotently).
"""

from __future__ import annotations

import gymnasium

from rl.tasks.factory import build_env, dict_space, task_id, task_spaces, with_split
from rl.tasks.gym import make_gym_env  # binds the submodule name `gym` here, hence `gymnasium`
from rl.tasks.nav import Actions, PointNavEnv

__all__ = [
    "Actions",
    "PointNavEnv",
    "build_env",
    "dict_space",
    "make_gym_env",
    "task_id",
    "task_spaces",
    "with_split",
]

_NAV_ENTRY_POINT = "rl.tasks.nav:PointNavEnv"
_NAV_REGISTRATIONS: dict[str, dict[str, int]] = {
    "rl/PointNav-v0": {"size": 19, "rooms_per_side": 2, "max_steps": 100},
    "rl/PointNavSmall-v0": {"size": 9, "rooms_per_side": 2, "max_steps": 50},
}


def _register() -> None:
    """Register the PointNav envs with gymnasium, skipping ids already registered."""
    for env_id, kwargs in _NAV_REGISTRATIONS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=_NAV_ENTRY_POINT, kwargs=dict(kwargs))


_register()
