"""Any PettingZoo environment as a multi-agent task (``task=pettingzoo``).

:class:`ParallelEnvAdapter` wraps a PettingZoo Parallel environment (an AEC one is converted
with PettingZoo's own ``aec_to_parallel``) into one ``gymnasium.Env`` stacked over its agents,
as :mod:`rl.tasks.agents` describes: each entry of the observation is ``[A, ...]`` for the
environment's ``possible_agents`` in order, and the per-agent rewards, ends and activity travel
as step fields. The observation holds:

- ``obs``: the agent's own observation (a ``Dict`` one is stacked entry by entry);
- ``state`` (``global_state``, the default where the environment has a ``state()``): the
  environment's global state, the same row for every agent: what a centralised critic reads
  (MAPPO); ``global_state: concat`` concatenates the agents' observations instead (each
  entry's elements as floats, agent after agent)
  (for an environment without ``state()``), ``false`` leaves it out (IPPO);
- ``agent_index`` (``agent_index: true``): the agent's index, for a shared policy that should
  tell the agents apart.

Agents that leave the episode early get rows of zeros and are masked out of losses and metrics
(``agent_active``); the episode ends when every agent has left it. Every random draw comes from
the adapter's own ``np_random`` (an unseeded reset seeds the inner environment from it), so a
sampler can save and replay the episodes in flight, as for any task.

The inner environment's own per-agent ``step_fields`` (declared as a single-agent task
declares them, :mod:`rl.tasks.fields`, and reported in each agent's ``info``) are stacked over
the agents: an expert (``expert_actions``) reaches imitation and teacher forcing per agent.

Homogeneous agents only (one observation and one action space for all, as parameter sharing
needs); per-group policies are not supported yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.agents import (
    AGENT_ACTIVE,
    AGENT_DONE,
    AGENT_REWARDS,
    DONE_TERMINATED,
    DONE_TRUNCATED,
    agent_fields,
    stack_space,
)
from rl.tasks.fields import StepField

__all__ = ["ParallelEnvAdapter"]

GLOBAL_STATE_MODES = ("auto", "state", "concat", False)


def _as_parallel(env: Any) -> Any:
    """``env`` as a PettingZoo Parallel environment (an AEC one converted)."""
    from pettingzoo.utils.conversions import aec_to_parallel
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return env
    if isinstance(env, AECEnv):
        return aec_to_parallel(env)
    raise TypeError(
        f"task.env built {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv (give the "
        "environment's constructor with _partial_: true, e.g. mpe2.simple_spread_v3.parallel_env)"
    )


def _same_space(spaces: dict[str, gym.Space], what: str) -> gym.Space:
    first = next(iter(spaces.values()))
    for agent, space in spaces.items():
        if space != first:
            raise ValueError(
                f"agent {agent!r} has the {what} space {space}, another agent {first}: "
                "a shared policy needs one space for all agents (per-group policies are not "
                "supported yet)"
            )
    return first


def _has_state(env: Any) -> bool:
    """Whether ``env`` declares a global state (its ``state_space``; ``state()`` with it)."""
    return isinstance(getattr(env, "state_space", None), gym.spaces.Box)


class ParallelEnvAdapter(gym.Env):
    """A PettingZoo Parallel environment as one gymnasium env stacked over its agents.

    Args:
        env: The environment's constructor (``_partial_: true`` in the config; called with
            ``render_mode`` when one is asked for), or an environment already built.
        global_state: ``auto`` (the environment's ``state()`` where it has one, else the
            agents' observations concatenated), ``state``, ``concat``, or ``false`` (none).
        agent_index: Add each agent's index to its observation (``agent_index``).
        render_mode: Passed to the constructor (probe videos ask for ``rgb_array``).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        env: Callable[..., Any] | Any,
        *,
        global_state: str | bool = "auto",
        agent_index: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if global_state not in GLOBAL_STATE_MODES:
            raise ValueError(
                f"task.global_state must be one of {GLOBAL_STATE_MODES}, got {global_state!r}"
            )
        if callable(env) and not hasattr(env, "possible_agents"):
            env = env(render_mode=render_mode) if render_mode else env()
        self.env = _as_parallel(env)
        self.render_mode = render_mode
        self.agents = list(self.env.possible_agents)
        count = len(self.agents)
        # The inner env's own per-agent fields (e.g. an expert), stacked over the agents.
        inner = getattr(self.env, "unwrapped", self.env)
        self._agent_step_fields: dict[str, StepField] = dict(
            getattr(inner, "step_fields", None) or {}
        )
        self.step_fields = {
            key: dataclasses.replace(field, shape=(count, *field.shape))
            for key, field in self._agent_step_fields.items()
        }
        self.step_fields.update(agent_fields(count))
        agent_obs = _same_space({a: self.env.observation_space(a) for a in self.agents}, "obs")
        agent_act = _same_space({a: self.env.action_space(a) for a in self.agents}, "action")
        self._obs_space = agent_obs
        spaces: dict[str, gym.Space] = {"obs": stack_space(agent_obs, count)}
        if global_state == "auto":
            global_state = "state" if _has_state(self.env) else "concat"
        self.global_state = global_state
        if global_state == "state":
            if not _has_state(self.env):
                raise ValueError(
                    f"task.global_state: state, but {type(self.env).__name__} declares no "
                    "state_space (a Box) for its state(); use concat (the agents' observations "
                    "together) or false"
                )
            state_space = self.env.state_space
            spaces["state"] = stack_space(state_space, count)
        elif global_state == "concat":
            size = count * _flat_size(agent_obs)
            spaces["state"] = stack_space(
                gym.spaces.Box(-np.inf, np.inf, (size,), dtype=np.float32), count
            )
        if agent_index:
            spaces["agent_index"] = gym.spaces.MultiDiscrete([count] * count)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = stack_space(agent_act, count)
        self._discrete = isinstance(agent_act, gym.spaces.Discrete)
        self._zero_obs = _zeros(agent_obs)  # an absent agent's observation
        self._returns = np.zeros(count)

    # ----------------------------------------------------------------- helpers
    def _observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The stacked observation of the agents in ``obs`` (zeros for the others)."""
        rows = []
        for agent in self.agents:
            if agent in obs:
                rows.append(obs[agent])
            else:
                rows.append(self._zero_obs)
        out: dict[str, Any] = {"obs": _stack(rows)}
        if self.global_state == "state":
            state = np.asarray(self.env.state())
            out["state"] = np.broadcast_to(state, (len(self.agents), *state.shape))
        elif self.global_state == "concat":
            leaves = _leaves(out["obs"], self._obs_space, len(self.agents))
            flat = np.concatenate(leaves, axis=1).reshape(-1)
            out["state"] = np.broadcast_to(flat, (len(self.agents), len(flat)))
        if "agent_index" in self.observation_space.spaces:
            out["agent_index"] = np.arange(len(self.agents), dtype=np.int64)
        return out

    def _fields(self, infos: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
        """The inner env's per-agent fields, one row per agent (``missing`` for absent ones)."""
        out = {}
        for field in self._agent_step_fields.values():
            missing = field.empty(1)[0]
            out[field.info] = np.array(
                [(infos.get(a) or {}).get(field.info, missing) for a in self.agents],
                dtype=field.dtype,
            )
        return out

    def _active(self) -> np.ndarray:
        live = set(self.env.agents)
        return np.array([a in live for a in self.agents], dtype=bool)

    # --------------------------------------------------------------- interface
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset; an unseeded reset seeds the inner environment from this env's ``np_random``."""
        super().reset(seed=seed)
        inner_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        obs, infos = self.env.reset(seed=inner_seed, options=options)
        self._returns[:] = 0.0
        count = len(self.agents)
        info = {
            **self._fields(infos),
            AGENT_ACTIVE: self._active(),
            AGENT_REWARDS: np.zeros(count, np.float32),
            AGENT_DONE: np.zeros(count, np.int8),
        }
        return self._observation(obs), info

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Step every agent still in the episode with its row of ``action``."""
        live = list(self.env.agents)
        actions = {
            a: (int(action[i]) if self._discrete else np.asarray(action[i]))
            for i, a in enumerate(self.agents)
            if a in live
        }
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        count = len(self.agents)
        agent_rewards = np.zeros(count, np.float32)
        done = np.zeros(count, np.int8)
        for i, agent in enumerate(self.agents):
            if agent not in live:
                continue
            agent_rewards[i] = float(rewards.get(agent, 0.0))
            if terminations.get(agent, False):
                done[i] = DONE_TERMINATED
            elif truncations.get(agent, False):
                done[i] = DONE_TRUNCATED
        self._returns += agent_rewards
        active = self._active()
        ended = not active.any()
        truncated = ended and bool((done == DONE_TRUNCATED).any())
        info: dict[str, Any] = {
            **self._fields(infos),
            AGENT_ACTIVE: active,
            AGENT_REWARDS: agent_rewards,
            AGENT_DONE: done,
        }
        if ended:
            metrics: dict[str, float] = {}
            for agent in self.agents:
                metrics.update((infos.get(agent) or {}).get("episode_metrics") or {})
            for i, agent in enumerate(self.agents):
                metrics[f"return/{agent}"] = float(self._returns[i])
            info["episode_metrics"] = metrics
        return (
            self._observation(obs),
            float(agent_rewards.sum()),
            ended and not truncated,
            truncated,
            info,
        )

    def render(self) -> Any:
        """The inner environment's frame."""
        return self.env.render()

    def close(self) -> None:
        """Close the inner environment."""
        self.env.close()


def _stack(rows: list[Any]) -> Any:
    """Stack the agents' observations (entry by entry for ``Dict`` and ``Tuple`` ones)."""
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(first)))
    return np.array(rows)  # (np.stack: three times the time for a few small arrays)


def _zeros(space: gym.Space) -> Any:
    """An observation of ``space`` of zeros (``Dict`` and ``Tuple`` ones entry by entry)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _zeros(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_zeros(s) for s in space.spaces)
    return np.zeros(space.shape, dtype=space.dtype)


def _flat_size(space: gym.Space) -> int:
    """Values in one observation of ``space``: each entry's elements (a Discrete: one)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(_flat_size(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    return int(np.prod(space.shape, dtype=np.int64))


def _leaves(stacked: Any, space: gym.Space, count: int) -> list[np.ndarray]:
    """Every entry of a stacked observation as ``[count, elements]`` float32.

    In the order of one agent's ``space``, whatever order the environment's dicts come in.
    """
    if isinstance(space, gym.spaces.Dict):
        return [x for k, s in space.spaces.items() for x in _leaves(stacked[k], s, count)]
    if isinstance(space, gym.spaces.Tuple):
        pairs = zip(stacked, space.spaces, strict=True)
        return [x for v, s in pairs for x in _leaves(v, s, count)]
    return [np.asarray(stacked, dtype=np.float32).reshape(count, -1)]
