"""The navigation grid of a 3D PointNav floorplan: free space, geodesic distances, the expert.

The floorplan is rasterised at ``resolution`` metres per cell (0.1 m by default); a cell is
*free* when its centre is at least the agent's radius from every wall segment, which is exactly
MiniWorld's collision rule (a body collides when a wall segment passes closer than its radius).

Geodesic distances come from Dijkstra's algorithm on the free cells with a 16-neighbourhood (the
8 king moves and the 8 knight moves, a move allowed only when the cells it crosses are free), run
once per episode from the goal's cell (scipy's compiled ``csgraph.dijkstra``). Its paths
overestimate the true (any-angle) shortest path by at most 2.7% (1 / cos(13.3°), the widest gap
between two move directions), against 8.2% for 8 neighbours. The distance at an arbitrary point
is the least ``field[c] + |p - c|`` over the four cell centres around it.

The expert (:func:`expert_action`) is greedy on that distance: of the headings the agent can turn
to, it takes the one whose forward step lands on free space nearest the goal, turning towards it
(the shorter way) or stepping forward when it already faces it, and stops within the success
radius.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rl_envs.pointnav3d.layout import Floorplan

if TYPE_CHECKING:
    import scipy.sparse

# scipy is imported where a grid is built (about 0.3 s): every process imports rl_envs, and
# only those that build a 3D environment need it.

__all__ = ["NavGrid", "expert_action", "point_clearance"]

# The 16-neighbourhood, one of each opposite pair, with the cells each move crosses.
_MOVES: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...] = (
    (1, 0, ()),
    (0, 1, ()),
    (1, 1, ((1, 0), (0, 1))),
    (1, -1, ((1, 0), (0, -1))),
    (2, 1, ((1, 0), (1, 1))),
    (1, 2, ((0, 1), (1, 1))),
    (2, -1, ((1, 0), (1, -1))),
    (1, -2, ((0, -1), (1, -1))),
)

# The four cells around a point, as offsets from the one below and left of it.
_CORNERS = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])

# Action indices (the task's: see rl_envs.pointnav3d.env.Actions).
_LEFT, _RIGHT, _FORWARD, _STOP = 0, 1, 2, 3


def point_clearance(points: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Distance from each of ``points [m, 2]`` to the nearest of ``segments [s, 2, 2]``."""
    a = segments[None, :, 0, :]
    ab = segments[None, :, 1, :] - a
    ap = points[:, None, :] - a
    t = np.clip((ap * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-12), 0.0, 1.0)
    closest = a + t[..., None] * ab
    d = np.sqrt(((points[:, None, :] - closest) ** 2).sum(-1))
    return d.min(axis=1) if d.shape[1] else np.full(len(points), np.inf)


