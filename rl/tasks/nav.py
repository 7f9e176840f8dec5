"""PointNav on minigrid room layouts, with a fast egocentric observation path.

The agent must walk to a goal cell in a FourRooms-like grid and then take ``STOP``. The policy
observes minigrid's egocentric 7x7 encoding (with occlusion) plus a GPS+compass vector to the goal
in its own frame. Rewards follow habitat's PointNav: the decrease in geodesic distance, minus a
step penalty, plus a success bonus for stopping on the goal. ``info["expert_action"]`` gives a
shortest-path action on every step (for imitation or diagnostics; never in the observation).

The observation is bit-identical to minigrid's ``MiniGridEnv.gen_obs()["image"]`` but is built
from numpy arrays encoded once per episode, and cached per ``(x, y, direction)``, instead of
minigrid's per-cell Python objects.
"""

from __future__ import annotations

import math
from collections import deque
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

        # Per-episode state (filled by reset).
        self.goal_pos: tuple[int, int] = (-1, -1)
        self.distance_field: np.ndarray = np.full((size, size), -1, dtype=np.int64)
        self._dist: list[list[int]] = []
        self._free = np.zeros((size, size), dtype=bool)
        self._enc_padded = np.zeros((size + 2 * n, size + 2 * n, 3), dtype=np.uint8)
        self._see_behind_padded = np.zeros((size + 2 * n, size + 2 * n), dtype=bool)
        self._image_cache: dict[int, np.ndarray] = {}
        # see-behind pattern bytes -> (n, n, 1) visibility mask; kept across episodes.
        self._vis_cache: dict[bytes, np.ndarray] = {}
        self._start_distance = 0
        self._cells_moved = 0
        self._done = False

    # ------------------------------------------------------------------ layout

    def _gen_grid(self, width: int, height: int) -> None:
        """Draw walls, doors, goal and agent start for a new episode (minigrid's hook)."""
        walls = np.zeros((width, height), dtype=bool)
        walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
        lines = self._walls_at
        for p in lines[1:-1]:
            walls[p, :] = True
            walls[:, p] = True
        k = self.rooms_per_side
        for j in range(k):  # row of rooms
            for i in range(k):  # column of rooms
                x_left, x_right = lines[i], lines[i + 1]
                y_top, y_bottom = lines[j], lines[j + 1]
                if i + 1 < k:  # door in the wall to the right of this room
                    walls[x_right, self._rand_int(y_top + 1, y_bottom)] = False
                if j + 1 < k:  # door in the wall below this room
                    walls[self._rand_int(x_left + 1, x_right), y_bottom] = False

        self._free = ~walls
        free_cells = np.argwhere(self._free)  # (N, 2) of (x, y), row-major in x
        for _ in range(100):
            gx, gy = free_cells[self._rand_int(0, len(free_cells))]
            dist = self._bfs(int(gx), int(gy))
            candidates = np.argwhere(dist >= max(self.min_start_distance, 0))
            if len(candidates):
                break
        else:
            raise RuntimeError(
                f"no start cell at geodesic distance >= {self.min_start_distance} from the goal "
                f"after 100 goal draws; lower min_start_distance"
            )
        sx, sy = candidates[self._rand_int(0, len(candidates))]
        self.goal_pos = (int(gx), int(gy))
        self.distance_field = dist
        self._dist = dist.tolist()
        self.agent_pos = (int(sx), int(sy))
        self.agent_dir = int(self._rand_int(0, 4))

        # minigrid Grid (for rendering and the reference gen_obs): one shared Wall instance.
        grid = Grid(width, height)
        wall = Wall()
        walls_list = walls.T.ravel().tolist()  # index j * width + i
        grid.grid = [wall if w else None for w in walls_list]
        goal = Goal()
        grid.set(*self.goal_pos, goal)
        goal.init_pos = goal.cur_pos = self.goal_pos
        self.grid = grid

        # Static numpy encoding, padded with walls as Grid.slice does outside the grid.
        pad = self._pad
        wall_enc = np.asarray(wall.encode(), dtype=np.uint8)
        enc = np.empty((width + 2 * pad, height + 2 * pad, 3), dtype=np.uint8)
        enc[...] = wall_enc
        inner = enc[pad : pad + width, pad : pad + height]
        inner[self._free] = _EMPTY_ENCODING
        inner[self.goal_pos] = goal.encode()
        see_behind = np.zeros((width + 2 * pad, height + 2 * pad), dtype=bool)
        see_behind[pad : pad + width, pad : pad + height] = self._free
        self._enc_padded = enc
        self._see_behind_padded = see_behind
        self._image_cache = {}

    def _bfs(self, gx: int, gy: int) -> np.ndarray:
        """Geodesic (4-connected) distance from ``(gx, gy)`` over free cells; -1 elsewhere.

        Runs on flat indices ``x * h + y``; the outer walls make bounds checks unnecessary.
        """
        w, h = self._free.shape
        free = self._free.ravel().tolist()
        dist = [-1] * (w * h)
        start = gx * h + gy
        dist[start] = 0
        offsets = (h, -h, 1, -1)
        queue = deque((start,))
        pop, push = queue.popleft, queue.append
        while queue:
            c = pop()
            d = dist[c] + 1
            for o in offsets:
                nc = c + o
                if free[nc] and dist[nc] < 0:
                    dist[nc] = d
                    push(nc)
        return np.asarray(dist, dtype=np.int64).reshape(w, h)

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
