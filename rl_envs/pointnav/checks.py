"""The argument checks and the observation space of :class:`~rl_envs.pointnav.env.PointNavEnv`."""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX


def checked_args(
    *,
    size: int,
    rooms_per_side: int,
    max_steps: int,
    min_start_distance: int,
    agent_view_size: int,
    floats: dict[str, float],
    render_mode: str | None,
    render_modes: list[str],
) -> tuple[int, int, int, int, int]:
    """Validate :class:`PointNavEnv`'s arguments (see its ``__init__``).

    Returns:
        ``(size, rooms_per_side, max_steps, min_start_distance, agent_view_size)`` as ints.

    Raises:
        ValueError: If an argument is out of range or the rooms would be too small.
    """
    for name, value in (
        ("size", size),
        ("rooms_per_side", rooms_per_side),
        ("max_steps", max_steps),
        ("min_start_distance", min_start_distance),
        ("agent_view_size", agent_view_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name} must be an int, got {value!r}")
    size, rooms_per_side, max_steps = int(size), int(rooms_per_side), int(max_steps)
    min_start_distance, agent_view_size = int(min_start_distance), int(agent_view_size)
    if rooms_per_side < 1:
        raise ValueError(f"rooms_per_side must be >= 1, got {rooms_per_side}")
    room_interior = (size - rooms_per_side - 1) // rooms_per_side
    if room_interior < 2:
        raise ValueError(
            f"size={size} is too small for rooms_per_side={rooms_per_side}: each room needs "
            f"an interior of at least 2x2 cells, i.e. size >= {3 * rooms_per_side + 1}"
        )
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if min_start_distance < 0:
        raise ValueError(f"min_start_distance must be >= 0, got {min_start_distance}")
    if agent_view_size < 3 or agent_view_size % 2 == 0:
        raise ValueError(f"agent_view_size must be odd and >= 3, got {agent_view_size}")
    for name, fvalue in floats.items():
        if not math.isfinite(float(fvalue)):
            raise ValueError(f"{name} must be a finite number, got {fvalue!r}")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be None or one of {render_modes}, got {render_mode!r}")
    return size, rooms_per_side, max_steps, min_start_distance, agent_view_size


_IMAGE_HIGH = np.array(
    [max(OBJECT_TO_IDX.values()), max(COLOR_TO_IDX.values()), max(STATE_TO_IDX.values())],
    dtype=np.uint8,
)


def observation_space(n: int) -> spaces.Dict:
    """The observation space for an ``n x n`` view (see :class:`PointNavEnv`)."""
    return spaces.Dict(
        {
            # minigrid's (object, colour, state) indices: at most 10, 5 and 2.
            "image": spaces.Box(
                low=0, high=np.broadcast_to(_IMAGE_HIGH, (n, n, 3)), dtype=np.uint8
            ),
            "goal": spaces.Box(low=-np.inf, high=np.inf, shape=(3,), dtype=np.float32),
        }
    )