class NavGrid:
    """Free space and geodesic distance fields of one floorplan (see the module docstring).

    Attributes:
        plan: The floorplan.
        resolution: Cell side, metres.
        radius: The agent's radius, metres.
        segments: The floorplan's wall segments ``[s, 2, 2]`` (x, z).
        shape: ``(nx, nz)`` cells.
        free: ``(nx, nz)`` bool, True where the agent's centre may be.
    """

    def __init__(self, plan: Floorplan, resolution: float, radius: float) -> None:
        """Rasterise ``plan`` and build its move graph.

        Args:
            plan: The floorplan.
            resolution: Cell side, metres.
            radius: The agent's radius, metres.
        """
        self.plan = plan
        self.resolution = resolution
        self.radius = radius
        self.segments = plan.wall_segments()
        width, depth = plan.extent
        nx, nz = math.ceil(width / resolution - 1e-9), math.ceil(depth / resolution - 1e-9)
        self.shape = (nx, nz)
        self._max_cell = np.array([nx - 1, nz - 1])
        self.free = self._rasterise(nx, nz)
        self._graph = self._build_graph()

    def cell_centre(self, i: np.ndarray | int, k: np.ndarray | int) -> np.ndarray:
        """Centre ``(x, z)`` of cell ``(i, k)`` (arrays broadcast to ``[..., 2]``)."""
        r = self.resolution
        return np.stack(
            np.broadcast_arrays((np.asarray(i) + 0.5) * r, (np.asarray(k) + 0.5) * r), -1
        )

    def _rasterise(self, nx: int, nz: int) -> np.ndarray:
        """Cells whose centre is at least ``radius`` from every wall (per segment, on its band)."""
        r, res = self.radius, self.resolution
        cx = (np.arange(nx) + 0.5) * res
        cz = (np.arange(nz) + 0.5) * res
        free = np.ones((nx, nz), dtype=bool)
        for (x0, z0), (x1, z1) in self.segments:
            # Only cells within `r` of the segment's bounding box can be blocked by it.
            i0 = max(int(math.floor((min(x0, x1) - r) / res)), 0)
            i1 = min(int(math.ceil((max(x0, x1) + r) / res)) + 1, nx)
            k0 = max(int(math.floor((min(z0, z1) - r) / res)), 0)
            k1 = min(int(math.ceil((max(z0, z1) + r) / res)) + 1, nz)
            if i0 >= i1 or k0 >= k1:
                continue
            px = cx[i0:i1, None]
            pz = cz[None, k0:k1]
            # Axis-aligned segments: the distance splits into an along and an across part.
            dx = np.maximum(np.maximum(min(x0, x1) - px, px - max(x0, x1)), 0.0)
            dz = np.maximum(np.maximum(min(z0, z1) - pz, pz - max(z0, z1)), 0.0)
            free[i0:i1, k0:k1] &= dx * dx + dz * dz >= r * r
        return free

    def _build_graph(self) -> scipy.sparse.csr_matrix:
        """The 16-neighbour move graph over free cells, built straight in CSR form.

        A ``(cells, 16)`` table holds each cell's neighbour per move (-1 where the move leaves
        the grid or crosses a blocked cell); its valid entries, row by row, are the CSR arrays.
        """
        import scipy.sparse

        nx, nz = self.shape
        free = self.free
        index = np.arange(nx * nz).reshape(nx, nz)
        neighbours = np.full((nx, nz, 2 * len(_MOVES)), -1, dtype=np.int32)
        weights = np.empty(2 * len(_MOVES))
        for m, (dx, dz, crossed) in enumerate(_MOVES):
            for sign, column in ((1, 2 * m), (-1, 2 * m + 1)):
                sx, sz = sign * dx, sign * dz
                i0, i1 = max(0, -sx), nx - max(0, sx)
                k0, k1 = max(0, -sz), nz - max(0, sz)
                weights[column] = self.resolution * math.hypot(dx, dz)
                if i1 <= i0 or k1 <= k0:
                    continue
                ok = free[i0:i1, k0:k1] & free[i0 + sx : i1 + sx, k0 + sz : k1 + sz]
                for cx, cz in crossed:
                    ox, oz = sign * cx, sign * cz
                    ok &= free[i0 + ox : i1 + ox, k0 + oz : k1 + oz]
                target = index[i0 + sx : i1 + sx, k0 + sz : k1 + sz]
                neighbours[i0:i1, k0:k1, column] = np.where(ok, target, -1)
        table = neighbours.reshape(nx * nz, -1)
        valid = table >= 0
        indptr = np.concatenate([[0], np.cumsum(valid.sum(axis=1))])
        data = np.broadcast_to(weights, table.shape)[valid]
        return scipy.sparse.csr_matrix((data, table[valid], indptr), shape=(nx * nz, nx * nz))

    def distance_field(self, goal_cell: tuple[int, int]) -> np.ndarray:
        """Geodesic distance (metres) of every cell to the centre of ``goal_cell``; inf if none."""
        from scipy.sparse.csgraph import dijkstra

        nz = self.shape[1]
        field = dijkstra(self._graph, directed=True, indices=goal_cell[0] * nz + goal_cell[1])
        return np.asarray(field).reshape(self.shape)

    def geodesic(self, field: np.ndarray, points: np.ndarray) -> np.ndarray:
        """Geodesic distance of ``points [m, 2]``: least ``field[c] + |p - c|`` over 4 cells."""
        res = self.resolution
        cells = np.floor(points / res - 0.5).astype(np.int64)[:, None, :] + _CORNERS
        np.clip(cells, 0, self._max_cell, out=cells)
        gap = points[:, None, :] - (cells + 0.5) * res
        d = field[cells[..., 0], cells[..., 1]] + np.sqrt((gap * gap).sum(-1))
        return d.min(axis=1)


def expert_action(
    grid: NavGrid,
    field: np.ndarray,
    position: np.ndarray,
    heading: float,
    goal: np.ndarray,
    *,
    step: float,
    turn: float,
    success_distance: float,
) -> int:
    """The next action of the greedy shortest-path expert (see the module docstring).

    Args:
        grid: The episode's navigation grid.
        field: The goal's distance field (:meth:`NavGrid.distance_field`).
        position: The agent's ``(x, z)``.
        heading: The agent's direction, radians (MiniWorld's: forward is
            ``(cos, -sin)`` in ``(x, z)``; turning left adds ``turn``).
        goal: The goal's ``(x, z)``.
        step: Forward step length, metres.
        turn: Turn angle, radians.
        success_distance: Stop within this distance of the goal.

    Returns:
        0 (left), 1 (right), 2 (forward) or 3 (stop).
    """
    if float(np.hypot(*(goal - position))) <= success_distance:
        return _STOP
    n = max(int(round(2 * math.pi / turn)), 1)
    # Turns k (left > 0) covering the circle once, fewest turns first in ties.
    ks = np.array([0] + [k for j in range(1, n // 2 + 1) for k in (j, -j)][: n - 1])
    angles = heading + ks * turn
    landing = position + step * np.stack([np.cos(angles), -np.sin(angles)], -1)
    clear = point_clearance(landing, grid.segments) >= grid.radius
    score = np.where(clear, grid.geodesic(field, landing), np.inf)
    best = int(np.argmin(score))  # first minimum: the fewest turns
    k = int(ks[best])
    if k == 0:
        return _FORWARD
    return _LEFT if k > 0 else _RIGHT
