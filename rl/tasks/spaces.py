"""Which observation and action spaces the framework trains on, and how they are flattened.

Observations reach samplers, storage and policies as one flat ``Dict`` of arrays: a non-dict
space is the entry ``obs``, the leaves of nested ``Dict``/``Tuple`` spaces are named by their
``/``-joined key path. Anything else (docs/concepts/policies.md, "Supported spaces") is refused
before training, naming the task, the key path and the space.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.agents import unstack_space
from rl.utils.config import ConfigError

__all__ = [
    "ObservationFlattener",
    "SpaceError",
    "action_array_spec",
    "check_action_space",
    "dict_space",
    "to_env_actions",
]

SEP = "/"  # joins the key path of a nested entry
_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


class SpaceError(ConfigError):
    """A task's observation or action space holds something the framework cannot train on.

    A :class:`~rl.utils.config.ConfigError`: ``train.py`` says so without a traceback.
    """


def _walk(space: gym.Space, path: tuple[str, ...], out: dict[str, gym.Space], task: str) -> None:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _walk(sub, (*path, str(key)), out, task)
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _walk(sub, (*path, str(i)), out, task)
    elif isinstance(space, _LEAVES):
        out[SEP.join(path) or "obs"] = space
    else:
        where = SEP.join(path) or "(the whole observation)"
        raise SpaceError(
            f"task {task}: observation entry {where!r} is {space}, which policies cannot "
            "encode (supported: Box, Discrete, MultiDiscrete, MultiBinary, nested in Dict and "
            "Tuple); drop it with a wrapper in task.wrappers, e.g. "
            "gymnasium.wrappers.FilterObservation (keep the other keys); for MiniGrid use "
            "task=minigrid, which leaves out the 'mission' text"
        )


def dict_space(space: gym.Space, task: str = "?") -> gym.spaces.Dict:
    """``space`` as the flat ``Dict`` samplers and policies see (a flat one: the same object).

    Raises:
        SpaceError: An entry of a kind policies cannot encode, naming ``task``.
    """
    out: dict[str, gym.Space] = {}
    _walk(space, (), out, task)
    if isinstance(space, gym.spaces.Dict) and list(out) == list(space.spaces):
        return space
    return gym.spaces.Dict(out)


class ObservationFlattener:
    """Turns one observation of ``space`` into the flat dict of :func:`dict_space` (no copy)."""

    def __init__(self, space: gym.Space, task: str = "?") -> None:
        self.space = dict_space(space, task)
        self._fn: Callable[[Any], dict[str, Any]]
        if self.space is space:
            self._fn = _identity
        elif isinstance(space, _LEAVES):
            self._fn = _wrap_leaf
        else:
            self._fn = _flatten_nested

    def __call__(self, obs: Any) -> dict[str, Any]:
        """The flat dict of ``obs``."""
        return self._fn(obs)


def _identity(obs: Any) -> dict[str, Any]:
    return obs


def _wrap_leaf(obs: Any) -> dict[str, Any]:
    return {"obs": obs}


def _flatten_nested(obs: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = obs.items() if isinstance(obs, Mapping) else enumerate(obs)
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, Mapping | tuple):
            out.update(_flatten_nested(value, path + SEP))
        else:
            out[path] = value
    return out


def check_action_space(space: gym.Space, task: str = "?", agents: int | None = None) -> gym.Space:
    """``space`` if policies can act in it, else a :class:`SpaceError` naming ``task``.

    ``agents``: the space is stacked over that many agents (:mod:`rl.tasks.agents`).
    """
    if agents is not None:
        try:
            check_action_space(unstack_space(space), task)
        except ValueError as e:
            raise SpaceError(f"task {task}: {e}") from e
        return space
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim != 1:
            raise SpaceError(f"task {task}: MultiDiscrete actions need a 1-D nvec, got {space}")
        return space
    if isinstance(space, gym.spaces.Box):
        if len(space.shape) != 1:
            raise SpaceError(
                f"task {task}: Box actions need a 1-D shape, got {space} (reshape them in a "
                "gymnasium.ActionWrapper)"
            )
        if not np.issubdtype(space.dtype, np.floating):
            raise SpaceError(f"task {task}: Box actions must be floating point, got {space}")
        return space
    raise SpaceError(
        f"task {task}: action space {space} is not supported (Discrete, Box with a 1-D shape, "
        "MultiDiscrete)"
    )


def action_array_spec(space: gym.Space) -> tuple[tuple[int, ...], Any]:
    """``(shape per environment, numpy dtype)`` of the actions a sampler receives."""
    if isinstance(space, gym.spaces.Discrete):
        return (), np.int64
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.nvec.shape), np.int64
    assert space.shape is not None  # a Box (check_action_space)
    return tuple(space.shape), np.float32


def to_env_actions(space: gym.Space, actions: np.ndarray) -> np.ndarray:
    """What environments receive for ``actions`` ``[N, ...]``: ``Box`` ones clipped and cast."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(actions, space.low, space.high).astype(space.dtype, copy=False)
    return actions
