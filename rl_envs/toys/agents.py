"""A small PettingZoo Parallel environment whose agents leave the episode at different times.

:class:`CueAgents`: each agent sees a random cue bit and how many steps it has left, and earns 1
when its action repeats its cue (a random policy earns half). Agent ``i`` leaves the episode
(terminates) after ``lifetimes[i]`` steps; the episode ends when every agent has left, or is
cut at ``max_cycles`` (the agents still in it truncated). It tests multi-agent machinery
(agents that finish early, truncation, the global state, a per-agent expert: the cue, as
``info["expert_action"]``) and learns in seconds. With ``choices``, agents of different kinds:
agent ``i`` draws its cue among ``choices[i]`` values, sees it one-hot (``choices[i] + 1``
values with the steps left) and acts in ``Discrete(choices[i])``; it is named
``choose<n>_<i>``, so that ``groups: prefix`` groups the agents by kind. The module is
importable in worker processes (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field

__all__ = ["CueAgents"]


class CueAgents(ParallelEnv):
    """Agents repeating their own cue, leaving after their own lifetimes.

    Args:
        lifetimes: Steps each agent stays in the episode (one per agent).
        max_cycles: Steps after which the episode is cut (None: never).
        choices: Cue values of each agent (None: 2 each, seen as the value itself).
        render_mode: ``rgb_array`` for frames (one coloured cell per agent).
    """

    metadata = {"name": "cue_agents_v0", "render_modes": ["rgb_array"]}
    # each agent's expert: its cue (the multi-agent adapter stacks the agents' fields)
    step_fields: ClassVar[dict[str, StepField]] = {EXPERT_ACTIONS: expert_field()}

    def __init__(
        self,
        lifetimes: Sequence[int] = (2, 4, 6),
        max_cycles: int | None = None,
        choices: Sequence[int] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not lifetimes or min(lifetimes) < 1:
            raise ValueError(f"lifetimes must be >= 1 steps each, got {list(lifetimes)}")
        if choices is not None and (len(choices) != len(lifetimes) or min(choices) < 2):
            raise ValueError(f"choices must be >= 2 for each agent, got {list(choices)}")
        self.lifetimes = [int(x) for x in lifetimes]
        self.max_cycles = max_cycles
        self.render_mode = render_mode
        self.choices = None if choices is None else [int(n) for n in choices]
        self.possible_agents = (
            [f"agent_{i}" for i in range(len(self.lifetimes))]
            if self.choices is None
            else [f"choose{n}_{i}" for i, n in enumerate(self.choices)]
        )
        self.agents: list[str] = []
        self._obs_space = gym.spaces.Box(0.0, 1.0, (2,), dtype=np.float32)
        self._act_space = gym.spaces.Discrete(2)
        self.state_space = gym.spaces.Box(0.0, 1.0, (2 * len(self.lifetimes),), np.float32)
        self._rng = np.random.default_rng()
        self._cues = np.zeros(len(self.lifetimes), dtype=np.int64)
        self._t = 0

    def _n(self, agent: str) -> int | None:
        return None if self.choices is None else self.choices[self.possible_agents.index(agent)]

    def observation_space(self, agent: str) -> gym.Space:
        """``[cue, steps left / 10]`` (with ``choices``: the cue one-hot, then steps left)."""
        n = self._n(agent)
        return self._obs_space if n is None else gym.spaces.Box(0.0, 1.0, (n + 1,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        """``Discrete(2)`` (with ``choices``: ``Discrete(choices[i])``)."""
        n = self._n(agent)
        return self._act_space if n is None else gym.spaces.Discrete(n)

    def _observe(self, i: int) -> np.ndarray:
        if self.choices is None:
            return np.array([self._cues[i], self._left(i)], dtype=np.float32)
        out = np.zeros(self.choices[i] + 1, dtype=np.float32)
        out[self._cues[i]], out[-1] = 1.0, self._left(i)
        return out

    def _draw(self) -> np.ndarray:
        high = 2 if self.choices is None else np.array(self.choices)
        return self._rng.integers(0, high, len(self.lifetimes))

    def _left(self, i: int) -> float:
        return min(max(self.lifetimes[i] - self._t, 0) / 10.0, 1.0)

    def _observations(self) -> dict[str, np.ndarray]:
        return {
            a: self._observe(i) for i, a in enumerate(self.possible_agents) if a in self.agents
        }

    def state(self) -> np.ndarray:
        """Every agent's cue and steps left."""
        left = [self._left(i) for i in range(len(self.lifetimes))]
        return np.concatenate([self._cues, left]).astype(np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """Every agent in, fresh cues."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cues = self._draw()
        return self._observations(), self._infos(self.agents)

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """1 for each agent whose action is its cue; agents past their lifetime leave."""
        rewards = {
            a: float(int(actions[a]) == self._cues[i])
            for i, a in enumerate(self.possible_agents)
            if a in self.agents
        }
        self._t += 1
        terminations = {
            a: self._t >= self.lifetimes[i]
            for i, a in enumerate(self.possible_agents)
            if a in self.agents
        }
        cut = self.max_cycles is not None and self._t >= self.max_cycles
        truncations = {a: cut and not terminations[a] for a in terminations}
        self._cues = self._draw()
        obs = {
            a: self._observe(i) for i, a in enumerate(self.possible_agents) if a in terminations
        }
        infos = self._infos(list(terminations))
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, infos

    def _infos(self, agents: list[str]) -> dict[str, dict[str, Any]]:
        index = {a: i for i, a in enumerate(self.possible_agents)}
        return {a: {"expert_action": int(self._cues[index[a]])} for a in agents}

    def render(self) -> np.ndarray:
        """One cell per agent: green while in the episode, grey after; its cue as brightness."""
        frame = np.full((8, 8 * len(self.lifetimes), 3), 40, dtype=np.uint8)
        for i, agent in enumerate(self.possible_agents):
            colour = (
                (60, 120 + 100 * int(self._cues[i]), 60) if agent in self.agents else (90,) * 3
            )
            frame[:, 8 * i : 8 * i + 7] = colour
        return frame

    def close(self) -> None:
        """Nothing to release."""
