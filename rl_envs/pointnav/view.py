"""The egocentric view of the PointNav task: minigrid's image encoding from numpy arrays.

Owns the direction vectors and cell encodings, the wall-padded per-episode encoding and
see-behind arrays that views are gathered from, the view cell -> world cell index tables per
direction, and minigrid's occlusion (:func:`process_vis`). Together they reproduce
``MiniGridEnv.gen_obs()["image"]`` bit for bit without minigrid's per-cell Python objects.
:func:`process_vis_row` is the same occlusion one view row at a time on bit masks, which the
batched environment (:mod:`rl_envs.pointnav.batched`) turns into a lookup table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from minigrid.core.constants import OBJECT_TO_IDX
from minigrid.core.world_object import Goal, Wall

__all__ = [
    "DIR_VEC",
    "EMPTY_ENCODING",
    "GOAL_ENCODING",
    "WALL_ENCODING",
    "episode_arrays",
    "layout_templates",
    "process_vis",
    "process_vis_row",
    "view_indices",
    "visibility_mask",
]

# Direction index -> (dx, dy), as minigrid's DIR_TO_VEC: 0 right (+x), 1 down (+y), 2 left, 3 up.
DIR_VEC: tuple[tuple[int, int], ...] = ((1, 0), (0, 1), (-1, 0), (0, -1))
EMPTY_ENCODING = (OBJECT_TO_IDX["empty"], 0, 0)
WALL_ENCODING: tuple[int, int, int] = Wall().encode()
GOAL_ENCODING: tuple[int, int, int] = Goal().encode()


def view_indices(n: int, pad: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per direction, the padded world offsets of an ``n x n`` view's cells from the agent.

    View cell ``(vx, vy)`` is world cell ``agent + f * (n - 1 - vy) + r * (vx - n // 2)`` for
    the facing vector ``f`` and ``r = (-fy, fx)``; the agent sits at view cell
    ``(n // 2, n - 1)``.

    Args:
        n: The view size.
        pad: Padding of the arrays the view is gathered from (added to the offsets).

    Returns:
        ``(view_x, view_y)``: per direction, ``(n, n)`` arrays to add to the agent's ``x`` and
        ``y`` to index a padded array.
    """
    vx, vy = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    view_x: list[np.ndarray] = []
    view_y: list[np.ndarray] = []
    for fx, fy in DIR_VEC:
        rx, ry = -fy, fx
        view_x.append(fx * (n - 1 - vy) + rx * (vx - n // 2) + pad)
        view_y.append(fy * (n - 1 - vy) + ry * (vx - n // 2) + pad)
    return view_x, view_y


def layout_templates(interior: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoding and see-behind arrays with every door slot closed (walls) and no goal.

    Padded by ``pad`` wall cells on each side, as ``Grid.slice`` reads walls outside the grid.

    Args:
        interior: ``(w, h)`` bool, True on room interiors.
        pad: Padding on each side.

    Returns:
        ``(enc, see_behind)``: uint8 ``(w + 2 pad, h + 2 pad, 3)`` and bool
        ``(w + 2 pad, h + 2 pad)``.
    """
    w, h = interior.shape
    enc = np.empty((w + 2 * pad, h + 2 * pad, 3), dtype=np.uint8)
    enc[...] = WALL_ENCODING
    enc[pad : pad + w, pad : pad + h][interior] = EMPTY_ENCODING
    see_behind = np.zeros((w + 2 * pad, h + 2 * pad), dtype=bool)
    see_behind[pad : pad + w, pad : pad + h] = interior
    return enc, see_behind


def episode_arrays(
    enc_template: np.ndarray,
    see_behind_template: np.ndarray,
    door_x: list[int],
    door_y: list[int],
    goal_pos: tuple[int, int],
    pad: int,
) -> tuple[np.ndarray, np.ndarray]:
    """An episode's padded encoding and see-behind arrays: the templates, doors and goal added.

    Args:
        enc_template: The encoding template from :func:`layout_templates`.
        see_behind_template: The see-behind template from :func:`layout_templates`.
        door_x: The episode's door x coordinates.
        door_y: The episode's door y coordinates.
        goal_pos: The goal's ``(x, y)``.
        pad: The templates' padding.

    Returns:
        ``(enc, see_behind)``, fresh arrays shaped like the templates.
    """
    enc = enc_template.copy()
    see_behind = see_behind_template.copy()
    for x, y in zip(door_x, door_y, strict=True):  # a few doors: scalar writes are fastest
        enc[x + pad, y + pad] = EMPTY_ENCODING
        see_behind[x + pad, y + pad] = True
    gx, gy = goal_pos
    enc[gx + pad, gy + pad] = GOAL_ENCODING
    return enc, see_behind


def process_vis(see_behind: list[list[bool]], n: int) -> list[list[bool]]:
    """Port of minigrid's ``Grid.process_vis`` on a rotated ``n x n`` view.

    Args:
        see_behind: ``see_behind[i][j]`` for view cell ``(i, j)`` (False for walls).
        n: The view size; the agent sits at ``(n // 2, n - 1)``.

    Returns:
        ``mask[i][j]``: whether view cell ``(i, j)`` is visible.
    """
    mask = [[False] * n for _ in range(n)]
    mask[n // 2][n - 1] = True
    for j in range(n - 1, -1, -1):
        for i in range(0, n - 1):
            if not mask[i][j] or not see_behind[i][j]:
                continue
            mask[i + 1][j] = True
            if j > 0:
                mask[i + 1][j - 1] = True
                mask[i][j - 1] = True
        for i in range(n - 1, 0, -1):
            if not mask[i][j] or not see_behind[i][j]:
                continue
            mask[i - 1][j] = True
            if j > 0:
                mask[i - 1][j - 1] = True
                mask[i][j - 1] = True
    return mask


def process_vis_row(mask: Any, see_behind: Any, n: int) -> tuple[Any, Any]:
    """:func:`process_vis` on one view row ``j``, on bit masks (bit ``i``: view cell ``(i, j)``).

    Processing row ``j`` only sets cells of rows ``j`` and ``j - 1``, and row ``j - 1`` is set
    by nothing else, so a view's visibility is this function applied row after row from the
    agent's (``mask = 1 << (n // 2)``), each row starting from the previous row's ``below``.

    Args:
        mask: The row's visible cells before its own passes (integers, any array type with
            bit operators: NumPy or torch).
        see_behind: The row's see-behind cells.
        n: The view size.

    Returns:
        ``(mask, below)``: the row's visible cells, and the cells of the next row (``j - 1``)
        it makes visible (meaningless for ``j = 0``).
    """
    below = mask & 0
    for i in range(n - 1):
        c = (mask >> i) & (see_behind >> i) & 1
        mask = mask | (c << (i + 1))
        below = below | (c << (i + 1)) | (c << i)
    for i in range(n - 1, 0, -1):
        c = (mask >> i) & (see_behind >> i) & 1
        mask = mask | (c << (i - 1))
        below = below | (c << (i - 1)) | (c << i)
    return mask, below


def visibility_mask(see_behind: np.ndarray, n: int) -> np.ndarray:
    """The visibility of an ``n x n`` view, shaped to multiply its ``(n, n, 3)`` encoding.

    Args:
        see_behind: ``(n, n)`` bool, the view's see-behind pattern.
        n: The view size.

    Returns:
        ``(n, n, 1)`` bool mask (see :func:`process_vis`).
    """
    return np.asarray(process_vis(see_behind.tolist(), n), dtype=bool)[:, :, None]
