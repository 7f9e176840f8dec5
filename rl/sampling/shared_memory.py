"""The shared-memory block of the multiprocess sampler: its layout and the arrays over it.

Every observation, final observation, reward, flag and action of a
:class:`~rl.sampling.MultiprocessSampler` lives in one ``multiprocessing.RawArray`` of bytes,
carved into ``[N, ...]`` numpy views (``N``: the sampler's environments). The parent plans the
layout (:func:`sampler_array_specs`, :meth:`SharedArrays.plan`) and every process builds the
same views from the block and the layout (:class:`SharedArrays`). Arrays are named by the
step ``TensorDict``'s keys (:func:`~rl.sampling.base.step_tensordict`): observation key ``k``
is ``obs/k`` (:func:`obs_key`), its final observation ``final_obs/k`` (:func:`final_key`), a
task's step field its own name; :func:`step_key` turns a name back into the nested key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.fields import StepField
from rl.tasks.spaces import action_array_spec

__all__ = ["SharedArrays", "final_key", "obs_key", "sampler_array_specs", "step_key"]

_ALIGN = 64  # byte alignment of each array in the shared block


def obs_key(key: str) -> str:
    """The shared array holding observation ``key``."""
    return f"obs/{key}"


def final_key(key: str) -> str:
    """The shared array holding the final observation ``key`` of truncated episodes."""
    return f"final_obs/{key}"


def step_key(name: str) -> str | tuple[str, str]:
    """The step ``TensorDict`` key of shared array ``name`` (``obs/k`` -> ``("obs", "k")``)."""
    head, sep, tail = name.partition("/")
    return (head, tail) if sep else name


def sampler_array_specs(
    observation_space: gym.spaces.Dict,
    num_envs: int,
    action_space: gym.Space | None = None,
    step_fields: Mapping[str, StepField] | None = None,
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The sampler's shared arrays, ``name -> (shape, dtype)``, for :meth:`SharedArrays.plan`.

    Args:
        observation_space: The environments' (dict) observation space.
        num_envs: Rows of every array (one per environment).
        action_space: The environments' action space (None: one int64 action per row).
        step_fields: The task's step fields (:mod:`rl.tasks.fields`).

    Returns:
        An observation and a final-observation array per observation key, then the actions,
        rewards, termination/truncation and paused flags, then an array per step field.
    """
    n = num_envs
    action_shape, action_dtype = ((), np.int64)
    if action_space is not None:
        action_shape, action_dtype = action_array_spec(action_space)
    specs: dict[str, tuple[tuple[int, ...], Any]] = {}
    for key, space in observation_space.spaces.items():
        specs[obs_key(key)] = ((n, *space.shape), space.dtype)
        specs[final_key(key)] = ((n, *space.shape), space.dtype)
    specs.update(
        actions=((n, *action_shape), action_dtype),
        rewards=((n,), np.float32),
        terminated=((n,), np.bool_),
        truncated=((n,), np.bool_),
        paused=((n,), np.bool_),
    )
    for key, field in (step_fields or {}).items():
        specs[key] = ((n, *field.shape), field.dtype)
    return specs


class SharedArrays:
    """Numpy arrays carved out of one shared byte block (same layout in every process).

    Args:
        raw: The shared block (a ``RawArray`` of bytes).
        layout: ``name -> (offset, shape, dtype string)``.
    """

    def __init__(self, raw: Any, layout: Mapping[str, tuple[int, tuple[int, ...], str]]) -> None:
        self.raw = raw
        self.layout = dict(layout)
        buffer = np.frombuffer(raw, dtype=np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        for name, (offset, shape, dtype) in self.layout.items():
            dt = np.dtype(dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.arrays[name] = buffer[offset : offset + size].view(dt).reshape(shape)

    @staticmethod
    def plan(specs: Mapping[str, tuple[tuple[int, ...], Any]]) -> tuple[dict[str, Any], int]:
        """Lay out ``name -> (shape, dtype)`` arrays; return the layout and the total bytes."""
        layout: dict[str, tuple[int, tuple[int, ...], str]] = {}
        offset = 0
        for name, (shape, dtype) in specs.items():
            dt = np.dtype(dtype)
            layout[name] = (offset, tuple(int(s) for s in shape), dt.str)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            offset += -(-size // _ALIGN) * _ALIGN
        return layout, max(offset, _ALIGN)
