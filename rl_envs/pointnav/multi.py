"""Multi-agent PointNav: several agents in one grid layout, each with its own goal.

:class:`MultiPointNav` is a PettingZoo Parallel environment (trained through
:class:`~rl.tasks.pettingzoo.ParallelEnvAdapter`, ``task=nav_multi``). The agents share one
room layout of :class:`~rl_envs.pointnav.PointNavEnv`
(its doors, drawn in the task's split, so held-out
layouts stay held out) and each walks to a goal of its own; each is one ``PointNavEnv`` placed
in that layout, so its observation, actions, reward and shortest-path expert are PointNav's.
Agents block each other: a ``FORWARD`` into a cell another agent stands on leaves the agent
where it is. An agent leaves the episode with ``STOP`` (successful on its goal) and then no
longer blocks; the episode ends when every agent has stopped, or is cut at ``max_steps``.

Each agent also observes ``others``: for every other agent, its ``(forward, right)`` offset in
cells in this agent's frame and whether it is still in the episode (zeros once it left).

The episode's metrics: ``success`` (every agent stopped on its goal: the team's), ``spl`` (the
agents' mean), and per agent ``success/agent_i`` and ``spl/agent_i``. The expert
(``info["expert_action"]`` per agent) is each agent's shortest path; where another agent stands
on it, the expert waits (a ``FORWARD`` the block turns into staying) until the cell is free.
Two agents meeting head-on in a door would wait for each other until the episode is cut; the
expert does not plan around that.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from rl.tasks.fields import EXPERT_ACTIONS, StepField, expert_field
from rl.tasks.splits import draw_in_split
from rl_envs.pointnav.env import Actions, PointNavEnv
from rl_envs.pointnav.view import DIR_VEC

__all__ = ["MultiPointNav"]


class MultiPointNav(ParallelEnv):
    """Several PointNav agents in one layout (see the module docstring).

    Args:
        agents: How many agents (>= 1).
        render_mode: ``rgb_array``: every agent's view of the grid, side by side.
        **pointnav: :class:`~rl_envs.pointnav.PointNavEnv`'s arguments (``size``,
            ``rooms_per_side``, ``max_steps``, rewards, ``min_start_distance``, ``split``,
            ...), for every agent.
    """

    metadata = {"name": "multi_pointnav_v0", "render_modes": ["rgb_array"]}
    step_fields: ClassVar[dict[str, StepField]] = {EXPERT_ACTIONS: expert_field()}

    def __init__(self, agents: int = 2, render_mode: str | None = None, **pointnav: Any) -> None:
        if agents < 1:
            raise ValueError(f"task.env.agents must be >= 1, got {agents}")
        self.render_mode = render_mode
        self.envs = [PointNavEnv(render_mode=render_mode, **pointnav) for _ in range(agents)]
        first = self.envs[0]
        if first._layout.n_free < 2 * agents:
            raise ValueError(
                f"{agents} agents need {2 * agents} free cells (a start and a goal each); "
                f"the {first.size}x{first.size} layout has {first._layout.n_free}"
            )
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        others = gym.spaces.Box(-math.inf, math.inf, (max(agents - 1, 1) * 3,), np.float32)
        self._obs_space = gym.spaces.Dict({**first.observation_space.spaces, "others": others})
        self._act_space = first.action_space
        self.max_steps = first.max_steps
        self._rng = np.random.default_rng()
        self._t = 0
        self._stopped = [False] * agents
        self._success = [False] * agents

    def observation_space(self, agent: str) -> gym.Space:
        """PointNav's ``image`` and ``goal``, and ``others`` (see the module docstring)."""
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        """PointNav's :class:`~rl_envs.pointnav.env.Actions`."""
        return self._act_space

    # ---------------------------------------------------------------- episode
    def _draw(self) -> None:
        """One layout in the split, then a distinct goal and start for each agent."""
        rng, first = self._rng, self.envs[0]
        layout = first._layout
        drawn = draw_in_split(
            lambda: layout.draw(rng),
            lambda d: layout.layout_key(d[2], (d[3], d[4], d[5])),
            first.split,
        )
        door_x, door_y, door_v = drawn[0], drawn[1], drawn[2]
        taken: set[tuple[int, int]] = set()
        for env in self.envs:
            for _ in range(1000):
                goal = layout.free_cell(int(rng.integers(layout.n_free)), door_x, door_y)
                start = layout.free_cell(int(rng.integers(layout.n_free)), door_x, door_y)
                if goal in taken or start in taken or goal == start:
                    continue
                dist = layout.distance_field(*goal, door_x, door_y, door_v)
                if dist[start] >= env.min_start_distance:
                    break
            else:
                raise RuntimeError("no distinct goals and starts after 1000 draws")
            taken |= {goal, start}
            env._door_v = door_v
            env.place(door_x, door_y, goal, dist, start, int(rng.integers(4)))

    def _occupancy(self) -> None:
        """Each agent's blocked cells: those of the others still in the episode."""
        cells = [env.agent_pos for env in self.envs]
        for i, env in enumerate(self.envs):
            env.occupied = {c for j, c in enumerate(cells) if j != i and not self._stopped[j]}

    def _others(self, i: int) -> np.ndarray:
        """``(forward, right, in play)`` of every other agent in agent ``i``'s frame."""
        env = self.envs[i]
        fx, fy = DIR_VEC[env.agent_dir]
        out = np.zeros(cast(gym.spaces.Box, self._obs_space["others"]).shape, np.float32)
        k = 0
        for j, other in enumerate(self.envs):
            if j == i:
                continue
            if not self._stopped[j]:
                ox = other.agent_pos[0] - env.agent_pos[0]
                oy = other.agent_pos[1] - env.agent_pos[1]
                out[3 * k : 3 * k + 3] = (ox * fx + oy * fy, -ox * fy + oy * fx, 1.0)
            k += 1
        return out

    # ------------------------------------------------------------------ expert
    def _next_cells(self, i: int) -> list[tuple[int, int]]:
        """The cells one step closer to agent ``i``'s goal (ahead of it first)."""
        env = self.envs[i]
        x, y = env.agent_pos
        dist = env._dist
        target = dist[x][y] - 1
        order = [env.agent_dir, (env.agent_dir - 1) % 4, (env.agent_dir + 1) % 4]
        order.append((env.agent_dir + 2) % 4)
        cells = [(x + DIR_VEC[d][0], y + DIR_VEC[d][1]) for d in order]
        return [c for c in cells if dist[c[0]][c[1]] == target]

    def _toward(self, i: int, cell: tuple[int, int]) -> int:
        """The action that moves agent ``i`` to the neighbouring ``cell`` or turns toward it."""
        env = self.envs[i]
        dx, dy = cell[0] - env.agent_pos[0], cell[1] - env.agent_pos[1]
        heading = next(d for d in range(4) if tuple(DIR_VEC[d]) == (dx, dy))
        if heading == env.agent_dir:
            return int(Actions.FORWARD)
        return int(Actions.LEFT if heading == (env.agent_dir - 1) % 4 else Actions.RIGHT)

    def _expert(self, i: int) -> int:
        """Agent ``i``'s shortest path, waiting for the others (see the module docstring).

        Among the cells one step closer, a free one (ahead first); where all are taken, wait
        (a ``FORWARD`` into the taken cell stays put), unless the agent standing there wants
        this agent's cell and has the lower index: then step aside into any free cell.
        """
        env = self.envs[i]
        if env._dist[env.agent_pos[0]][env.agent_pos[1]] == 0:
            return int(Actions.STOP)
        closer = self._next_cells(i)
        free = [c for c in closer if c not in env.occupied]
        if free:
            return self._toward(i, free[0])
        blocked = closer[0]
        holder = next(
            j for j, other in enumerate(self.envs)
            if j != i and not self._stopped[j] and other.agent_pos == blocked
        )  # fmt: skip
        if holder < i and env.agent_pos in self._next_cells(holder):  # head-on: make way
            x, y = env.agent_pos
            for dx, dy in DIR_VEC:
                c = (x + dx, y + dy)
                if env._dist[c[0]][c[1]] >= 0 and c not in env.occupied:
                    return self._toward(i, c)
        return self._toward(i, blocked)

    def _observe(self, i: int, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**obs, "others": self._others(i)}

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """A new layout, goals and starts; every agent in play."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._draw()
        self.agents = list(self.possible_agents)
        self._t = 0
        self._stopped = [False] * len(self.envs)
        self._success = [False] * len(self.envs)
        self._occupancy()
        obs, infos = {}, {}
        for i, (agent, env) in enumerate(zip(self.possible_agents, self.envs, strict=True)):
            o, _ = env.begin()
            obs[agent], infos[agent] = self._observe(i, o), {"expert_action": self._expert(i)}
        return obs, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """Every agent in play acts, in order (an earlier agent's move blocks a later one)."""
        self._t += 1
        results: dict[int, tuple[Any, ...]] = {}
        for i, (agent, env) in enumerate(zip(self.possible_agents, self.envs, strict=True)):
            if agent not in self.agents:
                continue
            self._occupancy()
            results[i] = env.step(int(actions[agent]))
            if int(actions[agent]) == Actions.STOP:
                self._stopped[i] = True
                self._success[i] = env._dist[env.agent_pos[0]][env.agent_pos[1]] == 0
        self._occupancy()
        cut = self._t >= self.max_steps
        obs, rewards, terminations, truncations = {}, {}, {}, {}
        infos: dict[str, dict[str, Any]] = {}
        for i, (o, reward, terminated, *_) in results.items():
            agent = self.possible_agents[i]
            obs[agent] = self._observe(i, o)
            rewards[agent] = reward
            terminations[agent] = terminated
            truncations[agent] = cut and not terminated
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        for i in results:  # the experts once every agent moved
            agent = self.possible_agents[i]
            infos[agent] = {"expert_action": self._expert(i) if agent in self.agents else -1}
        if not self.agents:
            metrics = self._metrics(results)
            for agent in infos:
                infos[agent]["episode_metrics"] = metrics
        return obs, rewards, terminations, truncations, infos

    def _metrics(self, results: dict[int, tuple[Any, ...]]) -> dict[str, float]:
        """The team's success and mean SPL, and each agent's."""
        metrics: dict[str, float] = {}
        spls = []
        for i, env in enumerate(self.envs):
            length = float(env._start_distance)
            moved = max(float(env._cells_moved), length)
            spl = (1.0 if length == 0 else length / moved) if self._success[i] else 0.0
            spls.append(spl)
            metrics[f"success/agent_{i}"] = float(self._success[i])
            metrics[f"spl/agent_{i}"] = spl
        metrics["success"] = float(all(self._success))
        metrics["spl"] = float(np.mean(spls))
        return metrics

    def state(self) -> np.ndarray:
        """Not declared: the adapter's ``global_state: concat`` joins the agents' entries."""
        raise NotImplementedError("MultiPointNav has no state(); use global_state: concat")

    def render(self) -> np.ndarray | None:
        """Every agent's frame of the grid, side by side (``rgb_array``)."""
        frames = [env.render() for env in self.envs]
        if any(f is None for f in frames):
            return None
        return np.concatenate(frames, axis=1)

    def close(self) -> None:
        """Close every agent's environment."""
        for env in self.envs:
            env.close()
