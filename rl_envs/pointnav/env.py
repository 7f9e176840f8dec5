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

This module holds the environment itself; the room structure, layout draws and distance field
are :mod:`rl_envs.pointnav.layout`'s, the view encoding and occlusion
:mod:`rl_envs.pointnav.view`'s.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Annotated, Any, ClassVar

import numpy as np
from gymnasium import spaces
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.minigrid_env import MiniGridEnv

from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field
from rl.tasks.splits import SPLITS, draw_in_split
from rl.utils.config import Check
from rl_envs.pointnav.checks import checked_args, observation_space
from rl_envs.pointnav.layout import RoomLayout, build_minigrid_grid
from rl_envs.pointnav.view import (
    DIR_VEC,
    EMPTY_ENCODING,
    episode_arrays,
    layout_templates,
    view_indices,
    visibility_mask,
)

__all__ = ["Actions", "PointNavEnv"]

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


class PointNavEnv(MiniGridEnv):
    """Point-goal navigation in a grid of ``rooms_per_side x rooms_per_side`` rooms.

    Observations are ``{"image": uint8 (view, view, 3), "goal": float32 (3,)}`` where ``image`` is
    minigrid's egocentric encoding and ``goal`` is ``(forward, right, euclidean distance)`` to the
    goal in cells, in the agent's frame (exactly zero on the goal cell). Actions are
    :class:`Actions`. ``STOP`` ends the episode (success only on the goal cell); reaching
    ``max_steps`` truncates it. The final step's ``info["episode_metrics"]`` holds ``success``,
    ``spl``, ``final_distance`` and ``shortest_path_length``.
    """

    # the shortest-path expert, recorded as the rollout field expert_actions
    step_fields: ClassVar[dict[str, StepField]] = {EXPERT_ACTIONS: expert_field()}
    # the same task as a batched environment in torch (rl.tasks.batched)
    batched_env: ClassVar[str] = "rl_envs.pointnav.batched.BatchedPointNav"
    observation_space: spaces.Dict
    agent_pos: tuple[int, int]
    _grid: Grid | None  # the `grid` property's (None: not built yet)

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
        split: Annotated[str | None, Check(choices=SPLITS)] = None,
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
            split: ``train``, ``valid`` or ``test``: draw only episodes whose room layout
                (the doors) belongs to that split (80/10/10% of the layouts, disjoint); None:
                every layout (no split).
            render_mode: ``None``, ``"rgb_array"`` or ``"human"``.

        Raises:
            ValueError: If an argument is out of range or the rooms would be too small.
        """
        size, rooms_per_side, max_steps, min_start_distance, n = checked_args(
            size=size,
            rooms_per_side=rooms_per_side,
            max_steps=max_steps,
            min_start_distance=min_start_distance,
            agent_view_size=agent_view_size,
            floats={
                "step_penalty": step_penalty,
                "success_bonus": success_bonus,
                "distance_reward_scale": distance_reward_scale,
            },
            render_mode=render_mode,
            render_modes=self.metadata["render_modes"],
        )
        super().__init__(
            mission_space=MissionSpace(mission_func=_mission),
            grid_size=size,
            max_steps=max_steps,
            see_through_walls=False,
            agent_view_size=n,
            render_mode=render_mode,
        )
        self.size = size
        self.rooms_per_side = rooms_per_side
        self.step_penalty = float(step_penalty)
        self.success_bonus = float(success_bonus)
        self.distance_reward_scale = float(distance_reward_scale)
        self.min_start_distance = min_start_distance
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
        self.split = split

        self.actions = Actions  # type: ignore[assignment]
        self.action_space = spaces.Discrete(len(Actions))
        self.observation_space = observation_space(n)
        self.reward_range = (-math.inf, math.inf)  # type: ignore[assignment]

        # Shared by every episode: room tables (some aliased for diagnostics) and view tables.
        self._layout = layout = RoomLayout(size, rooms_per_side)
        self._walls_at = layout.walls_at
        self._door_slots = layout.door_slots
        self._interior = layout.interior
        pad = self._pad = n  # the padded arrays hold any view around any in-grid agent
        self._view_x, self._view_y = view_indices(n, pad)
        self._enc_template, self._see_behind_template = layout_templates(layout.interior, pad)
        self._init_episode_state(size, n)

    def _init_episode_state(self, size: int, n: int) -> None:
        """Placeholder per-episode state (filled by ``reset``) and the cross-episode vis cache."""
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
        # Cells the agent cannot enter besides walls: the other agents' (rl_envs.pointnav.multi).
        self.occupied: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset()

    # ------------------------------------------------------------------ layout

    @property
    def grid(self) -> Grid:
        """The minigrid ``Grid`` of the current episode, built on first access.

        Only rendering and minigrid's own methods (``gen_obs``, ``hash``, ...) need it; the fast
        observation path and ``step`` use numpy arrays, so ``reset`` does not build it.
        """
        grid = self._grid
        if grid is None:
            grid = self._grid = build_minigrid_grid(
                self.width, self.height, self._free, self.goal_pos
            )
        return grid

    @grid.setter
    def grid(self, value: Grid | None) -> None:
        self._grid = value

    def _gen_grid(self, width: int, height: int) -> None:
        """Draw doors, goal, agent start and direction for a new episode (minigrid's hook).

        Doors are uniform in each wall segment, the goal uniform over free cells, the start
        uniform over free cells at geodesic distance >= ``min_start_distance`` from the goal
        (a pre-drawn free cell, accepted if far enough, else one draw among the candidates:
        exactly uniform either way), and the direction uniform.
        """
        rng = self.np_random
        layout = self._layout
        try:
            drawn = draw_in_split(
                lambda: layout.draw(rng),
                lambda d: layout.layout_key(d[2], (d[3], d[4], d[5])),
                self.split,
            )
        except ValueError as e:
            raise ValueError(
                f"{e} ({self.size}x{self.size}, {self.rooms_per_side} rooms per side)"
            ) from None
        door_x, door_y, self._door_v, goal_index, direction, start_index = drawn
        self._door_x, self._door_y = door_x, door_y  # (the distance fields below read them)
        min_dist = self.min_start_distance

        for attempt in range(100):
            if attempt:
                goal_index = int(rng.integers(layout.n_free))
            gx, gy = layout.free_cell(goal_index, door_x, door_y)
            dist = self._bfs(gx, gy)
            dist_list = dist.tolist()
            if attempt == 0:  # the pre-drawn start, accepted if far enough
                sx, sy = layout.free_cell(start_index, door_x, door_y)
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
        self.place(door_x, door_y, (gx, gy), dist, (sx, sy), direction, dist_list)

    def place(
        self,
        door_x: list[int],
        door_y: list[int],
        goal: tuple[int, int],
        dist: np.ndarray,
        start: tuple[int, int],
        direction: int,
        dist_list: list[list[int]] | None = None,
    ) -> None:
        """Set the episode: the doors, the goal and its distance field, the agent's start.

        What a reset draws; the multi-agent task (:mod:`rl_envs.pointnav.multi`) places each
        agent's own goal and start in one shared layout with it.
        """
        self._door_x, self._door_y = door_x, door_y
        self.goal_pos = goal
        self.distance_field = dist
        self._dist = dist.tolist() if dist_list is None else dist_list
        self._free = dist >= 0
        self.agent_pos = start
        self.agent_dir = direction
        self._grid = None  # built on demand by the `grid` property
        self._enc_padded, self._see_behind_padded = episode_arrays(
            self._enc_template, self._see_behind_template, door_x, door_y, goal, self._pad
        )
        self._image_cache = {}

    def _bfs(self, gx: int, gy: int) -> np.ndarray:
        """Geodesic distance field from ``(gx, gy)`` for the current doors; -1 off free cells.

        Exactly a breadth-first search's result (see :meth:`RoomLayout.distance_field`).
        """
        return self._layout.distance_field(gx, gy, self._door_x, self._door_y, self._door_v)

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
                mask = visibility_mask(see_behind, n)
                if len(self._vis_cache) >= _VIS_CACHE_LIMIT:
                    self._vis_cache.clear()
                self._vis_cache[vis_key] = mask
            image = view * mask
            image[n // 2, n - 1] = EMPTY_ENCODING  # minigrid clears the agent's own cell
            self._image_cache[key] = image
        return image.copy()

    def _goal_vector(self) -> np.ndarray:
        """``(forward, right, distance)`` to the goal, in cells, in the agent's frame."""
        ox = self.goal_pos[0] - self.agent_pos[0]
        oy = self.goal_pos[1] - self.agent_pos[1]
        fx, fy = DIR_VEC[self.agent_dir]
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
        fx, fy = DIR_VEC[d]
        if dist[x + fx][y + fy] == target:
            return int(Actions.FORWARD)
        lx, ly = DIR_VEC[(d - 1) % 4]
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
        return self.begin()

    def begin(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start the episode :meth:`place` set: counters zeroed; the first observation."""
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
            fx, fy = DIR_VEC[self.agent_dir]
            nx, ny = x + fx, y + fy
            # free (every free cell is reachable) and not another agent's (several agents)
            if self._dist[nx][ny] >= 0 and (nx, ny) not in self.occupied:
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
