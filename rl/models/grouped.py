"""One policy per group of agents: a multi-agent task's agents of different kinds.

:class:`GroupedPolicy` (``model=grouped``) runs each group's policy, built for the group's own
spaces, on its group's rows: a row is one agent, so a column of ``[T, N]`` is of one group
throughout. ``extras`` is empty, so auxiliary losses that read policy features do not apply.
Groups are described in docs/concepts/multi-agent.md ("Groups of agents").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import torch
from tensordict import TensorDict
from torch import nn

from rl.models.distributions import ActionDistribution
from rl.models.policy import Policy, PolicyBase, PolicyOutput
from rl.models.value_norm import ValueNorm

if TYPE_CHECKING:
    from rl.tasks.agents import AgentGroup

__all__ = ["GROUP_ENTRY", "GroupedDistribution", "GroupedPolicy"]

GROUP_ENTRY = "agent_group"  # each row's group index (rl.tasks.agents.AGENT_GROUP)


class _ActionFit:
    """A group's actions to and from the rows' union action space (1-D ``Box``: padded)."""

    def __init__(self, own: gym.Space, union: gym.Space) -> None:
        self.pad = 0
        if isinstance(own, gym.spaces.Box) and isinstance(union, gym.spaces.Box):
            self.size = own.shape[0] if own.shape else 0
            self.pad = union.shape[0] - self.size if union.shape else 0

    def own(self, actions: torch.Tensor) -> torch.Tensor:
        """Rows' actions as the group's (the padding dropped)."""
        return actions[..., : self.size] if self.pad else actions

    def row(self, actions: torch.Tensor) -> torch.Tensor:
        """The group's actions as rows' (padded with zeros)."""
        return nn.functional.pad(actions, (0, self.pad)) if self.pad else actions


class GroupedDistribution:
    """The action distribution of rows of several groups: each row's under its group's.

    ``parts``: ``(columns, distribution over those columns, fit)`` per group with rows;
    ``batch_shape``: ``[T, N]`` (or ``[N]`` for one step).
    """

    def __init__(
        self,
        parts: Sequence[tuple[torch.Tensor, ActionDistribution, _ActionFit]],
        batch_shape: tuple[int, ...],
    ) -> None:
        self.parts = list(parts)
        self.batch_shape = batch_shape
        self._dim = len(batch_shape) - 1  # the columns (rows of agents) are the last axis

    def _join(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Per-group tensors ``[..., n_g, ...]`` as one over every column."""
        first = pieces[0]
        shape = (*self.batch_shape, *first.shape[len(self.batch_shape) :])
        out = first.new_zeros(shape)
        for (cols, _, _), piece in zip(self.parts, pieces, strict=True):
            out = out.index_copy(self._dim, cols, piece)  # (out of place: gradients flow)
        return out

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Each row's log-probability of its action, under its group's distribution."""
        return self._join(
            [d.log_prob(fit.own(actions.index_select(self._dim, c))) for c, d, fit in self.parts]
        )

    def entropy(self) -> torch.Tensor:
        """Each row's entropy under its group's distribution."""
        return self._join([d.entropy() for _, d, _ in self.parts])

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """A draw for every row (group after group, from ``generator``)."""
        return self._join([fit.row(d.sample(generator)) for _, d, fit in self.parts])

    def mode(self) -> torch.Tensor:
        """Every row's most likely action."""
        return self._join([fit.row(d.mode()) for _, d, fit in self.parts])

    def index(self, i: int) -> GroupedDistribution:
        """The distribution at step ``i`` of a time-major one."""
        parts = [(c, d.index(i), fit) for c, d, fit in self.parts]
        return GroupedDistribution(parts, self.batch_shape[1:])


def _group_builder(policy: Callable[..., Any], override: Any, name: str) -> Callable[..., Any]:
    """The builder of group ``name``'s policy: ``policy`` with ``override``'s settings."""
    if override is None:
        return policy
    if callable(override):  # a policy of its own (a config with its _target_)
        return override
    if isinstance(override, Mapping):
        return functools.partial(policy, **dict(override))
    raise TypeError(
        f"model.group_policies.{name}: settings (a mapping) or a policy config with its "
        f"_target_, got {override!r}"
    )


