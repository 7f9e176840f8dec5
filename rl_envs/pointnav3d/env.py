"""PointNav in 3D from pixels: procedurally generated MiniWorld interiors (``rl/PointNav3D-v0``).

Each episode draws a floorplan of rectangular rooms joined by doorways, with textures, from the
episode's seed (:mod:`rl_envs.pointnav3d.layout`); splits (``train``/``valid``/``test``) hold
disjoint floorplans (:mod:`rl.tasks.splits`). The agent sees an egocentric RGB image (optionally
depth) and a GPS+compass vector to the goal; it turns, steps forward, and must take ``STOP``
within ``success_distance`` of the goal. Rewards follow Habitat's PointNav: the decrease of the
geodesic distance to the goal, minus a step penalty, plus a success bonus. Geodesic distances,
SPL's shortest path and the shortest-path expert (``info["expert_action"]``) come from a
navigation grid of the floorplan (:mod:`rl_envs.pointnav3d.grid`).

Defaults (Habitat's PointNav ratios at MiniWorld's scale): 0.25 m forward steps, 15° turns,
an agent radius of 0.25 m, success within 0.2 m (Habitat: 0.2 m for 0.25 m steps), a 0.1 m
navigation grid. Rendering uses OpenGL through EGL (:mod:`rl_envs.pointnav3d.world`, imported on
first construction): importing this module needs no GL.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Annotated, Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rl.tasks.env_state import generator_from_state
from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field
from rl.tasks.splits import SPLITS, draw_in_split
from rl.utils.config import Check
from rl.utils.finite import as_count
from rl_envs.pointnav3d.checks import check_args, floorplan_spec, observation_space
from rl_envs.pointnav3d.grid import NavGrid, expert_action
from rl_envs.pointnav3d.layout import Floorplan, draw_floorplan
from rl_envs.pointnav3d.topdown import top_down_map

__all__ = ["Actions", "PointNav3DEnv", "RenderingUnavailableError"]


class Actions(IntEnum):
    """The discrete PointNav actions (the grid task's, in the same order)."""

    LEFT = 0
    RIGHT = 1
    FORWARD = 2
    STOP = 3


class RenderingUnavailableError(RuntimeError):
    """OpenGL rendering through EGL could not start (see the message for what to install)."""


_INSTALL_HINT = (
    "PointNav3D renders its camera with OpenGL through EGL (headless: no display needed), and "
    "no EGL context could be created. Install an EGL driver: on Debian/Ubuntu `apt-get install "
    "libegl1 libegl-mesa0 libgl1-mesa-dri` (Mesa, renders on the CPU); with conda `conda "
    "install -c conda-forge mesalib libglvnd`; on an NVIDIA machine the driver's "
    "libEGL_nvidia. Check with: python -c \"import pyglet; pyglet.options['headless'] = True; "
    'import pyglet.gl"'
)


def _scene_world_class() -> type:
    """Import :mod:`rl_envs.pointnav3d.world` (starts EGL), or raise a clear error."""
    try:
        from rl_envs.pointnav3d.world import SceneWorld
    except Exception as e:  # ImportError (no libEGL), pyglet's NoSuchConfigException, ...
        raise RenderingUnavailableError(f"{_INSTALL_HINT}\nCause: {type(e).__name__}: {e}") from e
    return SceneWorld


class PointNav3DEnv(gym.Env[dict[str, Any], np.int64]):
    """Point-goal navigation from pixels in procedurally generated interiors.

    Observations: ``{"rgb": uint8 [H, W, 3], "goal": float32 [3]}`` (and ``"depth"``: float32
    ``[H, W, 1]`` metres, clipped to ``max_depth``, when ``depth=True``; divided by ``max_depth``
    to ``[0, 1]`` with ``normalize_depth=True``, habitat's depth sensor's default). ``goal`` is the
    GPS+compass reading: ``(distance, cos(bearing), sin(bearing))``, the Euclidean distance to
    the goal in metres and its bearing in the agent's frame (counter-clockwise from straight
    ahead, so positive is to the left), the angle given by its cosine and sine (continuous).

    Actions: :class:`Actions`. ``STOP`` ends the episode (a success within
    ``success_distance`` of the goal); ``max_steps`` truncates it. ``info["expert_action"]`` is
    the shortest-path expert's action on every step; the final step's
    ``info["episode_metrics"]`` holds ``success``, ``spl``, ``final_distance`` (geodesic,
    metres), ``shortest_path_length`` and ``path_length`` (metres walked).

    ``render()`` (``render_mode="rgb_array"``) returns the camera image, enlarged, next to a
    top-down map of the floorplan with the agent's path, its pose and the goal.

    Args:
        rooms: ``(rows, cols)`` of rooms.
        room_size: ``(min, max)`` room width and depth, metres (0.5 m increments).
        door_width: Doorway width, metres.
        extra_door_prob: Probability of a doorway on a wall outside the spanning tree that
            keeps every room reachable (0: a tree, one route between any two rooms).
        max_steps: Steps after which the episode is truncated.
        forward_step: Forward step length, metres.
        turn_degrees: Turn angle, degrees.
        agent_radius: The agent's collision radius, metres.
        success_distance: ``STOP`` within this distance of the goal succeeds, metres.
        min_start_distance: Least geodesic distance from start to goal, metres.
        step_penalty: Subtracted from the reward on every step.
        success_bonus: Added to the reward on success.
        distance_reward_scale: Multiplies the per-step decrease of geodesic distance.
        width: Camera image width, pixels.
        height: Camera image height, pixels.
        depth: Also observe depth (``"depth"``).
        max_depth: Depth is clipped to this, metres.
        normalize_depth: Depth divided by ``max_depth``, in ``[0, 1]`` (a policy's input at
            the scale of its scaled pixels) instead of metres.
        grid_resolution: Navigation grid cell side, metres.
        episodes_per_floorplan: Unseeded resets keep the floorplan (its scene and navigation
            grid, built once) for this many episodes, each with a new goal and start; a
            seeded reset always draws a new one. 1: a new floorplan every episode.
        split: ``train``, ``valid`` or ``test``: only floorplans of that split (80/10/10%,
            disjoint); None: every floorplan.
        render_mode: None or ``"rgb_array"``.

    Raises:
        ValueError: On an out-of-range argument (naming it).
        RenderingUnavailableError: If OpenGL through EGL cannot start (says what to install).
    """

    # the shortest-path expert, recorded as the rollout field expert_actions
    step_fields: ClassVar[dict[str, StepField]] = {EXPERT_ACTIONS: expert_field()}

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(
        self,
        *,
        rooms: tuple[int, int] | list[int] = (3, 3),
        room_size: tuple[float, float] | list[float] = (3.0, 5.0),
        door_width: float = 1.0,
        extra_door_prob: float = 0.3,
        max_steps: int = 500,
        forward_step: float = 0.25,
        turn_degrees: float = 15.0,
        agent_radius: float = 0.25,
        success_distance: float = 0.2,
        min_start_distance: float = 1.0,
        step_penalty: float = 0.01,
        success_bonus: float = 2.5,
        distance_reward_scale: float = 1.0,
        width: int = 80,
        height: int = 60,
        depth: bool = False,
        max_depth: float = 10.0,
        normalize_depth: bool = False,
        grid_resolution: float = 0.1,
        episodes_per_floorplan: int = 1,
        split: Annotated[str | None, Check(choices=SPLITS)] = None,
        render_mode: str | None = None,
    ) -> None:
        """Build the environment (and its GL context); the arguments: see the class."""
        self.floorplan_spec = floorplan_spec(rooms, room_size, door_width, extra_door_prob)
        check_args(
            door_width=door_width,
            max_steps=max_steps,
            forward_step=forward_step,
            turn_degrees=turn_degrees,
            agent_radius=agent_radius,
            success_distance=success_distance,
            width=width,
            height=height,
            max_depth=max_depth,
            grid_resolution=grid_resolution,
            episodes_per_floorplan=episodes_per_floorplan,
            split=split,
            render_mode=render_mode,
            render_modes=self.metadata["render_modes"],
        )
        self.max_steps = int(max_steps)
        self.forward_step = float(forward_step)
        self.turn = math.radians(float(turn_degrees))
        self.agent_radius = float(agent_radius)
        self.success_distance = float(success_distance)
        self.min_start_distance = float(min_start_distance)
        self.step_penalty = float(step_penalty)
        self.success_bonus = float(success_bonus)
        self.distance_reward_scale = float(distance_reward_scale)
        self.use_depth = bool(depth)
        self.max_depth = float(max_depth)
        self.normalize_depth = bool(normalize_depth)
        self.grid_resolution = float(grid_resolution)
        self.episodes_per_floorplan = int(episodes_per_floorplan)
        self.split = split
        self.render_mode = render_mode

        depth_high = (1.0 if self.normalize_depth else self.max_depth) if self.use_depth else None
        self.observation_space = observation_space(int(height), int(width), depth_high)
        self.action_space = spaces.Discrete(len(Actions))

        world_class = _scene_world_class()
        self.world = world_class(
            width=int(width),
            height=int(height),
            forward_step=self.forward_step,
            turn_degrees=float(turn_degrees),
            radius=self.agent_radius,
        )
        self._init_episode_state(int(height), int(width))

    def _init_episode_state(self, height: int, width: int) -> None:
        """Per-episode state (filled by reset) and the floorplan reuse counters."""
        self.plan: Floorplan | None = None
        self.grid: NavGrid | None = None
        self.field = np.zeros((1, 1))
        self.goal = np.zeros(2)
        self.path: list[np.ndarray] = []
        self._rgb = np.zeros((height, width, 3), np.uint8)
        self._distance = 0.0
        self._start_distance = 0.0
        self._path_length = 0.0
        self._steps = 0
        self._needs_reset = True
        # Floorplan reuse: the generator state its floorplan was drawn from, and episodes on it.
        self._plan_rng: dict[str, Any] | None = None
        self._plan_episodes = 0
        self._scene_built = False  # the world holds self.plan's scene

    # ------------------------------------------------------------------ episode

    def _draw_plan(self, rng: np.random.Generator) -> tuple[Floorplan, NavGrid]:
        """A floorplan in the split, drawn with ``rng``, and its navigation grid."""
        plan = draw_in_split(
            lambda: draw_floorplan(self.floorplan_spec, rng), Floorplan.key, self.split
        )
        return plan, NavGrid(plan, self.grid_resolution, self.agent_radius)

    def _draw_goal_and_start(
        self, grid: NavGrid
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Goal cell's distance field, goal, start and heading on ``grid``."""
        rng = self.np_random
        free_i, free_k = np.nonzero(grid.free)
        for _ in range(100):
            g = int(rng.integers(len(free_i)))
            goal_cell = (int(free_i[g]), int(free_k[g]))
            field = grid.distance_field(goal_cell)
            far = np.flatnonzero(
                np.isfinite(field[free_i, free_k])
                & (field[free_i, free_k] >= self.min_start_distance)
            )
            if len(far):
                s = int(far[int(rng.integers(len(far)))])
                break
        else:
            raise ValueError(
                f"no start at geodesic distance >= min_start_distance={self.min_start_distance} "
                "m from the goal in 100 draws; lower min_start_distance or enlarge the rooms"
            )
        goal = grid.cell_centre(*goal_cell)
        start = grid.cell_centre(int(free_i[s]), int(free_k[s]))
        heading = float(rng.uniform(-math.pi, math.pi))
        return field, goal, start, heading

    # A reset depends on more than np_random when floorplans are reused: the floorplan of the
    # episodes before. Samplers save and restore it with the episode (exact resume).
    def reset_state(self) -> dict[str, Any]:
        """What the next unseeded reset depends on besides ``np_random`` (plain values)."""
        return {"plan_rng": self._plan_rng, "plan_episodes": self._plan_episodes}

    def set_reset_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`reset_state`: the floorplan is drawn again from its saved generator."""
        plan_rng, episodes = state["plan_rng"], state["plan_episodes"]
        if as_count(episodes, 0, self.episodes_per_floorplan + 1) is None:
            raise ValueError(
                f"'plan_episodes': expected an int in [0, {self.episodes_per_floorplan}], "
                f"got {episodes!r:.40}"
            )
        generator = None if plan_rng is None else generator_from_state(plan_rng)
        self._plan_rng = None if plan_rng is None else dict(plan_rng)
        self._plan_episodes = int(episodes)
        self._scene_built = False
        if generator is None:
            self.plan = self.grid = None
        else:
            self.plan, self.grid = self._draw_plan(generator)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode: a new floorplan, goal and start; the same seed gives the same one.

        Returns:
            The first observation and ``{"expert_action": int}``.
        """
        super().reset(seed=seed)
        if (
            seed is not None
            or self.plan is None
            or self._plan_episodes >= self.episodes_per_floorplan
        ):
            self._plan_rng = dict(self.np_random.bit_generator.state)
            self.plan, self.grid = self._draw_plan(self.np_random)
            self._plan_episodes = 0
            self._scene_built = False
        assert self.grid is not None
        self.field, self.goal, start, heading = self._draw_goal_and_start(self.grid)
        if self._scene_built:
            self._rgb = self.world.place(start, heading)
        else:
            self._rgb = self.world.build(self.plan, start, heading)
            self._scene_built = True
        self._plan_episodes += 1
        self.path = [start]
        self._distance = self._start_distance = self._geodesic(start)
        self._path_length = 0.0
        self._steps = 0
        self._needs_reset = False
        return self._obs(), {"expert_action": self.expert_action()}

    def _geodesic(self, position: np.ndarray) -> float:
        assert self.grid is not None
        return float(self.grid.geodesic(self.field, position[None])[0])

    def _obs(self) -> dict[str, np.ndarray]:
        position = self.world.position()
        offset = self.goal - position
        distance = float(np.hypot(*offset))
        # The goal's angle in the world (MiniWorld: heading h faces (cos h, -sin h)).
        bearing = math.atan2(-offset[1], offset[0]) - self.world.heading()
        obs: dict[str, np.ndarray] = {
            "rgb": self._rgb,
            "goal": np.array([distance, math.cos(bearing), math.sin(bearing)], np.float32),
        }
        if self.use_depth:
            depth = np.minimum(self.world.depth(), self.max_depth)
            obs["depth"] = depth / self.max_depth if self.normalize_depth else depth
        return obs

    def expert_action(self) -> int:
        """The next action of the shortest-path expert (``grid.expert_action``)."""
        assert self.grid is not None
        return expert_action(
            self.grid,
            self.field,
            self.world.position(),
            self.world.heading(),
            self.goal,
            step=self.forward_step,
            turn=self.turn,
            success_distance=self.success_distance,
        )

    def step(
        self, action: int | np.integer
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one action: 0 turn left, 1 turn right, 2 forward, 3 stop.

        Raises:
            RuntimeError: If called before ``reset`` or after the episode ended.
            ValueError: On an unknown action.
        """
        if self._needs_reset:
            raise RuntimeError(
                "PointNav3DEnv.step() called before reset() or after the episode ended"
            )
        a = int(action)
        if not 0 <= a < len(Actions):
            raise ValueError(f"unknown action {action!r}; expected 0..{len(Actions) - 1}")
        world = self.world
        self._steps += 1
        terminated = False
        success = False
        if a == Actions.LEFT:
            world.turn_agent(math.degrees(self.turn))
        elif a == Actions.RIGHT:
            world.turn_agent(-math.degrees(self.turn))
        elif a == Actions.FORWARD:
            before = world.position()
            if world.move_agent(self.forward_step, 0.0):
                after = world.position()
                self._path_length += float(np.hypot(*(after - before)))
                self.path.append(after)
        else:
            terminated = True
            offset = self.goal - world.position()
            success = float(np.hypot(*offset)) <= self.success_distance
        if a != Actions.STOP:
            self._rgb = world.render_obs()
        distance = self._geodesic(world.position())
        reward = self.distance_reward_scale * (self._distance - distance) - self.step_penalty
        self._distance = distance
        if success:
            reward += self.success_bonus
        truncated = not terminated and self._steps >= self.max_steps
        info: dict[str, Any] = {"expert_action": self.expert_action()}
        if terminated or truncated:
            self._needs_reset = True
            shortest = self._start_distance
            spl = shortest / max(self._path_length, shortest) if success else 0.0
            info["episode_metrics"] = {
                "success": float(success),
                "spl": float(spl),
                "final_distance": float(distance),
                "shortest_path_length": float(shortest),
                "path_length": float(self._path_length),
            }
        return self._obs(), float(reward), terminated, truncated, info

    # ---------------------------------------------------------------- rendering

    def render(self) -> np.ndarray | None:
        """The camera (enlarged) next to a top-down map (``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array" or self.grid is None:
            return None
        view = top_down_map(
            self.grid,
            path=np.asarray(self.path),
            position=self.world.position(),
            heading=self.world.heading(),
            goal=self.goal,
            success_distance=self.success_distance,
            height=240,
        )
        scale = max(1, 240 // self._rgb.shape[0])
        camera = self._rgb.repeat(scale, axis=0).repeat(scale, axis=1)
        h = max(camera.shape[0], view.shape[0])
        canvas = np.full((h, camera.shape[1] + 8 + view.shape[1], 3), 255, np.uint8)
        canvas[: camera.shape[0], : camera.shape[1]] = camera
        canvas[: view.shape[0], camera.shape[1] + 8 :] = view
        return canvas

    def close(self) -> None:
        """Free the scene's GL resources."""
        world = getattr(self, "world", None)
        if world is not None:
            world.close()
            self.world = None
        super().close()
