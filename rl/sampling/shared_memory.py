"""The shared-memory block of the multiprocess sampler: its layout and the arrays over it.

Every observation, final observation, reward, flag and action of a
:class:`~rl.sampling.MultiprocessSampler` lives in one ``multiprocessing.RawArray`` of bytes,
carved into ``[N, ...]`` numpy views (``N``: the sampler's environments). The parent plans the
layout (:func:`sampler_array_specs`, :meth:`SharedArrays.plan`) and every process builds the
same views from the block and the layout (:class:`SharedArrays`). Observation key ``k`` is
stored under :func:`obs_key` (``obs/k``) and its final observation under :func:`final_key`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.spaces import action_array_spec

__all__ = ["SharedArrays", "final_key", "obs_key", "sampler_array_specs"]

_ALIGN = 64  # byte alignment of each array in the shared block


def obs_key(key: str) -> str:
    """The shared array holding observation ``key``."""
    return f"obs/{key}"


def final_key(key: str) -> str:
    """The shared array holding the final observation ``key`` of truncated episodes."""
    return f"final/{key}"


def sampler_array_specs(
    observation_space: gym.spaces.Dict, num_envs: int, action_space: gym.Space | None = None
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The sampler's shared arrays, ``name -> (shape, dtype)``, for :meth:`SharedArrays.plan`.

    Args:
        observation_space: The environments' (dict) observation space.
        num_envs: Rows of every array (one per environment).
        action_space: The environments' action space (None: one int64 action per row).

    Returns:
        An observation and a final-observation array per observation key, then the actions,
        rewards, termination/truncation flags, expert actions and paused flags.
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
        expert_actions=((n,), np.int64),
        paused=((n,), np.bool_),
    )
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
