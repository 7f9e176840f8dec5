"""The argument checks and the observation space of :class:`~rl_envs.pointnav3d.PointNav3DEnv`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from rl.tasks.splits import SPLITS
from rl_envs.pointnav3d.layout import FloorplanSpec


def check_positive(**values: float) -> None:
    """ValueError naming the first of ``values`` that is not a finite positive number."""
    for name, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def check_args(
    *,
    door_width: float,
    max_steps: int,
    width: int,
    height: int,
    episodes_per_floorplan: int,
    split: str | None,
    render_mode: str | None,
    render_modes: list[str],
    **positive: float,
) -> None:
    """ValueError naming the first out-of-range argument of :class:`PointNav3DEnv`."""
    check_positive(**positive)
    agent_radius = positive["agent_radius"]
    if 2 * agent_radius >= door_width:
        raise ValueError(
            f"agent_radius={agent_radius} does not fit through door_width={door_width}"
        )
    if isinstance(max_steps, bool) or int(max_steps) < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if isinstance(episodes_per_floorplan, bool) or int(episodes_per_floorplan) < 1:
        raise ValueError(
            f"episodes_per_floorplan must be an int >= 1, got {episodes_per_floorplan!r}"
        )
    if int(width) < 8 or int(height) < 8:
        raise ValueError(f"width and height must be >= 8 pixels, got {width}x{height}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")


def observation_space(height: int, width: int, depth_high: float | None) -> spaces.Dict:
    """``rgb`` and ``goal`` (distance, cos, sin), and ``depth`` up to ``depth_high`` if given."""
    obs_spaces: dict[str, spaces.Space] = {
        "rgb": spaces.Box(0, 255, (height, width, 3), np.uint8),
        "goal": spaces.Box(
            np.array([0.0, -1.0, -1.0], np.float32),
            np.array([np.inf, 1.0, 1.0], np.float32),
            dtype=np.float32,
        ),
    }
    if depth_high is not None:
        obs_spaces["depth"] = spaces.Box(0.0, depth_high, (height, width, 1), np.float32)
    return spaces.Dict(obs_spaces)


def floorplan_spec(
    rooms: Sequence[int], room_size: Sequence[float], door_width: float, extra_door_prob: float
) -> FloorplanSpec:
    """The checked spec of ``rooms`` ``(rows, cols)`` and ``room_size`` ``(min, max)``."""
    rows, cols = (int(v) for v in rooms)
    spec = FloorplanSpec(
        rows=rows,
        cols=cols,
        room_size=(float(room_size[0]), float(room_size[1])),
        door_width=float(door_width),
        extra_door_prob=float(extra_door_prob),
    )
    spec.check()
    return spec
