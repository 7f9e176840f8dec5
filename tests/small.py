"""The small configs tests share: a PointNav layout that trains in seconds, a serial sampler of
four environments, a tiny recurrent policy (``from small import SMALL, MODEL, SERIAL``).

Tests that need another episode length take ``small_nav(max_steps=...)``. Helpers for the
samplers' step ``TensorDict``: :func:`assert_same_step` (bitwise equality of two steps),
:func:`tensor_leaves`, :func:`obs_of` (a step's observations as a plain dict) and
:func:`final_obs_of` (the final observations of its truncated episodes, and their positions).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from rl.sampling import finished_episodes

__all__ = [
    "MODEL",
    "SERIAL",
    "SMALL",
    "assert_same_step",
    "final_obs_of",
    "obs_of",
    "small_nav",
    "tensor_leaves",
]


def small_nav(max_steps: int = 30) -> dict[str, Any]:
    """A 9x9 PointNav layout of 2x2 rooms, episodes of at most ``max_steps``."""
    return {"_target_": "rl_envs.pointnav.PointNavEnv", "size": 9, "rooms_per_side": 2,
            "max_steps": max_steps}  # fmt: skip


SMALL = small_nav()
MODEL = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [8],
         "trunk_layers": [16], "rnn": "gru", "rnn_hidden_size": 8}  # fmt: skip
SERIAL = {"_target_": "rl.sampling.SerialSampler", "_partial_": True, "num_envs": 4}


def tensor_leaves(step: TensorDict) -> dict[Any, Any]:
    """Every tensor entry of a sampler's step (nested keys as tuples), by key."""
    return {key: step.get(key) for key in step.keys(include_nested=True, leaves_only=True)}


def assert_same_step(a: TensorDict, b: TensorDict) -> None:
    """Two sampler steps (or resets) bitwise the same: the same tensor entries (nested keys,
    dtypes, shapes, bytes: NaN and -0.0 included) and the same finished episodes (env index,
    exact metrics, episode seed)."""
    x, y = tensor_leaves(a), tensor_leaves(b)
    assert x.keys() == y.keys(), (sorted(map(str, x)), sorted(map(str, y)))
    assert a.batch_size == b.batch_size
    for key, u in x.items():
        v = y[key]
        assert u.dtype == v.dtype and u.shape == v.shape, key
        assert u.numpy().tobytes() == v.numpy().tobytes(), key
    assert finished_episodes(a) == finished_episodes(b)


def obs_of(step: TensorDict) -> dict[str, torch.Tensor]:
    """A sampler's step's (or reset's) observations, ``[N, ...]`` tensors by key."""
    return dict(step["obs"].items())


def final_obs_of(step: TensorDict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The final observations of the episodes truncated in ``step`` (``[K, ...]`` by key) and
    their positions in the batch (``[K]`` int64): empty when none was truncated."""
    idx = step["truncated"].nonzero().squeeze(1)
    if "final_obs" not in step.keys():
        assert not len(idx), "a step with truncated episodes and no final_obs"
        return {}, idx
    return {k: v[idx] for k, v in step["final_obs"].items()}, idx
