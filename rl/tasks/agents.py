"""Several agents in one environment: how they travel as one environment and as rows.

To the samplers a multi-agent task is one ``gymnasium.Env`` whose every entry is stacked over
its ``A`` agents (:func:`stack_space`), with the per-agent step fields of :func:`agent_fields`
(declaring ``agent_rewards`` makes a task multi-agent). Each agent is a row of the batch and the
policy sees one agent's spaces (:func:`unstack_space`); agents of different kinds form groups
(:class:`AgentGroup`), one policy each. The rules: docs/concepts/multi-agent.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np

from rl.tasks.fields import StepField

__all__ = [
    "AGENT_ACTIVE",
    "AGENT_GROUP",
    "AgentGroup",
    "group_layouts",
    "union_action_space",
    "AGENT_DONE",
    "AGENT_REWARDS",
    "DONE_TERMINATED",
    "DONE_TRUNCATED",
    "agent_fields",
    "num_agents",
    "stack_space",
    "unstack_space",
]

AGENT_REWARDS = "agent_rewards"
AGENT_DONE = "agent_done"
AGENT_ACTIVE = "agent_active"
AGENT_GROUP = "agent_group"  # (rl.models.grouped.GROUP_ENTRY reads it)
GROUP_OBS = "obs"  # a group's own observation entry: obs/<group>
DONE_TERMINATED, DONE_TRUNCATED = 1, 2


def agent_fields(count: int) -> dict[str, StepField]:
    """The step fields of a task with ``count`` agents.

    ``agent_rewards`` (each agent's reward; the env's own is their sum) and ``agent_done``
    (:data:`DONE_TERMINATED` or :data:`DONE_TRUNCATED` in the step an agent's episode ends)
    are values of the step; ``agent_active`` (still in the episode) comes with the observation.
    """
    return {
        AGENT_REWARDS: StepField(AGENT_REWARDS, (count,), "float32", transition=True),
        AGENT_DONE: StepField(AGENT_DONE, (count,), "int8", transition=True),
        AGENT_ACTIVE: StepField(AGENT_ACTIVE, shape=(count,), dtype="bool", missing=1),
    }


def num_agents(fields: Mapping[str, StepField]) -> int | None:
    """The agents of a task with step ``fields``; None for a single-agent task."""
    rewards = fields.get(AGENT_REWARDS)
    if rewards is None:
        return None
    if len(rewards.shape) != 1 or rewards.shape[0] < 1:
        raise ValueError(f"step field {AGENT_REWARDS!r} must have shape [agents], got {rewards}")
    count = rewards.shape[0]
    if not (rewards.transition and AGENT_DONE in fields and fields[AGENT_DONE].transition):
        raise ValueError(
            f"{AGENT_REWARDS!r} and {AGENT_DONE!r} are values of the step (transition: true), "
            "not of the observation (rl.tasks.agents.agent_fields)"
        )
    for key in (AGENT_DONE, AGENT_ACTIVE):
        if key not in fields or fields[key].shape != (count,):
            raise ValueError(
                f"a multi-agent task ({AGENT_REWARDS!r} of shape [{count}]) must declare "
                f"{key!r} of shape [{count}] too (rl.tasks.agents.agent_fields)"
            )
    return count


def stack_space(space: gym.Space, count: int) -> gym.Space:
    """``space`` of one agent stacked for ``count`` agents (a leading axis of ``count``).

    ``Discrete(n)`` becomes ``MultiDiscrete([n] * count)``.
    """
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: stack_space(s, count) for k, s in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple([stack_space(s, count) for s in space.spaces])
    if isinstance(space, gym.spaces.Box):
        low = np.broadcast_to(space.low, (count, *space.shape))
        high = np.broadcast_to(space.high, (count, *space.shape))
        return gym.spaces.Box(low.copy(), high.copy(), dtype=space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"a Discrete agent space must start at 0, got {space}")
        return gym.spaces.MultiDiscrete([int(space.n)] * count)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return gym.spaces.MultiDiscrete(np.stack([space.nvec] * count))
    if isinstance(space, gym.spaces.MultiBinary):
        return gym.spaces.MultiBinary([count, *np.atleast_1d(space.n)])
    raise ValueError(f"an agent space of kind {type(space).__name__} cannot be stacked: {space}")


def unstack_space(space: gym.Space) -> gym.Space:
    """One agent's space of a space :func:`stack_space` made (the agents' must be alike)."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: unstack_space(s) for k, s in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple([unstack_space(s) for s in space.spaces])
    if isinstance(space, gym.spaces.Box) and space.shape:
        low, high = space.low, space.high
        if not ((low == low[:1]).all() and (high == high[:1]).all()):
            raise ValueError(f"the agents' Box spaces differ (bounds): {space}")
        return gym.spaces.Box(low[0], high[0], dtype=space.dtype)
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = space.nvec
        if not (nvec == nvec[:1]).all():
            raise ValueError(f"the agents' discrete spaces differ: {space}")
        if nvec.ndim == 1:
            return gym.spaces.Discrete(int(nvec[0]))
        return gym.spaces.MultiDiscrete(nvec[0])
    if isinstance(space, gym.spaces.MultiBinary) and np.ndim(space.n) >= 1:
        shape = tuple(np.atleast_1d(space.n)[1:])
        return gym.spaces.MultiBinary(list(shape) if len(shape) > 1 else int(shape[0]))
    raise ValueError(f"{space} is not a space stacked over agents (no leading agent axis)")


