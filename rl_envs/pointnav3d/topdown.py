"""Top-down maps of 3D PointNav episodes (numpy only), for probe videos and figures.

The map shows the floorplan (floor light, walls dark, the band the agent's centre cannot enter
shaded), the goal with its success radius (green), the path walked so far (red) and the agent
(blue, with a tick for its heading). North (z = 0) is up, x grows to the right.
"""

from __future__ import annotations

import math

import numpy as np

from rl_envs.pointnav3d.grid import NavGrid

__all__ = ["top_down_map"]

_FLOOR = np.array([236, 236, 228], np.uint8)
_BLOCKED = np.array([205, 205, 198], np.uint8)
_WALL = np.array([60, 60, 70], np.uint8)
_PATH = np.array([220, 40, 40], np.uint8)
_GOAL = np.array([40, 170, 60], np.uint8)
_AGENT = np.array([40, 90, 220], np.uint8)


def _disc(image: np.ndarray, centre: np.ndarray, radius_px: float, colour: np.ndarray) -> None:
    h, w = image.shape[:2]
    rows, cols = np.ogrid[:h, :w]
    mask = (cols + 0.5 - centre[0]) ** 2 + (rows + 0.5 - centre[1]) ** 2 <= radius_px**2
    image[mask] = colour


def _polyline(image: np.ndarray, points: np.ndarray, colour: np.ndarray, width: int = 1) -> None:
    """Draw segments between consecutive ``points [m, 2]`` (pixel ``(col, row)``)."""
    h, w = image.shape[:2]
    for a, b in zip(points[:-1], points[1:], strict=True):
        n = int(np.ceil(np.abs(b - a).max() * 2)) + 1
        t = np.linspace(0.0, 1.0, n)[:, None]
        p = np.floor(a + t * (b - a)).astype(np.int64)
        for dc in range(-(width // 2), width - width // 2):
            for dr in range(-(width // 2), width - width // 2):
                c = np.clip(p[:, 0] + dc, 0, w - 1)
                r = np.clip(p[:, 1] + dr, 0, h - 1)
                image[r, c] = colour


def top_down_map(
    grid: NavGrid,
    *,
    path: np.ndarray,
    position: np.ndarray,
    heading: float,
    goal: np.ndarray,
    success_distance: float,
    height: int = 240,
) -> np.ndarray:
    """An RGB map ``[height, W, 3]`` uint8 of the episode (see the module docstring).

    Args:
        grid: The episode's navigation grid.
        path: Positions walked ``[m, 2]`` (x, z), the start first.
        position: The agent's ``(x, z)``.
        heading: The agent's direction, radians (MiniWorld's convention).
        goal: The goal's ``(x, z)``.
        success_distance: Radius drawn around the goal, metres.
        height: Image height, pixels (the width follows the floorplan's aspect).
    """
    width_m, depth_m = grid.plan.extent
    margin = 0.3
    scale = (height - 1) / (depth_m + 2 * margin)  # pixels per metre
    width = int(math.ceil((width_m + 2 * margin) * scale)) + 1

    def px(points: np.ndarray) -> np.ndarray:
        return (np.asarray(points, np.float64).reshape(-1, 2) + margin) * scale

    image = np.full((height, width, 3), 255, np.uint8)
    # Floor and the blocked band, from the grid (nearest cell per pixel).
    cols = (np.arange(width) + 0.5) / scale - margin
    rows = (np.arange(height) + 0.5) / scale - margin
    i = np.floor(cols / grid.resolution).astype(np.int64)
    k = np.floor(rows / grid.resolution).astype(np.int64)
    inside_c = (cols >= 0) & (cols < width_m)
    inside_r = (rows >= 0) & (rows < depth_m)
    ii = np.clip(i, 0, grid.shape[0] - 1)
    kk = np.clip(k, 0, grid.shape[1] - 1)
    free = grid.free[ii[None, :], kk[:, None]]
    inside = inside_r[:, None] & inside_c[None, :]
    image[inside & free] = _FLOOR
    image[inside & ~free] = _BLOCKED
    for segment in grid.segments:
        _polyline(image, px(segment), _WALL, width=2)
    _disc(image, px(goal)[0], max(success_distance * scale, 2.0), _GOAL)
    if len(path) > 1:
        _polyline(image, px(path), _PATH, width=2)
    centre = px(position)[0]
    _disc(image, centre, max(grid.radius * scale, 2.5), _AGENT)
    tip = np.asarray(position) + 2 * grid.radius * np.array(
        [math.cos(heading), -math.sin(heading)]
    )
    _polyline(image, np.stack([centre, px(tip)[0]]), _AGENT, width=2)
    return image
