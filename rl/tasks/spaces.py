"""Which observation and action spaces the framework trains on, and how they are flattened.

Observations reach samplers, storage and policies as one flat ``Dict`` of arrays, each entry
named by its key path in the task's own space:

============================  ==========================================================
task's space                  flat entries
============================  ==========================================================
``Box`` (any shape)           ``obs`` (a non-dict space), or the entry's own key
``Dict`` / ``Tuple`` (nested) ``a/b``, ``pos/0``, ... (``/``-joined keys and indices)
``Discrete``                  an ``int64`` scalar (policies one-hot encode it)
``MultiDiscrete``             an ``int64`` vector (one-hot per component)
``MultiBinary``               an ``int8`` vector (used as 0/1 features)
``Text``, ``Graph``, ...      refused before training, naming the task, the key path and
                              the space, and the wrapper that drops the entry
============================  ==========================================================

Actions: ``Discrete`` (a categorical policy), ``Box`` with a 1-D shape (a diagonal Gaussian;
environments receive the actions clipped to the bounds) and ``MultiDiscrete`` (independent
categoricals). Anything else is refused naming the task and the space.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.utils.config import ConfigError

__all__ = [
    "ObservationFlattener",
    "SpaceError",
    "action_array_spec",
    "check_action_space",
    "flat_observation_space",
    "to_env_actions",
]

SEP = "/"  # joins the key path of a nested entry
_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


class SpaceError(ConfigError):
    """A task's observation or action space holds something the framework cannot train on.

    A :class:`~rl.utils.config.ConfigError` (so a ``ValueError``): the task chosen cannot run,
    and ``train.py`` says so without a traceback, before the run folder is made.
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


def flat_observation_space(space: gym.Space, task: str = "?") -> gym.spaces.Dict:
    """The flat ``Dict`` space of ``space``'s entries, by key path (see the module docstring).

    Raises:
        SpaceError: An entry of an unsupported kind (naming ``task``, the key path, the space).
    """
    out: dict[str, gym.Space] = {}
    _walk(space, (), out, task)
    if isinstance(space, gym.spaces.Dict) and list(out) == list(space.spaces):
        return space  # flat already: the same object
    return gym.spaces.Dict(out)


class ObservationFlattener:
    """Turns one observation of ``space`` into the flat dict of :func:`flat_observation_space`.

    A flat ``Dict`` space passes through unchanged (no copy); a non-dict leaf becomes
    ``{"obs": x}``; nested ``Dict``/``Tuple`` observations are walked once per call.
    """

    def __init__(self, space: gym.Space, task: str = "?") -> None:
        self.space = flat_observation_space(space, task)
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
    """``space`` if policies can act in it (Discrete, 1-D Box, MultiDiscrete), else an error.

    ``agents``: the space is a multi-agent task's, stacked over that many agents
    (:mod:`rl.tasks.agents`); one agent's space is checked.

    Raises:
        SpaceError: Naming ``task`` and the space.
    """
    if agents is not None:
        from rl.tasks.agents import unstack_space  # (agents builds on this module's peers)

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
    """What environments receive for ``actions`` (``[N, ...]``).

    ``Box`` actions are clipped to the bounds and cast to the space's dtype; discrete actions
    pass as they are.
    """
    if isinstance(space, gym.spaces.Box):
        return np.clip(actions, space.low, space.high).astype(space.dtype, copy=False)
    return actions
