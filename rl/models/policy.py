"""The policy protocol: what collectors, losses, evaluation and checkpoints need of a model.

A policy is a ``torch.nn.Module`` (its ``state_dict`` is the checkpoint's ``model``) with

- :meth:`Policy.initial_state`: a ``TensorDict`` of batch ``[N]`` of any structure
  (``{"h": [N, L, H]}`` for a GRU, empty for a memoryless policy). Collectors carry it from
  step to step, store it with every step (truncated-BPTT chunks start from it), save it in
  checkpoints and pause environments by indexing it; they never look inside.
- :meth:`Policy.act`: reads a step (batch ``[N]``: ``obs``, ``episode_starts`` ``[N]`` bool,
  ``state``) and writes into it ``actions``, ``logprobs`` ``[N]``, ``values`` ``[N]``,
  ``next_state`` and any extras of its own (``[N, ...]``: recorded with the step, so a loss of
  the policy's own reads them from its minibatch). Where the step holds ``forced_actions``
  (teacher forcing: ``-1`` where the policy draws), those actions are taken and ``logprobs``
  are theirs.
- :meth:`Policy.forward`: time-major sequences ``[T, N, ...]`` for the update, from the state
  before the first step, resetting the state before every step whose ``episode_starts`` is set.

Optionally, a critic that learns normalised values has ``value_norms(obs)``: its
:class:`~rl.models.value_norm.ValueNorm` statistics, each with the ``[T, N]`` mask of the rows
whose returns it follows (None: every row); the learner updates them with each rollout's returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from tensordict import TensorDict
from torch import nn

from rl.models.distributions import ActionDistribution

__all__ = [
    "ACTIONS",
    "EPISODE_STARTS",
    "FORCED_ACTIONS",
    "LOGPROBS",
    "NEXT_STATE",
    "OBS",
    "STATE",
    "STEP_KEYS",
    "VALUES",
    "Policy",
    "PolicyBase",
    "PolicyOutput",
    "empty_state",
    "first_step",
    "policy_input",
    "write_step",
]


@dataclasses.dataclass
class PolicyOutput:
    """A policy evaluated over a time-major batch.

    Attributes:
        dist: The action distribution at every step (batch shape ``[T, N]``).
        values: ``[T, N]`` state-value estimates.
        extras: More outputs ``[T, N, ...]`` by name, for losses of the policy's own (e.g. an
            auxiliary head's predictions); nothing by default.
        value_norm: ``(mean, std)`` of the value targets, broadcastable to ``values``, for a
            critic that learns in normalised units (:mod:`rl.models.value_norm`): value losses
            compare values and returns as ``(x - mean) / std``. None: in the reward's units.
    """

    dist: ActionDistribution
    values: torch.Tensor
    extras: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    value_norm: tuple[torch.Tensor, torch.Tensor] | None = None


# The step's fixed keys: Policy.act reads the first three and writes the next four.
OBS, EPISODE_STARTS, STATE = "obs", "episode_starts", "state"
ACTIONS, LOGPROBS, VALUES, NEXT_STATE = "actions", "logprobs", "values", "next_state"
FORCED_ACTIONS = "forced_actions"
STEP_KEYS = frozenset(
    {OBS, EPISODE_STARTS, STATE, ACTIONS, LOGPROBS, VALUES, NEXT_STATE, FORCED_ACTIONS}
)


_P = TypeVar("_P", bound="Policy")


@runtime_checkable
class Policy(Protocol):
    """What the framework calls on a model (see the module docstring), ``nn.Module``'s included."""

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        """The state before any observation, batch ``[num_envs]``, on ``device`` (always given)."""
        ...

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> tuple[PolicyOutput, TensorDict]:
        """Evaluate ``[T, N, ...]`` observations from ``state`` (``[N]``); the state after."""
        ...

    def act(
        self,
        step: TensorDict,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> TensorDict:
        """One step of ``N`` environments, written into ``step``, which it returns."""
        ...

    # What the framework uses of ``nn.Module``.
    training: bool

    def __call__(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> tuple[PolicyOutput, TensorDict]:
        """:meth:`forward`, through the module's hooks."""
        ...

    def train(self: _P, mode: bool = True) -> _P:
        """Training mode (``mode``) or evaluation mode."""
        ...

    def eval(self: _P) -> _P:
        """Evaluation mode."""
        ...

    def to(self: _P, device: torch.device | str) -> _P:
        """Parameters and buffers moved to ``device``."""
        ...

    def requires_grad_(self: _P, requires_grad: bool = True) -> _P:
        """Whether autograd records operations on the parameters."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The trainable parameters."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Parameters and buffers by name (a checkpoint's ``model``)."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Parameters and buffers from a :meth:`state_dict`."""
        ...


def empty_state(num_envs: int, device: torch.device | str) -> TensorDict:
    """The state of a memoryless policy: an empty ``TensorDict`` of batch size ``[num_envs]``."""
    return TensorDict({}, batch_size=[num_envs], device=torch.device(device))


class PolicyBase(nn.Module):
    """A :class:`Policy` whose :meth:`act` is :meth:`forward` on one step.

    Subclasses define ``forward`` (and ``initial_state`` when they have memory).
    """

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        """Memoryless by default: an empty state."""
        return empty_state(num_envs, device)

    @torch.no_grad()
    def act(
        self,
        step: TensorDict,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> TensorDict:
        """One step: :meth:`forward` on ``T = 1``, then a draw (or the mode) into ``step``."""
        obs = {k: v.unsqueeze(0) for k, v in step.get(OBS).items()}
        out, state = self(obs, step.get(EPISODE_STARTS).unsqueeze(0), step.get(STATE))
        return write_step(
            step, first_step(out.dist), out.values[0], state, deterministic, generator
        )


def write_step(
    step: TensorDict,
    dist: ActionDistribution,
    values: torch.Tensor,
    state: TensorDict,
    deterministic: bool = False,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """Draw from ``dist`` (batch ``[N]``, the mode where ``deterministic``) into ``step``.

    Writes ``actions``, ``logprobs``, ``values`` and ``next_state``; ``forced_actions`` ``>= 0``
    are taken instead of a draw.
    """
    actions = dist.mode() if deterministic else dist.sample(generator)
    forced = step.get(FORCED_ACTIONS, None)
    if forced is not None and forced.shape == actions.shape and not actions.is_floating_point():
        actions = torch.where(forced >= 0, forced.to(actions.dtype), actions)
    n, on = step.batch_size, step.device
    for key, value in (
        (ACTIONS, actions), (LOGPROBS, dist.log_prob(actions)), (VALUES, values),
        (NEXT_STATE, state),
    ):  # fmt: skip
        # set() checks the batch and device of every entry; this is every step of every
        # rollout, so an entry already of the step's batch and device skips those checks.
        if value.shape[:1] == n and (on is None or value.device == on):
            step._set_str(key, value, inplace=False, validated=True)
        else:
            step.set(key, value)
    return step


def policy_input(
    obs: Mapping[str, torch.Tensor], episode_starts: torch.Tensor, state: TensorDict
) -> TensorDict:
    """A step for :meth:`Policy.act`: ``[N, ...]`` observations, episode starts and state."""
    n = len(episode_starts)
    return TensorDict(
        {OBS: TensorDict(dict(obs), batch_size=[n]), EPISODE_STARTS: episode_starts, STATE: state},
        batch_size=[n],
        device=episode_starts.device,
    )


def first_step(dist: ActionDistribution) -> ActionDistribution:
    """``dist`` (batch ``[1, N]``) at its only step (batch ``[N]``)."""
    index = getattr(dist, "index", None)
    if index is None:
        raise TypeError(
            f"{type(dist).__name__} has no index(): define act() on the policy, or give the "
            "distribution an index(i) method"
        )
    return index(0)
