"""What an environment's next episode depends on, saved with each episode in flight.

Samplers save how each environment's episode in flight started (its seed, or its ``np_random``
state for an unseeded reset, and a task's own reset state) and replay the actions taken since
on resume: with these, a resumed run is exact.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["np_random_state", "reset_state", "set_np_random_state"]


def np_random_state(env: gym.Env) -> dict[str, Any] | None:
    """The bit-generator state of ``env``'s ``np_random`` (None if it has none yet)."""
    rng = getattr(env.unwrapped, "_np_random", None)
    return None if rng is None else dict(rng.bit_generator.state)


def set_np_random_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Give ``env`` an ``np_random`` in exactly ``state`` (from :func:`np_random_state`)."""
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    env.unwrapped.np_random = np.random.Generator(bit_generator)


def reset_state(env: gym.Env) -> dict[str, Any] | None:
    """What ``env``'s next reset depends on besides its ``np_random`` (None: nothing).

    A task whose unseeded reset depends on state kept across episodes (e.g. a scene reused for
    several episodes) defines ``reset_state()`` (plain values) and ``set_reset_state(state)``
    on its unwrapped env.
    """
    get = getattr(env.unwrapped, "reset_state", None)
    return None if get is None else get()
