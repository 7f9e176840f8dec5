"""The example environments: PointNav on a grid and in 3D, multi-agent PointNav, and toys.

They are written against the framework's task API (:mod:`rl.tasks`: spaces, step fields,
splits, the batched-environment contract, the PettingZoo adapter) and nothing else; ``rl`` never
imports this package (an import contract), so a task of your own stands where these do.

- :mod:`rl_envs.pointnav`: grid PointNav (``task=nav``, ``nav_small``), its batched twin in torch
  (what ``sampler=batched`` steps) and its multi-agent form (``task=nav_multi``);
- :mod:`rl_envs.pointnav3d`: PointNav from pixels in MiniWorld interiors (``task=nav3d``);
- :mod:`rl_envs.minigrid` and :mod:`rl_envs.atari`: MiniGrid and Atari 2600 games prepared for
  the framework's CNNs (``task=minigrid``, ``task=atari``);
- :mod:`rl_envs.toys`: small tasks for tests and examples (every space kind, agents that leave
  early, a corridor written per environment and batched, environments that fail on purpose).

Importing this package registers with gymnasium (idempotently) ``rl/PointNav-v0`` (19x19, 2x2
rooms, 100 steps), ``rl/PointNavSmall-v0`` (9x9, 2x2 rooms, 50 steps), ``rl/PointNav3D-v0``
(3x3 rooms of 3-5 m, 500 steps) and ``rl/PointNav3DSmall-v0`` (1x2 rooms of 3-4 m, 150 steps):
``import rl_envs`` before ``gymnasium.make("rl/PointNav-v0")``. It imports no environment
module and starts no OpenGL (a 3D environment starts EGL when it is built).
"""

from __future__ import annotations

from typing import Any

import gymnasium

_REGISTRATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "rl/PointNav-v0": (
        "rl_envs.pointnav.env:PointNavEnv",
        {"size": 19, "rooms_per_side": 2, "max_steps": 100},
    ),
    "rl/PointNavSmall-v0": (
        "rl_envs.pointnav.env:PointNavEnv",
        {"size": 9, "rooms_per_side": 2, "max_steps": 50},
    ),
    "rl/PointNav3D-v0": (
        "rl_envs.pointnav3d.env:PointNav3DEnv",
        {"rooms": (3, 3), "room_size": (3.0, 5.0), "max_steps": 500},
    ),
    "rl/PointNav3DSmall-v0": (
        "rl_envs.pointnav3d.env:PointNav3DEnv",
        {"rooms": (1, 2), "room_size": (3.0, 4.0), "max_steps": 150},
    ),
}


def _register() -> None:
    """Register the navigation envs with gymnasium, skipping ids already registered."""
    for env_id, (entry_point, kwargs) in _REGISTRATIONS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))


_register()
