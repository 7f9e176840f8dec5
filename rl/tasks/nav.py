"""PointNav on minigrid room layouts, with a fast egocentric observation path.

The agent must walk to a goal cell in a FourRooms-like grid and then take ``STOP``. The policy
observes minigrid's egocentric 7x7 encoding (with occlusion) plus a GPS+compass vector to the goal
in its own frame. Rewards follow habitat's PointNav: the decrease in geodesic distance, minus a
step penalty, plus a success bonus for stopping on the goal. ``info["expert_action"]`` gives a
shortest-path action on every step (for imitation or diagnostics; never in the observation).

The observation is bit-identical to minigrid's ``MiniGridEnv.gen_obs()["image"]`` but is built
from numpy arrays encoded once per episode, and cached per ``(x, y, direction)``, instead of
minigrid's per-cell Python objects. ``reset()`` is cheap too: the layout is drawn as a few
integers (one random call), the geodesic distance field is computed exactly from the room
structure (Manhattan distances within each rectangular room, a tiny Dijkstra over the doors), and
the minigrid ``Grid`` (only needed for rendering and minigrid's own ``gen_obs``) is built lazily
on first access of ``self.grid``.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

import numpy as np
from gymnasium import spaces
from minigrid.core.constants import OBJECT_TO_IDX
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.core.world_object import Goal, Wall
from minigrid.minigrid_env import MiniGridEnv

__all__ = ["Actions", "PointNavEnv"]

# Direction index -> (dx, dy), as minigrid's DIR_TO_VEC: 0 right (+x), 1 down (+y), 2 left, 3 up.
_DIR_VEC: tuple[tuple[int, int], ...] = ((1, 0), (0, 1), (-1, 0), (0, -1))
_EMPTY_ENCODING = (OBJECT_TO_IDX["empty"], 0, 0)
_WALL_ENCODING = Wall().encode()
_GOAL_ENCODING = Goal().encode()
# Larger than any geodesic distance; marks "no entry" in the distance computation.
_FAR = 1 << 40
# Random draws are packed into integers below this bound (numpy's int64 range, with margin).
_MAX_PACKED = 1 << 62
# Visibility depends only on the view's see-behind pattern; walls repeat, so patterns do too.
_VIS_CACHE_LIMIT = 100_000


class Actions(IntEnum):
    """The discrete PointNav actions."""

    LEFT = 0
    RIGHT = 1
    FORWARD = 2
    STOP = 3


def _mission() -> str:
    """Return the (constant) mission string; module-level so the env stays picklable."""
    return "go to the goal and stop"


def _room_walls(size: int, rooms_per_side: int) -> list[int]:
    """Coordinates of the wall lines (outer walls included) splitting ``size`` into rooms.

    Interior cells are shared as evenly as possible, the first rooms taking any remainder;
    size 19 with 2 rooms gives ``[0, 9, 18]`` like minigrid's FourRooms.
    """
    interior = size - rooms_per_side - 1
    base, extra = divmod(interior, rooms_per_side)
    walls = [0]
    for r in range(rooms_per_side):
        walls.append(walls[-1] + base + (1 if r < extra else 0) + 1)
    return walls


def _process_vis(see_behind: list[list[bool]], n: int) -> list[list[bool]]:
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


class PointNavEnv(MiniGridEnv):
    """Point-goal navigation in a grid of ``rooms_per_side x rooms_per_side`` rooms.

    Observations are ``{"image": uint8 (view, view, 3), "goal": float32 (3,)}`` where ``image`` is
    minigrid's egocentric encoding and ``goal`` is ``(forward, right, euclidean distance)`` to the
    goal in cells, in the agent's frame (exactly zero on the goal cell). Actions are
    :class:`Actions`. ``STOP`` ends the episode (success only on the goal cell); reaching
    ``max_steps`` truncates it. The final step's ``info["episode_metrics"]`` holds ``success``,
    ``spl``, ``final_distance`` and ``shortest_path_length``.
    """

    def __init__(
        self,
        *,
        size: int = 19,
        rooms_per_side: int = 2,
        max_steps: int = 100,
        step_penalty: float = 0.01,
        success_bonus: float = 2.5,
        distance_reward_scale: float = 1.0,
        min_start_distance: int = 1,
        agent_view_size: int = 7,
        render_mode: str | None = None,
    ) -> None:
        """Build the environment.

        Args:
            size: Side of the square grid, outer walls included.
            rooms_per_side: Rooms per row and column (1: a single open room).
            max_steps: Steps after which the episode is truncated.
            step_penalty: Subtracted from the reward on every step.
            success_bonus: Added to the reward when ``STOP`` is taken on the goal cell.
            distance_reward_scale: Multiplies the per-step decrease of geodesic distance.
            min_start_distance: Minimum geodesic distance (cells) from start to goal.
            agent_view_size: Side of the egocentric view (odd, >= 3).
            render_mode: ``None``, ``"rgb_array"`` or ``"human"``.

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
        for name, fvalue in (
            ("step_penalty", step_penalty),
            ("success_bonus", success_bonus),
            ("distance_reward_scale", distance_reward_scale),
        ):
            if not math.isfinite(float(fvalue)):
                raise ValueError(f"{name} must be a finite number, got {fvalue!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, "
                f"got {render_mode!r}"
            )

        super().__init__(
            mission_space=MissionSpace(mission_func=_mission),
            grid_size=size,
            max_steps=max_steps,
            see_through_walls=False,
            agent_view_size=agent_view_size,
            render_mode=render_mode,
        )
        self.size = size
        self.rooms_per_side = rooms_per_side
        self.step_penalty = float(step_penalty)
        self.success_bonus = float(success_bonus)
        self.distance_reward_scale = float(distance_reward_scale)
        self.min_start_distance = min_start_distance

        self.actions = Actions  # type: ignore[assignment]
        self.action_space = spaces.Discrete(len(Actions))
        n = agent_view_size
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(low=0, high=255, shape=(n, n, 3), dtype=np.uint8),
                "goal": spaces.Box(low=-np.inf, high=np.inf, shape=(3,), dtype=np.float32),
            }
        )
        self.reward_range = (-math.inf, math.inf)  # type: ignore[assignment]

        self._walls_at = _room_walls(size, rooms_per_side)
        # View cell (vx, vy) -> world offset from the agent, per direction:
        # world = agent + f * (n - 1 - vy) + r * (vx - n // 2), with r = (-fy, fx).
        vx, vy = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        self._pad = n
        self._view_x: list[np.ndarray] = []
        self._view_y: list[np.ndarray] = []
        for fx, fy in _DIR_VEC:
            rx, ry = -fy, fx
            self._view_x.append(fx * (n - 1 - vy) + rx * (vx - n // 2) + self._pad)
            self._view_y.append(fy * (n - 1 - vy) + ry * (vx - n // 2) + self._pad)

        self._build_layout_tables()

        # Per-episode state (filled by reset).
        self.goal_pos: tuple[int, int] = (-1, -1)
        self.distance_field: np.ndarray = np.full((size, size), -1, dtype=np.int64)
        self._dist: list[list[int]] = []
        self._free = np.zeros((size, size), dtype=bool)
        self._door_x: list[int] = []
        self._door_y: list[int] = []
        self._door_v: list[int] = []
        self._enc_padded = np.zeros((size + 2 * n, size + 2 * n, 3), dtype=np.uint8)
        self._see_behind_padded = np.zeros((size + 2 * n, size + 2 * n), dtype=bool)
        self._image_cache: dict[int, np.ndarray] = {}
        # see-behind pattern bytes -> (n, n, 1) visibility mask; kept across episodes.
        self._vis_cache: dict[bytes, np.ndarray] = {}
        self._start_distance = 0
        self._cells_moved = 0
        self._done = False

    # ------------------------------------------------------------------ layout

    @property
    def grid(self) -> Grid:
        """The minigrid ``Grid`` of the current episode, built on first access.

        Only rendering and minigrid's own methods (``gen_obs``, ``hash``, ...) need it; the fast
        observation path and ``step`` use numpy arrays, so ``reset`` does not build it.
        """
        grid = self._grid
        if grid is None:
            grid = self._grid = self._build_minigrid_grid()
        return grid

    @grid.setter
    def grid(self, value: Grid | None) -> None:
        self._grid = value

    def _build_layout_tables(self) -> None:
        """Precompute what every episode's layout shares (walls, rooms, door slots, templates).

        Rooms are the rectangles between consecutive wall lines; each interior wall segment
        between two adjacent rooms holds one door, drawn uniformly along the segment.
        """
        w = h = self.size
        k = self.rooms_per_side
        lines = self._walls_at
        # Door slots in drawing order: per room (row-major), the wall to its right, then below.
        # A door is at (x0 + ax * v, y0 + ay * v) for v uniform in range(size).
        slots: list[tuple[int, int, int, int, int]] = []  # (x0, y0, ax, ay, size)
        room_doors: list[list[int]] = [[] for _ in range(k * k)]
        for j in range(k):
            for i in range(k):
                r = j * k + i
                y_top, y_bottom = lines[j], lines[j + 1]
                x_left, x_right = lines[i], lines[i + 1]
                if i + 1 < k:
                    slots.append((x_right, y_top + 1, 0, 1, y_bottom - y_top - 1))
                    room_doors[r].append(len(slots) - 1)
                    room_doors[r + 1].append(len(slots) - 1)
                if j + 1 < k:
                    slots.append((x_left + 1, y_bottom, 1, 0, x_right - x_left - 1))
                    room_doors[r].append(len(slots) - 1)
                    room_doors[r + k].append(len(slots) - 1)
        n_doors = len(slots)
        self._door_slots = slots
        self._room_doors = room_doors
        # Doors sharing a room (the only door-to-door moves that do not pass another door).
        self._door_adj = [
            sorted({e for r in range(k * k) if d in room_doors[r] for e in room_doors[r]} - {d})
            for d in range(n_doors)
        ]

        # Interior cells grouped by room (contiguous slices), and the cell -> room map.
        cell_x: list[int] = []
        cell_y: list[int] = []
        cell_room: list[int] = []
        room_slice: list[tuple[int, int]] = []
        room_of_flat = [-1] * (w * h)
        for j in range(k):
            for i in range(k):
                r = j * k + i
                first = len(cell_x)
                for x in range(lines[i] + 1, lines[i + 1]):
                    for y in range(lines[j] + 1, lines[j + 1]):
                        cell_x.append(x)
                        cell_y.append(y)
                        cell_room.append(r)
                        room_of_flat[x * h + y] = r
                room_slice.append((first, len(cell_x)))
        self._cell_x, self._cell_y = cell_x, cell_y
        self._room_slice = room_slice
        self._room_of_flat = room_of_flat
        self._cell_x_np = np.asarray(cell_x, dtype=np.int64)
        self._cell_y_np = np.asarray(cell_y, dtype=np.int64)
        self._cell_flat = self._cell_x_np * h + self._cell_y_np
        # Door slots of each cell's room, padded with a dummy entry (index n_doors, never best:
        # its distance is _FAR). Per (cell, slot), the distance from the cell to the slot's wall
        # line and the cell's coordinate along that wall relative to the slot's start, so the
        # Manhattan distance to a door drawn at offset v is perp + |along - v|.
        width = max(1, max(len(d) for d in room_doors))
        table = np.full((k * k, width), n_doors, dtype=np.intp)
        for r, doors in enumerate(room_doors):
            table[r, : len(doors)] = doors
        cell_slots = table[np.asarray(cell_room, dtype=np.intp)]
        slot_params = np.asarray([*(slot[:4] for slot in slots), (0, 0, 0, 0)], dtype=np.int64)
        x0, y0, ax, ay = slot_params[cell_slots].transpose(2, 0, 1)
        cx = np.asarray(cell_x, dtype=np.int64)[:, None]
        cy = np.asarray(cell_y, dtype=np.int64)[:, None]
        # Vertical wall (ax=0, ay=1): perp |cx - x0|, along cy - y0; horizontal: swapped.
        # Stored slot-major, (slots, cells): `take` and a min over axis 0 are fast on these.
        self._cell_slots = np.ascontiguousarray(cell_slots.T)
        self._slot_perp = np.ascontiguousarray((ay * np.abs(cx - x0) + ax * np.abs(cy - y0)).T)
        self._slot_along = np.ascontiguousarray((ay * (cy - y0) + ax * (cx - x0)).T)
        self._n_free = len(cell_x) + n_doors

        # Random draws per episode: each door's offset, goal cell, direction, start cell (the
        # latter by rejection, see _gen_grid). Packed into as few uniform integers as fit.
        radices = [slot[4] for slot in slots] + [self._n_free, 4, self._n_free]
        chunks: list[tuple[int, list[int]]] = []
        bound, group = 1, []
        for radix in radices:
            if group and bound * radix > _MAX_PACKED:
                chunks.append((bound, group))
                bound, group = 1, []
            bound *= radix
            group.append(radix)
        chunks.append((bound, group))
        self._draw_chunks = chunks

        # Templates with every door slot closed (walls) and no goal, padded with walls as
        # Grid.slice does outside the grid.
        pad = self._pad
        interior = np.zeros((w, h), dtype=bool)
        interior.flat[self._cell_flat] = True
        self._interior = interior
        enc = np.empty((w + 2 * pad, h + 2 * pad, 3), dtype=np.uint8)
        enc[...] = _WALL_ENCODING
        enc[pad : pad + w, pad : pad + h][interior] = _EMPTY_ENCODING
        see_behind = np.zeros((w + 2 * pad, h + 2 * pad), dtype=bool)
        see_behind[pad : pad + w, pad : pad + h] = interior
        self._enc_template = enc
        self._see_behind_template = see_behind

    def _draw(self, rng: np.random.Generator) -> list[int]:
        """Draw the episode's uniform integers (see ``_draw_chunks``), exactly uniform each."""
        values: list[int] = []
        for bound, radices in self._draw_chunks:
            u = int(rng.integers(bound))
            for radix in radices:
                u, v = divmod(u, radix)
                values.append(v)
        return values

    def _free_cell(self, index: int) -> tuple[int, int]:
        """Free cell ``index`` in ``range(n_free)``: interior cells (by room), then doors."""
        m = len(self._cell_x)
        if index < m:
            return self._cell_x[index], self._cell_y[index]
        return self._door_x[index - m], self._door_y[index - m]

    def _gen_grid(self, width: int, height: int) -> None:
        """Draw doors, goal, agent start and direction for a new episode (minigrid's hook).

        Doors are uniform in each wall segment, the goal uniform over free cells, the start
        uniform over free cells at geodesic distance >= ``min_start_distance`` from the goal
        (a pre-drawn free cell, accepted if far enough, else one draw among the candidates:
        exactly uniform either way), and the direction uniform.
        """
        rng = self.np_random
        values = self._draw(rng)
        n_doors = len(self._door_slots)
        door_x: list[int] = []
        door_y: list[int] = []
        for (x0, y0, ax, ay, _), v in zip(self._door_slots, values, strict=False):
            door_x.append(x0 + ax * v)
            door_y.append(y0 + ay * v)
        self._door_x, self._door_y = door_x, door_y
        self._door_v = values[:n_doors]
        goal_index, direction, start_index = values[n_doors : n_doors + 3]
        min_dist = self.min_start_distance

        for attempt in range(100):
            if attempt:
                goal_index = int(rng.integers(self._n_free))
            gx, gy = self._free_cell(goal_index)
            dist = self._bfs(gx, gy)
            dist_list = dist.tolist()
            if attempt == 0:  # the pre-drawn start, accepted if far enough
                sx, sy = self._free_cell(start_index)
                if dist_list[sx][sy] >= min_dist:
                    break
            candidates = np.flatnonzero(dist >= min_dist)
            if len(candidates):
                sx, sy = divmod(int(candidates[int(rng.integers(len(candidates)))]), height)
                break
        else:
            raise RuntimeError(
                f"no start cell at geodesic distance >= {min_dist} from the goal "
                f"after 100 goal draws; lower min_start_distance"
            )
        self.goal_pos = (gx, gy)
        self.distance_field = dist
        self._dist = dist_list
        self._free = dist >= 0
        self.agent_pos = (sx, sy)
        self.agent_dir = direction
        self._grid = None  # built on demand by the `grid` property

        # Static numpy encoding of this episode's layout, from the templates.
        pad = self._pad
        enc = self._enc_template.copy()
        see_behind = self._see_behind_template.copy()
        for x, y in zip(door_x, door_y, strict=True):  # a few doors: scalar writes are fastest
            enc[x + pad, y + pad] = _EMPTY_ENCODING
            see_behind[x + pad, y + pad] = True
        enc[gx + pad, gy + pad] = _GOAL_ENCODING
        self._enc_padded = enc
        self._see_behind_padded = see_behind
        self._image_cache = {}

    def _build_minigrid_grid(self) -> Grid:
        """The minigrid ``Grid`` of the current layout: one shared ``Wall``, and the ``Goal``."""
        grid = Grid(self.width, self.height)
        wall = Wall()
        free_list = self._free.T.ravel().tolist()  # index j * width + i
        grid.grid = [None if f else wall for f in free_list]
        if self.goal_pos[0] >= 0:
            goal = Goal()
            grid.set(*self.goal_pos, goal)
            goal.init_pos = goal.cur_pos = self.goal_pos
        return grid

    def _bfs(self, gx: int, gy: int) -> np.ndarray:
        """Geodesic (4-connected) distance from ``(gx, gy)`` over free cells; -1 elsewhere.

        Exactly what a breadth-first search gives, computed from the room structure for the
        current doors (``self._door_x``, ``self._door_y``): inside a rectangular room the
        shortest path between two cells (or a cell and a door in the room's wall) is their
        Manhattan distance, and a shortest path to a cell outside the goal's room enters that
        room last through one of its doors. So door distances come from a Dijkstra over the
        doors (edges between doors of a common room), and each interior cell takes the minimum
        over its room's doors of door distance + Manhattan distance (or its Manhattan distance
        to the goal, in the goal's room).
        """
        w, h = self.width, self.height
        door_x, door_y = self._door_x, self._door_y
        n_doors = len(door_x)
        far = _FAR
        door_dist = [far] * n_doors
        goal_room = self._room_of_flat[gx * h + gy]
        if goal_room >= 0:
            for d in self._room_doors[goal_room]:
                door_dist[d] = abs(door_x[d] - gx) + abs(door_y[d] - gy)
        else:  # the goal is a door
            for d in range(n_doors):
                if door_x[d] == gx and door_y[d] == gy:
                    door_dist[d] = 0
        # Dijkstra over the doors (a handful of nodes: O(n^2) without a heap).
        pending = list(range(n_doors))
        adj = self._door_adj
        while pending:
            u = min(pending, key=door_dist.__getitem__)
            pending.remove(u)
            du, ux, uy = door_dist[u], door_x[u], door_y[u]
            for v in adj[u]:
                dv = du + abs(door_x[v] - ux) + abs(door_y[v] - uy)
                if dv < door_dist[v]:
                    door_dist[v] = dv

        # (slots, cells): Manhattan distance to the slot's door plus the door's distance.
        gathered = np.array([[*self._door_v, 0], [*door_dist, far]], dtype=np.int64).take(
            self._cell_slots, axis=1
        )
        cell_to_door = gathered[0]
        cell_to_door -= self._slot_along
        np.abs(cell_to_door, out=cell_to_door)
        cell_to_door += self._slot_perp
        cell_to_door += gathered[1]
        cell_dist = cell_to_door.min(axis=0)
        if goal_room >= 0:  # direct Manhattan distance within the goal's room
            lo, hi = self._room_slice[goal_room]
            cx = self._cell_x_np[lo:hi]
            cy = self._cell_y_np[lo:hi]
            cell_dist[lo:hi] = np.abs(cx - gx) + np.abs(cy - gy)

        field = np.full(w * h, -1, dtype=np.int64)
        field[self._cell_flat] = cell_dist
        for x, y, d in zip(door_x, door_y, door_dist, strict=True):
            field[x * h + y] = d
        return field.reshape(w, h)

    # ------------------------------------------------------------- observation

    def _image(self) -> np.ndarray:
        """Egocentric view, identical to ``MiniGridEnv.gen_obs()["image"]`` (a fresh copy)."""
        x, y = self.agent_pos
        d = self.agent_dir
        key = ((x * self.height) + y) * 4 + d
        image = self._image_cache.get(key)
        if image is None:
            n = self.agent_view_size
            ix = self._view_x[d] + x
            iy = self._view_y[d] + y
            view = self._enc_padded[ix, iy]
            see_behind = self._see_behind_padded[ix, iy]
            vis_key = see_behind.tobytes()
            mask = self._vis_cache.get(vis_key)
            if mask is None:
                mask = np.asarray(_process_vis(see_behind.tolist(), n), dtype=bool)[:, :, None]
                if len(self._vis_cache) >= _VIS_CACHE_LIMIT:
                    self._vis_cache.clear()
                self._vis_cache[vis_key] = mask
            image = view * mask
            image[n // 2, n - 1] = _EMPTY_ENCODING  # minigrid clears the agent's own cell
            self._image_cache[key] = image
        return image.copy()

    def _goal_vector(self) -> np.ndarray:
        """``(forward, right, distance)`` to the goal, in cells, in the agent's frame."""
        ox = self.goal_pos[0] - self.agent_pos[0]
        oy = self.goal_pos[1] - self.agent_pos[1]
        fx, fy = _DIR_VEC[self.agent_dir]
        forward = ox * fx + oy * fy
        right = -ox * fy + oy * fx
        return np.array([forward, right, math.hypot(ox, oy)], dtype=np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"image": self._image(), "goal": self._goal_vector()}

    def expert_action(self) -> int:
        """Next action on a shortest path to the goal (then ``STOP``)."""
        x, y = self.agent_pos
        dist = self._dist
        target = dist[x][y] - 1
        if target < 0:
            return int(Actions.STOP)
        d = self.agent_dir
        fx, fy = _DIR_VEC[d]
        if dist[x + fx][y + fy] == target:
            return int(Actions.FORWARD)
        lx, ly = _DIR_VEC[(d - 1) % 4]
        if dist[x + lx][y + ly] == target:
            return int(Actions.LEFT)
        return int(Actions.RIGHT)

    # ------------------------------------------------------------------ gym API

    def reset(  # type: ignore[override]
        self,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode: new doors, goal and start; same seed -> same episode.

        Args:
            seed: Seed for ``self.np_random`` (only reseeds when given).
            options: Unused.

        Returns:
            The first observation and ``{"expert_action": int}``.
        """
        super(MiniGridEnv, self).reset(seed=seed)  # gym.Env.reset: seeding only
        self._gen_grid(self.width, self.height)
        self.carrying = None
        self.step_count = 0
        self._start_distance = self._dist[self.agent_pos[0]][self.agent_pos[1]]
        self._cells_moved = 0
        self._done = False
        if self.render_mode == "human":
            self.render()
        return self._obs(), {"expert_action": self.expert_action()}

    def step(  # type: ignore[override]
        self, action: int | np.integer
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one action.

        Args:
            action: An :class:`Actions` value (0 left, 1 right, 2 forward, 3 stop).

        Returns:
            ``(obs, reward, terminated, truncated, info)``; ``info["expert_action"]`` always,
            ``info["episode_metrics"]`` on the episode's last step.

        Raises:
            ValueError: On an unknown action.
        """
        a = int(action)
        self.step_count += 1
        x, y = self.agent_pos
        d_prev = self._dist[x][y]
        terminated = False
        success = False
        if a == 0:
            self.agent_dir = (self.agent_dir - 1) % 4
        elif a == 1:
            self.agent_dir = (self.agent_dir + 1) % 4
        elif a == 2:
            fx, fy = _DIR_VEC[self.agent_dir]
            nx, ny = x + fx, y + fy
            if self._dist[nx][ny] >= 0:  # free (every free cell is reachable)
                self.agent_pos = (nx, ny)
                self._cells_moved += 1
        elif a == 3:
            terminated = True
            success = d_prev == 0
        else:
            raise ValueError(f"unknown action {action!r}; expected 0..{len(Actions) - 1}")

        d_new = self._dist[self.agent_pos[0]][self.agent_pos[1]]
        reward = self.distance_reward_scale * (d_prev - d_new) - self.step_penalty
        if success:
            reward += self.success_bonus
        truncated = not terminated and self.step_count >= self.max_steps

        info: dict[str, Any] = {"expert_action": self.expert_action()}
        if terminated or truncated:
            length = float(self._start_distance)
            spl = length / max(float(self._cells_moved), length) if success else 0.0
            if success and length == 0.0:
                spl = 1.0
            info["episode_metrics"] = {
                "success": float(success),
                "spl": float(spl),
                "final_distance": float(d_new),
                "shortest_path_length": length,
            }
        if self.render_mode == "human":
            self.render()
        return self._obs(), float(reward), terminated, truncated, info
