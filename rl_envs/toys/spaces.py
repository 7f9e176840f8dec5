"""Small tasks that exercise every supported kind of space; each learns in seconds.

- :class:`MatchTargetEnv`: ``MultiDiscrete`` actions. Each step shows a target per component
  (``{"target": MultiDiscrete(nvec)}``); the reward is the fraction of components matched.
- :class:`NestedCorridorEnv`: nested ``Dict``/``Tuple`` observations (``Discrete`` and ``Box``
  leaves). Walk left or right along a corridor and stop on the goal.
- :class:`ReachTargetEnv`: a 1-D ``Box`` action. Each step shows a target in ``[-1, 1]``;
  the reward is ``-|action - target|``, the action clipped to ``[-2, 2]`` first.
- :class:`TextObservation`: a wrapper that adds a ``Text`` entry (what MiniGrid's ``mission``
  is), which policies cannot encode: for the error's tests.

Every episode reports ``episode_metrics["success"]`` in ``[0, 1]``; ``render_mode="rgb_array"``
renders a small picture of the state (probe videos). The module imports no torch.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["MatchTargetEnv", "NestedCorridorEnv", "ReachTargetEnv", "TextObservation"]


def _bars(values: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """A 16 x (8 * len) RGB picture: one bar a value, as tall as ``value / high``."""
    frame = np.zeros((16, 8 * len(values), 3), dtype=np.uint8)
    for i, (v, h) in enumerate(zip(values, highs, strict=True)):
        top = 16 - int(round(15 * float(np.clip(v / h, 0, 1))))
        frame[top:, 8 * i : 8 * i + 7] = (80, 160, 240)
    return frame


class MatchTargetEnv(gym.Env):
    """Match a shown target with a ``MultiDiscrete`` action, ``max_steps`` times an episode.

    Reward per step: the fraction of components matched. ``success``: the fraction of steps
    with every component matched.

    Args:
        nvec: Sizes of the components.
        max_steps: Steps per episode (it then terminates).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self, *, nvec: tuple[int, ...] = (3, 4), max_steps: int = 4, render_mode: str | None = None
    ) -> None:
        self.render_mode = render_mode
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Dict({"target": gym.spaces.MultiDiscrete(self.nvec)})
        self.action_space = gym.spaces.MultiDiscrete(self.nvec)
        self._t = 0
        self._hits = 0
        self._target = np.zeros(len(self.nvec), dtype=np.int64)

    def _draw(self) -> dict[str, np.ndarray]:
        self._target = self.np_random.integers(0, self.nvec).astype(np.int64)
        return {"target": self._target.copy()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode (and show the first target)."""
        super().reset(seed=seed)
        self._t, self._hits = 0, 0
        return self._draw(), {}

    def render(self) -> np.ndarray:
        """The target, as bars."""
        return _bars(self._target, self.nvec - 1 + 1e-9)

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        """Score the action against the target, then show the next one."""
        matched = np.asarray(action) == self._target
        self._t += 1
        self._hits += int(matched.all())
        done = self._t >= self.max_steps
        info: dict[str, Any] = {}
        if done:
            info["episode_metrics"] = {"success": self._hits / self.max_steps}
        return self._draw(), float(matched.mean()), done, False, info


class NestedCorridorEnv(gym.Env):
    """Walk a corridor of ``length`` cells and stop on the goal, seen through nested spaces.

    Observation: ``{"agent": {"cell": Discrete(length)}, "goal": (Discrete(length),
    Box([-(length - 1), length - 1], (1,)))}``: the agent's cell, and the goal's cell with its
    signed offset in cells (unscaled: scaled by the length, the offsets 0 and 1 lie so close
    that PPO stalled at stopping one cell short on some seeds). Actions: ``Discrete(3)``: left,
    right, stop. Reward: 1 for stopping on the goal (``success`` 1), -0.01 a step; stopping
    elsewhere ends the episode (``success`` 0), as does the time limit (truncation).

    Args:
        length: Cells of the corridor.
        max_steps: Time limit.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}
    LEFT, RIGHT, STOP = 0, 1, 2

    def __init__(
        self, *, length: int = 7, max_steps: int = 14, render_mode: str | None = None
    ) -> None:
        self.render_mode = render_mode
        self.length = length
        self.max_steps = max_steps
        cells = gym.spaces.Discrete(length)
        self.observation_space = gym.spaces.Dict(
            {
                "agent": gym.spaces.Dict({"cell": cells}),
                "goal": gym.spaces.Tuple(
                    (cells, gym.spaces.Box(1 - length, length - 1, (1,), dtype=np.float32))
                ),
            }
        )
        self.action_space = gym.spaces.Discrete(3)
        self._cell = self._goal = self._t = 0

    def _obs(self) -> dict[str, Any]:
        offset = np.array([self._goal - self._cell], dtype=np.float32)
        return {"agent": {"cell": self._cell}, "goal": (self._goal, offset)}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode at a random cell, with a random goal."""
        super().reset(seed=seed)
        self._cell, self._goal = (int(x) for x in self.np_random.integers(0, self.length, 2))
        self._t = 0
        return self._obs(), {}

    def render(self) -> np.ndarray:
        """The agent's and the goal's cells, as bars."""
        return _bars(np.array([self._cell, self._goal]), np.full(2, self.length - 1 + 1e-9))

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Move left or right, or stop."""
        action = int(action)
        self._t += 1
        reward, terminated, success = -0.01, False, 0.0
        if action == self.STOP:
            terminated = True
            if self._cell == self._goal:
                reward, success = 1.0, 1.0
        else:
            step = 1 if action == self.RIGHT else -1
            self._cell = int(np.clip(self._cell + step, 0, self.length - 1))
        truncated = not terminated and self._t >= self.max_steps
        info: dict[str, Any] = {}
        if terminated or truncated:
            info["episode_metrics"] = {"success": success}
        return self._obs(), reward, terminated, truncated, info


