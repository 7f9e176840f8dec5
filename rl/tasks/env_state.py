"""What an environment's next episode depends on, saved with each episode in flight.

Samplers save how each environment's episode in flight started (its seed, or its ``np_random``
state for an unseeded reset, and a task's own reset state) and replay the actions taken since
on resume: with these, a resumed run is exact. A saved episode may come from a shared file, so
:func:`checked_episodes` checks every value of it before anything is restored, and a saved
generator state names one of two NumPy bit generators, never any other attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.utils.finite import as_count

__all__ = [
    "checked_episodes",
    "generator_from_state",
    "np_random_state",
    "replay_episode",
    "reset_state",
]

# The bit generators whose state is plain integers (gymnasium's ``np_random`` is a PCG64).
_BIT_GENERATORS: dict[str, type[np.random.BitGenerator]] = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
}
_EPISODE_KEYS = frozenset({"seed", "np_random", "actions", "env_state"})


def np_random_state(env: gym.Env) -> dict[str, Any] | None:
    """The bit-generator state of ``env``'s ``np_random`` (None if it has none yet)."""
    rng = getattr(env.unwrapped, "_np_random", None)
    return None if rng is None else dict(rng.bit_generator.state)


def generator_from_state(state: Any) -> np.random.Generator:
    """A ``Generator`` in exactly ``state`` (:func:`np_random_state`'s).

    Raises:
        ValueError: ``state`` is not a PCG64 or PCG64DXSM state of integers in range.
    """
    name = state.get("bit_generator") if isinstance(state, Mapping) else None
    kind = _BIT_GENERATORS.get(name) if isinstance(name, str) else None
    inner = state.get("state") if kind is not None else None
    if not (
        kind is not None
        and set(state) == {"bit_generator", "state", "has_uint32", "uinteger"}
        and isinstance(inner, Mapping)
        and set(inner) == {"state", "inc"}
        and all(as_count(inner[k], 0, 2**128) is not None for k in ("state", "inc"))
        and as_count(state["has_uint32"], 0, 2) is not None
        and as_count(state["uinteger"], 0, 2**32) is not None
    ):
        raise ValueError(
            f"expected a PCG64 or PCG64DXSM state of integers in range, got {state!r:.60}"
        )
    bit_generator = kind()
    bit_generator.state = {**state, "state": dict(inner)}
    return np.random.Generator(bit_generator)


def reset_state(env: gym.Env) -> dict[str, Any] | None:
    """What ``env``'s next reset depends on besides its ``np_random`` (None: nothing).

    A task whose unseeded reset depends on state kept across episodes (e.g. a scene reused for
    several episodes) defines ``reset_state()`` (plain values) and ``set_reset_state(state)``
    on its unwrapped env; ``set_reset_state`` gets what a file holds, so it checks it (a
    ``ValueError``, ``TypeError`` or ``KeyError`` is reported naming the environment).
    """
    get = getattr(env.unwrapped, "reset_state", None)
    return None if get is None else get()


def _action_fits(space: gym.Space, action: Any) -> bool:
    """``action`` as saved (an int, or nested lists of numbers) is one of ``space``'s."""
    if isinstance(space, gym.spaces.Discrete):
        return as_count(action, int(space.start), int(space.start + space.n)) is not None
    try:
        array = np.asarray(action)
    except ValueError:  # ragged lists
        return False
    integral = np.issubdtype(space.dtype, np.integer)
    kinds = "iub" if integral else "iuf"
    return (
        array.dtype.kind in kinds
        and array.shape == space.shape
        and bool(space.contains(array.astype(space.dtype)))
    )


def checked_episodes(state: Any, num_envs: int, action_space: gym.Space) -> list[dict[str, Any]]:
    """A saved sampler state's ``episodes``: one per environment, each value checked.

    Each is a dict of ``seed`` (None or an int in ``[0, 2**64)``), ``np_random`` (None or
    a :func:`generator_from_state` state), ``actions`` (a list of ``action_space``'s actions)
    and, for a task that keeps state across episodes, ``env_state`` (a dict, the task's to
    check). Nothing is changed: call it before restoring anything.

    Raises:
        ValueError: A value of another kind, size or range, naming its place
            (``sampler state 'episodes'[2]['actions'][5]: ...``).
    """
    episodes = state.get("episodes") if isinstance(state, Mapping) else None
    if not isinstance(episodes, list) or len(episodes) != num_envs:
        raise ValueError(f"sampler state 'episodes': expected a list of {num_envs} episodes")
    for i, episode in enumerate(episodes):
        where = f"sampler state 'episodes'[{i}]"
        if not (
            isinstance(episode, dict)
            and {"seed", "np_random", "actions"} <= set(episode) <= _EPISODE_KEYS
        ):
            raise ValueError(f"{where}: expected a dict of seed, np_random, actions[, env_state]")
        seed = episode["seed"]
        if seed is not None and as_count(seed, 0, 2**64) is None:
            raise ValueError(f"{where}['seed']: expected None or an int in [0, 2**64)")
        if episode["np_random"] is not None:
            try:
                generator_from_state(episode["np_random"])
            except ValueError as e:
                raise ValueError(f"{where}['np_random']: {e}") from None
        if "env_state" in episode and not isinstance(episode["env_state"], dict):
            raise ValueError(f"{where}['env_state']: expected a dict")
        actions = episode["actions"]
        if not isinstance(actions, list):
            raise ValueError(f"{where}['actions']: expected a list")
        for t, action in enumerate(actions):
            if not _action_fits(action_space, action):
                raise ValueError(
                    f"{where}['actions'][{t}]: expected an action of {action_space}, "
                    f"got {action!r:.60}"
                )
    return episodes


def replay_episode(
    env: gym.Env, episode: Mapping[str, Any], action_space: gym.Space, name: str
) -> tuple[Any, dict[str, Any], float, int]:
    """Start ``episode`` (one of :func:`checked_episodes`') again and replay its actions.

    Returns the last observation and ``info``, the return and the length so far.

    Raises:
        ValueError: The task refused the saved ``env_state``.
        RuntimeError: Replaying ended the episode (an environment not deterministic given its
            seed and ``np_random``).
    """
    if "env_state" in episode:
        try:
            env.unwrapped.set_reset_state(episode["env_state"])  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{name}: its saved 'env_state' was refused: {e!r}") from e
    seed = episode["seed"]
    if seed is None and episode["np_random"] is not None:
        env.unwrapped.np_random = generator_from_state(episode["np_random"])
    obs, info = env.reset(seed=seed)
    discrete = isinstance(action_space, gym.spaces.Discrete)
    returned, actions = 0.0, episode["actions"]
    for t, action in enumerate(actions):
        taken = action if discrete else np.asarray(action, dtype=action_space.dtype)
        obs, reward, terminated, truncated, info = env.step(taken)
        returned += float(reward)
        if terminated or truncated:
            raise RuntimeError(
                f"{name}: replaying its saved episode ended it after {t + 1} of {len(actions)} "
                "actions; the environment is not deterministic given its seed and np_random"
            )
    return obs, info, returned, len(actions)
