"""Observation transforms: partial gymnasium wrappers a task config's ``observations`` lists.

:func:`rl.tasks.factory.build_env` applies them in order, innermost first, where the
environments run, so the rollout holds what the policy sees::

    observations:
      - {_target_: rl.tasks.observations.ResizeImages, _partial_: true, size: [48, 64]}
      - {_target_: rl.tasks.observations.StackFrames, _partial_: true, frames: 3}
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from PIL import Image


def image_keys(space: gym.Space, keys: Sequence[str] | None, transform: str) -> list[str]:
    """The image entries (3-D ``Box``, ``H x W x C``) to transform: ``keys``, or all of them."""
    if not isinstance(space, gym.spaces.Dict):
        raise ValueError(f"{transform}: needs a dict observation space, got {space}")
    images = [
        k for k, s in space.spaces.items() if isinstance(s, gym.spaces.Box) and len(s.shape) == 3
    ]
    if keys is None:
        if not images:
            raise ValueError(f"{transform}: the task has no image observation ({list(space)})")
        return images
    bad = [k for k in keys if k not in images]
    if bad:
        raise ValueError(
            f"{transform}: keys {bad} are not image entries of the task (images: {images})"
        )
    return list(keys)


class _ImageWrapper(gym.ObservationWrapper):
    """Transforms the image entries ``keys`` of a dict observation (None: every image entry)."""

    def __init__(self, env: gym.Env, keys: Sequence[str] | None) -> None:
        super().__init__(env)
        self.keys = image_keys(env.observation_space, keys, type(self).__name__)
        spaces = dict(env.observation_space.spaces)  # type: ignore[attr-defined]  # (a Dict)
        for key in self.keys:
            spaces[key] = self.image_space(spaces[key])
        self.observation_space = gym.spaces.Dict(spaces)

    def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
        """The observation with :meth:`transform` applied to each of :attr:`keys`."""
        return {k: self.transform(k, v) if k in self.keys else v for k, v in observation.items()}

    def image_space(self, space: gym.spaces.Box) -> gym.spaces.Box:  # pragma: no cover
        """The space of a transformed image entry of ``space``."""
        raise NotImplementedError

    def transform(self, key: str, value: np.ndarray) -> np.ndarray:  # pragma: no cover
        """Image entry ``key`` transformed."""
        raise NotImplementedError


class ResizeImages(_ImageWrapper):
    """Resize image entries to ``size`` (``[height, width]``).

    Bilinear for ``uint8`` images (RGB), nearest for float images (depth: no mixed edges).

    Args:
        size: ``[height, width]`` after resizing.
        keys: The image entries to resize (None: every image entry).
    """

    def __init__(
        self, env: gym.Env, *, size: Sequence[int], keys: Sequence[str] | None = None
    ) -> None:
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"ResizeImages: size must be [height, width], got {list(size)}")
        self.size = (int(size[0]), int(size[1]))
        super().__init__(env, keys)

    def image_space(self, space: gym.spaces.Box) -> gym.spaces.Box:
        """``[height, width, C]``, bounds of the whole image."""
        shape = (*self.size, space.shape[2])
        return gym.spaces.Box(np.min(space.low), np.max(space.high), shape, space.dtype)

    def transform(self, key: str, value: np.ndarray) -> np.ndarray:
        """``value`` ``[H, W, C]`` resized to ``[height, width, C]``."""
        height, width = self.size
        if value.dtype == np.uint8:
            image = Image.fromarray(value if value.shape[2] != 1 else value[..., 0])
            out = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))
            return out.reshape(height, width, value.shape[2])
        rows = (np.arange(height) * value.shape[0] // height)[:, None]
        cols = (np.arange(width) * value.shape[1] // width)[None, :]
        return np.ascontiguousarray(value[rows, cols])


class StackFrames(_ImageWrapper):
    """The last ``frames`` images of each entry, stacked along channels (``[H, W, C * k]``).

    The oldest frame comes first; at a reset every slot holds the first frame. Resume stays
    exact: samplers replay an episode's actions, which refills the stack.

    Args:
        frames: How many frames (k >= 1).
        keys: The image entries to stack (None: every image entry).
    """

    def __init__(self, env: gym.Env, *, frames: int, keys: Sequence[str] | None = None) -> None:
        if frames < 1:
            raise ValueError(f"StackFrames: frames must be >= 1, got {frames}")
        self.frames = int(frames)
        super().__init__(env, keys)
        self._stacks: dict[str, deque[np.ndarray]] = {}

    def image_space(self, space: gym.spaces.Box) -> gym.spaces.Box:
        """The bounds repeated ``frames`` times along channels."""
        return gym.spaces.Box(
            np.concatenate([np.broadcast_to(space.low, space.shape)] * self.frames, axis=2),
            np.concatenate([np.broadcast_to(space.high, space.shape)] * self.frames, axis=2),
            dtype=space.dtype,
        )

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset; every slot of each stack holds the first frame."""
        obs, info = self.env.reset(**kwargs)
        self._stacks = {k: deque([obs[k]] * self.frames, maxlen=self.frames) for k in self.keys}
        return self.observation(obs), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        """Step; the new frame of each entry joins its stack."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        for key in self.keys:
            self._stacks[key].append(obs[key])
        return self.observation(obs), reward, terminated, truncated, info

    def transform(self, key: str, value: np.ndarray) -> np.ndarray:
        """The stack of ``key``, oldest first, concatenated along channels."""
        return np.concatenate(list(self._stacks[key]), axis=2)