class ReachTargetEnv(gym.Env):
    """Output the shown target with a continuous action, ``max_steps`` times an episode.

    Observation: ``Box([-1, 1], (dim,))``, the target. Action: ``Box([-2, 2], (dim,))``.
    Reward per step: ``-mean |action - target|``. ``success``: the fraction of steps within
    0.1 of the target in every component.

    Args:
        dim: Size of the target and the action.
        max_steps: Steps per episode (it then terminates).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self, *, dim: int = 1, max_steps: int = 4, render_mode: str | None = None
    ) -> None:
        self.render_mode = render_mode
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (dim,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (dim,), dtype=np.float32)
        self._target = np.zeros(dim, dtype=np.float32)
        self._t = self._hits = 0

    def _draw(self) -> np.ndarray:
        self._target = self.np_random.uniform(-1, 1, self._target.shape).astype(np.float32)
        return self._target.copy()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode (and show the first target)."""
        super().reset(seed=seed)
        self._t = self._hits = 0
        return self._draw(), {}

    def render(self) -> np.ndarray:
        """The target, as bars."""
        return _bars(self._target + 1.0, np.full(len(self._target), 2.0))

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Score the action (refused outside the bounds), then show the next target."""
        if not self.action_space.contains(np.asarray(action, dtype=np.float32)):
            raise ValueError(f"action {action} outside {self.action_space}")
        error = np.abs(np.asarray(action) - self._target)
        self._t += 1
        self._hits += int((error <= 0.1).all())
        done = self._t >= self.max_steps
        info: dict[str, Any] = {}
        if done:
            info["episode_metrics"] = {"success": self._hits / self.max_steps}
        return self._draw(), -float(error.mean()), done, False, info


class TextObservation(gym.ObservationWrapper):
    """Observations become ``(text, original)``: a ``Text`` entry policies cannot encode."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Tuple((gym.spaces.Text(16), env.observation_space))

    def observation(self, observation: Any) -> tuple[str, Any]:
        """``(a mission text, the observation)``."""
        return "go to the goal", observation
