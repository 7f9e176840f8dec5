"""Observation transforms: a task's observation pipeline, configured in ``conf/``.

A task config's ``observations`` list (any task: :func:`rl.tasks.factory.build_env` applies it,
innermost first, after building the environment) holds partial wrappers, AllenAct's
preprocessors and habitat's observation transforms as gymnasium wrappers::

    observations:
      - {_target_: rl.tasks.observations.ResizeImages, _partial_: true, size: [48, 64]}
      - {_target_: rl.tasks.observations.StackFrames, _partial_: true, frames: 3}

They run where the environments run (in samplers and collection workers), so the rollout holds
what the policy sees. Depth on or off is the task's own switch (``task.depth`` for nav3d; a
policy can also be kept from an entry that losses still read: ``model.ignore_keys``), and
scaling is the policy encoder's (``image_encoding: scale``) or the collector's running
normalisation (``normalize.observations``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
from PIL import Image


def image_keys(space: gym.Space, keys: Sequence[str] | None, transform: str) -> list[str]:
    """The image entries (3-D ``Box``, ``H x W x C``) to transform: ``keys``, or all of them.

    Raises:
        ValueError: An entry named in ``keys`` is missing or not an image (naming ``transform``).
    """
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


class _DictObservationWrapper(gym.ObservationWrapper):
    """Transforms some entries of a dict observation, leaving the others as they are."""

    keys: list[str]

    def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
        """The observation with :meth:`transform` applied to each of :attr:`keys`."""
        return {k: self.transform(k, v) if k in self.keys else v for k, v in observation.items()}

    def transform(self, key: str, value: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


class ResizeImages(_DictObservationWrapper):
    """Resize image entries to ``size`` (``[height, width]``).

    Bilinear for ``uint8`` images (RGB), nearest for float images (depth: no mixed edges).

    Args:
        env: A task with a dict observation space.
        size: ``[height, width]`` after resizing.
        keys: The image entries to resize (None: every image entry).
    """

    def __init__(
        self, env: gym.Env, *, size: Sequence[int], keys: Sequence[str] | None = None
    ) -> None:
        super().__init__(env)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"ResizeImages: size must be [height, width], got {list(size)}")
        self.size = (int(size[0]), int(size[1]))
        space = env.observation_space
        self.keys = image_keys(space, keys, "ResizeImages")
        assert isinstance(space, gym.spaces.Dict)  # (image_keys raised otherwise)
        spaces = dict(space.spaces)
        for key in self.keys:
            old = cast(gym.spaces.Box, spaces[key])  # an image entry (image_keys)
            shape = (*self.size, old.shape[2])
            low, high = np.min(old.low), np.max(old.high)
            spaces[key] = gym.spaces.Box(low, high, shape, old.dtype)
        self.observation_space = gym.spaces.Dict(spaces)

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


class StackFrames(_DictObservationWrapper):
    """The last ``frames`` images of each entry, stacked along channels (``[H, W, C * k]``).

    The oldest frame comes first; at a reset every slot holds the first frame. The policy's CNN
    sees motion in one observation (what a memoryless policy needs; a GRU policy has memory of
    its own). Resume stays exact: samplers replay an episode's actions, which refills the stack.

    Args:
        env: A task with a dict observation space.
        frames: How many frames (k >= 1).
        keys: The image entries to stack (None: every image entry).
    """

    def __init__(self, env: gym.Env, *, frames: int, keys: Sequence[str] | None = None) -> None:
        super().__init__(env)
        if frames < 1:
            raise ValueError(f"StackFrames: frames must be >= 1, got {frames}")
        self.frames = int(frames)
        space = env.observation_space
        self.keys = image_keys(space, keys, "StackFrames")
        assert isinstance(space, gym.spaces.Dict)  # (image_keys raised otherwise)
        spaces = dict(space.spaces)
        for key in self.keys:
            old = cast(gym.spaces.Box, spaces[key])  # an image entry (image_keys)
            spaces[key] = gym.spaces.Box(
                np.concatenate([np.broadcast_to(old.low, old.shape)] * self.frames, axis=2),
                np.concatenate([np.broadcast_to(old.high, old.shape)] * self.frames, axis=2),
                dtype=old.dtype,
            )
        self.observation_space = gym.spaces.Dict(spaces)
        self._stacks: dict[str, deque[np.ndarray]] = {}

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