@dataclasses.dataclass(frozen=True)
class AgentGroup:
    """A group of a multi-agent task's agents: one policy for them, with spaces of its own.

    Attributes:
        name: The group's name (``adversary``).
        agents: The indices of its agents in the environment.
        action_space: One agent's action space (the group's own, not the rows' union).
        observation_space: The flat observation space the group's policy sees (filled by
            :func:`group_layouts`).
        entries: ``(policy's key, row's key)`` of each entry of ``observation_space``.
    """

    name: str
    agents: tuple[int, ...]
    action_space: gym.Space
    observation_space: gym.spaces.Dict | None = None
    entries: tuple[tuple[str, str], ...] = ()


def union_action_space(spaces: Sequence[gym.Space]) -> gym.Space:
    """The action space of rows of agents with the action ``spaces`` (one per group).

    ``Discrete`` spaces: the largest; 1-D ``Box`` spaces: the longest, the others padded with
    zeros (bounds widened to hold every group's); any other kind: one space for all.
    """
    first = spaces[0]
    if all(s == first for s in spaces):
        return first
    discrete = [s for s in spaces if isinstance(s, gym.spaces.Discrete)]
    if len(discrete) == len(spaces) and all(int(s.start) == 0 for s in discrete):
        return gym.spaces.Discrete(max(int(s.n) for s in discrete))
    boxes = [s for s in spaces if isinstance(s, gym.spaces.Box)]
    if len(boxes) == len(spaces) and all(len(s.shape) == 1 for s in boxes):
        size = max(s.shape[0] for s in boxes)
        low, high = np.zeros(size, np.float64), np.zeros(size, np.float64)
        for s in boxes:
            n = s.shape[0]
            low[:n], high[:n] = np.minimum(low[:n], s.low), np.maximum(high[:n], s.high)
        dtype = np.result_type(*(s.dtype for s in boxes))
        return gym.spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype)
    raise ValueError(
        f"the agent groups' action spaces cannot share rows: {list(spaces)} (groups may differ "
        "in the size of a Discrete or a 1-D Box space, not in its kind)"
    )


def group_layouts(
    groups: Sequence[AgentGroup], observation_space: gym.spaces.Dict
) -> tuple[AgentGroup, ...]:
    """``groups`` with the observation space each one's policy sees (one agent's, flat).

    Group ``g`` sees its own entries (``obs/g...`` renamed ``obs...``) and every entry that is
    no group's (a global ``state``, ``agent_index``), not ``agent_group``.
    """
    names = {g.name for g in groups}
    out = []
    for group in groups:
        entries: list[tuple[str, str]] = []
        own = f"{GROUP_OBS}/{group.name}"
        for key in observation_space.spaces:
            head, _, rest = key.partition("/")
            if key == AGENT_GROUP or (head == GROUP_OBS and rest.split("/")[0] in names):
                if key == own or key.startswith(own + "/"):
                    entries.append((GROUP_OBS + key[len(own) :], key))
                continue
            entries.append((key, key))
        if not any(row != policy for policy, row in entries):
            raise ValueError(
                f"agent group {group.name!r} has no observation entry of its own ({own!r}) "
                f"among {sorted(observation_space.spaces)}"
            )
        space = gym.spaces.Dict({k: observation_space[row] for k, row in entries})
        out.append(dataclasses.replace(group, observation_space=space, entries=tuple(entries)))
    return tuple(out)
