"""The Policy protocol's shapes, checked once where a policy is built (:func:`check_policy`).

A policy of one's own returning values ``[T, N, 1]`` would otherwise fail far from its cause.
The probe (``T = 3`` steps of ``N = 2`` environments drawn from the task's space, an episode
start at the second step) changes nothing: no gradients, evaluation mode, its own random stream.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rl.models.policy import ACTIONS, LOGPROBS, NEXT_STATE, STEP_KEYS, VALUES, policy_input
from rl.utils.config import ConfigError

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
