"""MiniGrid environments (any ``MiniGrid-*`` id) as a task the nav CNN reads directly.

``task=minigrid task.env_id=MiniGrid-DoorKey-5x5-v0`` gives ``{"image": uint8 [7, 7, 3],
"direction": Discrete(4)}``: minigrid's egocentric view of object, colour and state indices, its
space declaring each channel's real maximum (10, 5, 2) so that ``image_encoding: onehot`` makes
20 one-hot channels, and the agent's heading. The ``mission`` text is left out (the framework
encodes no text; a task whose mission varies needs a wrapper that encodes it). An episode's
``success`` is whether it ended with a positive reward (minigrid rewards only reaching the goal),
logged as ``charts/success`` and ``eval/success``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rl.tasks.gym import make_gym_env

# Largest object, colour and state index of minigrid's image channels (OBJECT_TO_IDX,
# COLOR_TO_IDX, STATE_TO_IDX of minigrid.core.constants).
CHANNEL_MAXIMA = (10, 5, 2)


class MiniGridObservation(gym.Wrapper):
    """``image`` (channel maxima declared) and ``direction`` of a minigrid env; success metric."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Dict)  # minigrid's: image, direction, mission
        image = space["image"]
        assert isinstance(image, gym.spaces.Box)
        high = np.broadcast_to(np.asarray(CHANNEL_MAXIMA, np.uint8), image.shape).copy()
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, high, image.shape, np.uint8),
                "direction": space["direction"],
            }
        )

    def _observe(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        return {"image": obs["image"], "direction": obs["direction"]}

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset; the observation without the mission."""
        obs, info = self.env.reset(**kwargs)
        return self._observe(obs), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        """Step; at an episode's end ``episode_metrics["success"]`` (a positive reward)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {
                **info,
                "episode_metrics": {"success": float(terminated and float(reward) > 0)},
            }
        return self._observe(obs), reward, terminated, truncated, info


def make_minigrid_env(
    *,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """``gymnasium.make(env_id, **env_kwargs)`` of a minigrid id, as :class:`MiniGridObservation`.

    Raises:
        ValueError: ``env_id`` is not registered, or is not a minigrid environment (naming
            ``task.env_id``).
    """
    import minigrid  # noqa: F401  (registers the MiniGrid-* ids)

    env = make_gym_env(env_id=env_id, env_kwargs=env_kwargs, render_mode=render_mode)
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Dict) and {"image", "direction"} <= set(space.spaces)):
        env.close()
        raise ValueError(
            f"task.env_id={env_id!r}: not a minigrid environment (its observations are {space}); "
            "use task=gym for other environments"
        )
    return MiniGridObservation(env)