class GroupedPolicy(PolicyBase):
    """One policy per group of agents, each on its group's rows.

    Args:
        observation_space: The rows' flat observation space (every group's entries).
        action_space: The rows' action space (the groups' union).
        groups: The task's groups (:attr:`rl.tasks.TaskLayout.groups`, passed by
            :func:`~rl.models.build_policy`), each with the spaces its policy sees.
        policy: Every group's policy: a ``_partial_`` model config.
        group_policies: By group name: settings that override ``policy``'s for that group,
            or a policy config of its own.
    """

    def __init__(
        self,
        *,
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
        groups: Sequence[AgentGroup],
        policy: Callable[..., Any],
        group_policies: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if GROUP_ENTRY not in observation_space.spaces:
            raise ValueError(
                f"model=grouped needs a task with groups of agents (an observation entry "
                f"{GROUP_ENTRY!r}); this one has {sorted(observation_space.spaces)}"
            )
        self.names = [g.name for g in groups]
        overrides = dict(group_policies or {})
        unknown = sorted(set(overrides) - set(self.names))
        if unknown:
            raise ValueError(
                f"model.group_policies: {unknown} are not groups of the task ({self.names})"
            )
        self.policies = nn.ModuleDict()
        self._entries: dict[str, tuple[tuple[str, str], ...]] = {}
        self._fits: dict[str, _ActionFit] = {}
        for group in groups:
            build = _group_builder(policy, overrides.get(group.name), group.name)
            sub = build(observation_space=group.observation_space, action_space=group.action_space)
            if not isinstance(sub, nn.Module) or not isinstance(sub, Policy):
                raise TypeError(
                    f"model: group {group.name!r}'s policy is a {type(sub).__name__}, not a "
                    "torch.nn.Module implementing rl.models.Policy"
                )
            self.policies[group.name] = sub
            self._entries[group.name] = group.entries
            self._fits[group.name] = _ActionFit(group.action_space, action_space)

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        """Every group's policy's state for every row (each row uses its group's)."""
        return TensorDict(
            {name: self._policy(name).initial_state(num_envs, device) for name in self.policies},
            batch_size=[num_envs],
            device=torch.device(device),
        )

    def _policy(self, name: str) -> Policy:
        """Group ``name``'s policy (checked to be a :class:`Policy` when built)."""
        return cast(Policy, self.policies[name])

    def _columns(self, obs: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """``(group, its columns)`` for each group with rows in ``obs`` (``[T, N]`` entries)."""
        column_group = obs[GROUP_ENTRY][0].reshape(-1)  # a row is one agent: one group
        out = []
        for i, name in enumerate(self.names):
            cols = (column_group == i).nonzero().squeeze(1)
            if cols.numel():
                out.append((name, cols))
        return out

    def _group_obs(
        self, name: str, obs: Mapping[str, torch.Tensor], cols: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return {k: obs[row].index_select(1, cols) for k, row in self._entries[name]}

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> tuple[PolicyOutput, TensorDict]:
        """Each group's policy on its columns of ``[T, N]``; joined outputs and states."""
        t_len, n = episode_starts.shape
        values = torch.zeros(t_len, n, device=episode_starts.device)
        means, stds = torch.zeros_like(values), torch.ones_like(values)
        normalised = False
        parts = []
        after = state.clone()
        for name, cols in self._columns(obs):
            sub = self._policy(name)
            sub_state = (
                state[name][cols]
                if name in state.keys()
                else sub.initial_state(len(cols), episode_starts.device)
            )
            out, sub_after = sub(
                self._group_obs(name, obs, cols), episode_starts.index_select(1, cols), sub_state
            )
            values = values.index_copy(1, cols, out.values)
            if out.value_norm is not None:
                normalised = True
                mean, std = (x.expand(t_len, len(cols)) for x in out.value_norm)
                means, stds = means.index_copy(1, cols, mean), stds.index_copy(1, cols, std)
            if name in after.keys() and not sub_after.is_empty():
                after[name][cols] = sub_after
            parts.append((cols, out.dist, self._fits[name]))
        dist = GroupedDistribution(parts, (t_len, n))
        norm = (means, stds) if normalised else None
        return PolicyOutput(dist=dist, values=values, value_norm=norm), after

    def value_norms(
        self, obs: Mapping[str, torch.Tensor]
    ) -> list[tuple[ValueNorm, torch.Tensor | None]]:
        """Each group's value normalisation, with the rows of its group (``[T, N]``)."""
        out: list[tuple[ValueNorm, torch.Tensor | None]] = []
        for name, cols in self._columns(obs):
            value_norms = getattr(self.policies[name], "value_norms", None)
            if value_norms is None:
                continue
            for norm, sub_rows in value_norms(self._group_obs(name, obs, cols)):
                rows = torch.zeros_like(obs[GROUP_ENTRY], dtype=torch.bool)
                own = torch.ones(rows.shape[0], len(cols), dtype=torch.bool, device=rows.device)
                rows[:, cols] = own if sub_rows is None else sub_rows.bool()
                out.append((norm, rows))
        return out
