"""Any registered gymnasium environment as a task (``task=gym task.env_id=CartPole-v1``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import hydra.utils


def resolve_wrapper(path: str) -> Callable[[gym.Env], gym.Env]:
    """The wrapper a dotted path names (Hydra's own resolution of ``_target_`` strings)."""
    wrapper = hydra.utils.get_object(path)
    if not callable(wrapper):
        raise TypeError(f"{path!r} is not callable")
    return wrapper


def _wrapper_list(wrappers: Any) -> Sequence[Any]:
    """``wrappers`` if it is a list (None: none); a mapping or a string is a ``TypeError``."""
    if wrappers is None:
        return ()
    if isinstance(wrappers, Sequence) and not isinstance(wrappers, (str, bytes)):
        return wrappers
    raise TypeError(f"task.wrappers: expected a list of wrappers, got a {type(wrappers).__name__}")


def wrapper_errors(task: Mapping[str, Any]) -> list[str]:
    """Problems of a task config's ``wrappers`` (dotted paths that do not resolve, other types)."""
    errors = []
    try:
        wrappers = _wrapper_list(task.get("wrappers"))
    except TypeError as e:
        return [str(e)]
    for i, wrap in enumerate(wrappers):
        where = f"task.wrappers.{i}"
        if isinstance(wrap, str):
            try:
                resolve_wrapper(wrap)
            except Exception as e:  # noqa: BLE001  (any failure to import is the user's to see)
                errors.append(
                    f"{where}: cannot use {wrap!r} as a wrapper ({type(e).__name__}: {e})"
                )
        elif not isinstance(wrap, Mapping):
            errors.append(
                f"{where}: expected a dotted path or {{_target_: ..., _partial_: true}}, "
                f"got {wrap!r}"
            )
    return errors


def make_gym_env(
    *,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env] | str] | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """Build ``gymnasium.make(env_id, **env_kwargs)`` and apply ``wrappers`` in order.

    Args:
        env_id: A registered gymnasium id, e.g. ``CartPole-v1`` or ``rl/PointNav-v0``.
        env_kwargs: Keyword arguments for the environment's constructor.
        wrappers: Callables taking and returning an env, applied innermost first; in YAML,
            ``{_target_: gymnasium.wrappers.TimeLimit, _partial_: true, max_episode_steps: 200}``,
            or a dotted path for one that needs no arguments
            (``task.wrappers=[minigrid.wrappers.ImgObsWrapper]``).
        render_mode: Passed to ``gymnasium.make`` (``rgb_array`` for videos).
    """
    wrappers = _wrapper_list(wrappers)  # (before anything is built)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"task.env_id={env_id!r}: {e}") from e
    for wrap in wrappers:
        env = (resolve_wrapper(wrap) if isinstance(wrap, str) else wrap)(env)
    return env
