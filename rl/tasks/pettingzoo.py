"""Any PettingZoo environment as a multi-agent task (``task=pettingzoo``).

:class:`ParallelEnvAdapter` makes a PettingZoo Parallel (or AEC) environment one
``gymnasium.Env`` stacked over its agents (:mod:`rl.tasks.agents`); its options are described
in docs/howto/pettingzoo.md. Every random draw comes from the adapter's own ``np_random`` (an
unseeded reset seeds the inner environment from it), so samplers save and replay its episodes
in flight as any task's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.agents import (
    AGENT_ACTIVE,
    AGENT_DONE,
    AGENT_GROUP,
    AGENT_REWARDS,
    DONE_TERMINATED,
    DONE_TRUNCATED,
    AgentGroup,
    agent_fields,
    stack_space,
    union_action_space,
)
from rl.tasks.fields import StepField

__all__ = ["ParallelEnvAdapter"]

GLOBAL_STATE_MODES = ("auto", "state", "concat", False)


def _as_parallel(env: Any) -> Any:
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


def _same_space(spaces: dict[str, gym.Space], what: str, group: str | None) -> gym.Space:
    first_agent, first = next(iter(spaces.items()))
    for agent, space in spaces.items():
        if space != first:
            where = "all agents" if group is None else f"the agents of group {group!r}"
            raise ValueError(
                f"agent {agent!r} has the {what} space {space}, agent {first_agent!r} {first}: "
                f"one policy for {where} needs one space for them (task.groups: prefix, or a "
                "mapping of group names to agents, with model=grouped gives each kind of agent "
                "a policy of its own)"
            )
    return first


def _groups(agents: list[str], groups: str | Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    if groups == "prefix":
        out: dict[str, list[str]] = {}
        for agent in agents:
            out.setdefault(agent.rsplit("_", 1)[0], []).append(agent)
        return out
    if not isinstance(groups, Mapping):
        raise ValueError(
            f"task.groups must be null, prefix or a mapping of group names to agent names, "
            f"got {groups!r}"
        )
    out = {str(name): [str(a) for a in members] for name, members in groups.items()}
    named = [a for members in out.values() for a in members]
    unknown = sorted(set(named) - set(agents))
    twice = sorted({a for a in named if named.count(a) > 1})
    missing = [a for a in agents if a not in named]
    if unknown or twice or missing or not all(out.values()):
        raise ValueError(
            f"task.groups must put each of the environment's agents {agents} in one group: "
            + "; ".join(
                f"{what} {names}"
                for what, names in (
                    ("not agents of the environment:", unknown),
                    ("in two groups:", twice),
                    ("in no group:", missing),
                    ("empty groups:", [g for g, m in out.items() if not m]),
                )
                if names
            )
        )
    return out


def _has_state(env: Any) -> bool:
    return isinstance(getattr(env, "state_space", None), gym.spaces.Box)


class ParallelEnvAdapter(gym.Env):
    """A PettingZoo Parallel environment as one gymnasium env stacked over its agents.

    Args:
        env: The environment's constructor (``_partial_: true``; called with ``render_mode``
            when one is asked for), or an environment already built.
        global_state: ``auto``, ``state``, ``concat`` or ``false``: the entry ``state``.
        agent_index: Add each agent's index to its observation (``agent_index``).
        groups: ``prefix``, ``{group: [agent, ...]}``, or None (one policy shared by all).
    """

    metadata = {"render_modes": ["rgb_array"]}
    observation_space: gym.spaces.Dict

    def __init__(
        self,
        env: Callable[..., Any] | Any,
        *,
        global_state: str | bool = "auto",
        agent_index: bool = False,
        groups: str | Mapping[str, Sequence[str]] | None = None,
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
        # The inner env's own per-agent fields (e.g. an expert's action), stacked over agents.
        inner = getattr(self.env, "unwrapped", self.env)
        self._agent_step_fields: dict[str, StepField] = dict(
            getattr(inner, "step_fields", None) or {}
        )
        self.step_fields = {
            key: dataclasses.replace(field, shape=(count, *field.shape))
            for key, field in self._agent_step_fields.items()
        }
        self.step_fields.update(agent_fields(count))
        members = {None: self.agents} if groups is None else _groups(self.agents, groups)
        self._grouped = groups is not None
        self._group_obs: dict[str | None, gym.Space] = {}
        acts: dict[str | None, gym.Space] = {}
        self._group_of = np.zeros(count, np.int64)  # each agent's group index
        for g, (name, agents) in enumerate(members.items()):
            self._group_obs[name] = _same_space(
                {a: self.env.observation_space(a) for a in agents}, "observation", name
            )
            acts[name] = _same_space({a: self.env.action_space(a) for a in agents}, "action", name)
            self._group_of[[self.agents.index(a) for a in agents]] = g
        if self._grouped:  # a Dict of groups
            own = {str(n): stack_space(s, count) for n, s in self._group_obs.items()}
            spaces: dict[str, gym.Space] = {"obs": gym.spaces.Dict(own)}
        else:
            spaces = {"obs": stack_space(self._group_obs[None], count)}
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
            spaces["state"] = stack_space(self.env.state_space, count)
        elif global_state == "concat":
            own_spaces = list(self._group_obs.values())
            size = sum(_flat_size(own_spaces[g]) for g in self._group_of)
            spaces["state"] = stack_space(
                gym.spaces.Box(-np.inf, np.inf, (size,), dtype=np.float32), count
            )
        if self._grouped:
            spaces[AGENT_GROUP] = gym.spaces.MultiDiscrete([len(members)] * count)
            self.agent_groups = tuple(
                AgentGroup(str(name), tuple(self.agents.index(a) for a in agents), acts[name])
                for name, agents in members.items()
            )
        if agent_index:
            spaces["agent_index"] = gym.spaces.MultiDiscrete([count] * count)
        self.observation_space = gym.spaces.Dict(spaces)
        self._set_actions([acts[name] for name in members])
        self._zero_obs = {name: _zeros(space) for name, space in self._group_obs.items()}
        self._members = [set(agents) for agents in members.values()]
        self._leaf_paths = {name: _leaf_paths(space) for name, space in self._group_obs.items()}
        self._group_list = self._group_of.tolist()
        self._returns = np.zeros(count)

    def _set_actions(self, spaces: list[gym.Space]) -> None:
        """The rows' action space from the groups' ``spaces``; how each agent reads its row."""
        union = union_action_space(spaces)
        self.action_space = stack_space(union, len(self.agents))
        # Each agent's action from its row: an int (Discrete), the group's part of a padded Box.
        own = [spaces[g] for g in self._group_of]
        self._discrete = [isinstance(a, gym.spaces.Discrete) for a in own]
        self._all_discrete = all(self._discrete)
        self._act_size = [
            a.shape[0] if isinstance(a, gym.spaces.Box) and a != union else None for a in own
        ]

    def _observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The stacked observation of the agents in ``obs`` (zeros for the others)."""
        count = len(self.agents)
        stacked = {  # each group's agents' rows, zeros in the others'
            name: _stack([obs[a] if a in members and a in obs else zeros for a in self.agents])
            for (name, zeros), members in zip(self._zero_obs.items(), self._members, strict=True)
        }
        out: dict[str, Any] = {
            "obs": {str(k): v for k, v in stacked.items()} if self._grouped else stacked[None]
        }
        if self.global_state == "state":
            state = np.asarray(self.env.state())
            out["state"] = np.broadcast_to(state, (count, *state.shape))
        elif self.global_state == "concat":
            # Every agent's own observation, flat, agent after agent.
            own = [_flat_rows(stacked[n], self._leaf_paths[n], count) for n in self._group_obs]
            if self._grouped:
                flat = np.concatenate([own[g][i] for i, g in enumerate(self._group_list)])
            else:
                flat = own[0].reshape(-1)
            out["state"] = np.broadcast_to(flat, (count, len(flat)))
        if self._grouped:
            out[AGENT_GROUP] = self._group_of
        if "agent_index" in self.observation_space.spaces:
            out["agent_index"] = np.arange(count, dtype=np.int64)
        return out

    def _fields(self, infos: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
        """The inner env's per-agent fields, one row per agent."""
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
        if self._all_discrete:
            actions = {a: int(action[i]) for i, a in enumerate(self.agents) if a in live}
        else:
            actions = {a: self._action(action, i) for i, a in enumerate(self.agents) if a in live}
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

    def _action(self, action: np.ndarray, i: int) -> Any:
        """Agent ``i``'s action from its row (its own part of a padded ``Box`` row)."""
        if self._discrete[i]:
            return int(action[i])
        size = self._act_size[i]
        return np.asarray(action[i]) if size is None else np.asarray(action[i][:size])

    def render(self) -> Any:
        """The inner environment's frame."""
        return self.env.render()

    def close(self) -> None:
        """Close the inner environment."""
        self.env.close()


def _stack(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(first)))
    return np.array(rows)  # (np.stack: three times the time for a few small arrays)


def _zeros(space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _zeros(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_zeros(s) for s in space.spaces)
    return np.zeros(space.shape, dtype=space.dtype)


def _flat_size(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Dict):
        return sum(_flat_size(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    assert space.shape is not None, f"{space} has no shape"
    return int(np.prod(space.shape, dtype=np.int64))


def _leaf_paths(space: gym.Space, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(space, gym.spaces.Dict):
        return [p for k, s in space.spaces.items() for p in _leaf_paths(s, (*path, k))]
    if isinstance(space, gym.spaces.Tuple):
        return [p for i, s in enumerate(space.spaces) for p in _leaf_paths(s, (*path, i))]
    return [path]


def _flat_rows(stacked: Any, paths: list[tuple[Any, ...]], count: int) -> np.ndarray:
    """The leaves at ``paths`` as float32 ``[count, values]``, in the space's order."""
    leaves = []
    for path in paths:
        value = stacked
        for key in path:
            value = value[key]
        leaves.append(np.asarray(value, dtype=np.float32).reshape(count, -1))
    return np.concatenate(leaves, axis=1) if len(leaves) > 1 else leaves[0]
