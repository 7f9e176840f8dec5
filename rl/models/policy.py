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

:func:`build_policy` is the one way the framework builds a policy from its config, and checks it
against this protocol (:func:`check_policy`): a policy of one's own returning values
``[T, N, 1]`` would otherwise fail far from its cause. The probe (``T = 3`` steps of ``N = 2``
environments drawn from the task's space, an episode start at the second step) changes nothing:
no gradients, evaluation mode, its own random stream.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import gymnasium as gym
import hydra.utils
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from rl.models.distributions import ActionDistribution
from rl.utils.config import ConfigError

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
    "PolicyShapeError",
    "build_policy",
    "check_policy",
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


# ------------------------------------------------------------ building one, checked
def build_policy(
    model_cfg: Mapping[str, Any],
    observation_space: gym.spaces.Dict,
    action_space: gym.Space,
    *,
    groups: Sequence[Any] | None = None,
) -> Any:
    """Instantiate a model config (a ``_partial_`` ``_target_``) for the given spaces.

    The one way the framework builds a policy: ``build_policy(cfg["model"],
    *task_spaces(cfg["task"]))``, with ``groups`` for a task with groups of agents
    (:attr:`rl.tasks.TaskLayout.groups`). The policy is checked against the
    :class:`~rl.models.policy.Policy` protocol, its outputs' shapes included.
    """
    build = hydra.utils.instantiate(dict(model_cfg))
    kwargs: dict[str, Any] = {}
    if groups:
        if "groups" not in _parameters(build):
            names = ", ".join(f"{g.name} (agents {list(g.agents)})" for g in groups)
            raise ValueError(
                f"the task has groups of agents with spaces of their own ({names}), one policy "
                f"each, but model._target_={model_cfg.get('_target_')!r} takes no groups: use "
                "model=grouped (rl.models.GroupedPolicy)"
            )
        kwargs["groups"] = tuple(groups)
    policy = build(observation_space=observation_space, action_space=action_space, **kwargs)
    if not isinstance(policy, nn.Module) or not isinstance(policy, Policy):
        missing = [m for m in ("initial_state", "forward", "act") if not hasattr(policy, m)]
        raise TypeError(
            f"model._target_={model_cfg.get('_target_')!r} built a {type(policy).__name__}, "
            "not a policy: a torch.nn.Module with initial_state, forward and act "
            "(rl.models.Policy; subclass rl.models.PolicyBase to get act)"
            + (f"; it lacks {', '.join(missing)}" if missing else "")
        )
    check_policy(policy, observation_space)
    return policy


def _parameters(build: Any) -> set[str]:
    try:
        return set(inspect.signature(build).parameters)
    except (TypeError, ValueError):  # (no signature to read: pass nothing more)
        return set()


_T, _N = 3, 2  # the probe's steps and environments


class PolicyShapeError(ConfigError, TypeError):
    """A policy's output does not have the shape the protocol asks for (a config error)."""


def _batch(space: gym.spaces.Dict, lead: tuple[int, ...]) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    out = {}
    for key, sub in space.spaces.items():
        sub = copy.deepcopy(sub)  # (the task's space keeps its own random stream)
        sub.seed(int(rng.integers(2**31)))
        samples = [np.asarray(sub.sample()) for _ in range(int(np.prod(lead)))]
        out[key] = torch.as_tensor(np.stack(samples)).reshape(*lead, *samples[0].shape)
    return out


def _expect(policy: Any, what: str, value: Any, shape: tuple[int, ...], hint: str) -> None:
    got = tuple(value.shape) if isinstance(value, torch.Tensor) else None
    if got != shape:
        shown = "not a tensor" if got is None else f"shape {list(got)}"
        raise PolicyShapeError(
            f"policy {type(policy).__name__}: {what} has {shown}; expected {list(shape)} "
            f"({hint}). See rl.models.Policy (docs/howto/add-a-model.md)."
        )


def check_policy(policy: Any, observation_space: gym.spaces.Dict) -> None:
    """Run ``policy`` once on a small batch; a :class:`PolicyShapeError` names a wrong output."""
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            _probe(policy, observation_space)
    finally:
        policy.train(was_training)


def _probe(policy: Any, observation_space: gym.spaces.Dict) -> None:
    device = next((p.device for p in policy.parameters()), torch.device("cpu"))
    state = policy.initial_state(_N, device)
    _check_state(policy, f"initial_state({_N})", state)
    obs = {k: v.to(device) for k, v in _batch(observation_space, (_T, _N)).items()}
    starts = torch.zeros(_T, _N, dtype=torch.bool, device=device)
    starts[1, 0] = True
    output, after = policy(obs, starts, state)
    _expect(policy, "forward()'s values", output.values, (_T, _N), "one value per step and "
            "environment: [T, N], not [T, N, 1]")  # fmt: skip
    _check_state(policy, "forward()'s state after", after)
    first = {k: v[0] for k, v in obs.items()}
    step = policy.act(policy_input(first, starts[0], state), deterministic=True)
    if not isinstance(step, TensorDict):
        raise PolicyShapeError(
            f"policy {type(policy).__name__}: act() returned {type(step).__name__}; expected the "
            "step TensorDict it was given, its actions, logprobs, values and next_state written "
            "in (rl.models.Policy.act)"
        )
    missing = [k for k in (ACTIONS, LOGPROBS, VALUES, NEXT_STATE) if k not in step.keys()]
    if missing:
        raise PolicyShapeError(
            f"policy {type(policy).__name__}: act() wrote no {', '.join(missing)} into the step "
            "(rl.models.Policy.act writes actions, logprobs, values and next_state)"
        )
    _expect(policy, "act()'s values", step.get(VALUES), (_N,), "one per environment: [N]")
    _expect(policy, "act()'s logprobs", step.get(LOGPROBS), (_N,), "one per environment: [N]")
    _check_state(policy, "act()'s next_state", step.get(NEXT_STATE))
    actions = step.get(ACTIONS)
    actions = actions.unsqueeze(0).expand(_T, *actions.shape)
    _expect(policy, "forward()'s dist.log_prob(actions)", output.dist.log_prob(actions),
            (_T, _N), "[T, N]: one log-probability per step and environment")  # fmt: skip
    for name, value in output.extras.items():
        if not isinstance(value, torch.Tensor) or tuple(value.shape[:2]) != (_T, _N):
            _expect(policy, f"forward()'s extras[{name!r}]", value, (_T, _N), "[T, N, ...]")
    for name in set(step.keys()) - STEP_KEYS:  # (a TensorDict keeps its entries [N, ...])
        if not isinstance(step.get(name), torch.Tensor):
            _expect(policy, f"act()'s extra {name!r}", step.get(name), (_N,), "a [N, ...] tensor")


def _check_state(policy: Any, where: str, state: Any) -> None:
    if not isinstance(state, TensorDict) or tuple(state.batch_size) != (_N,):
        raise PolicyShapeError(
            f"policy {type(policy).__name__}: {where} is {type(state).__name__} "
            f"{getattr(state, 'batch_size', '')}; expected a TensorDict of batch [{_N}] "
            "(batch-first: one entry per environment)"
        )
