"""Building a model from its config for given observation and action spaces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import hydra.utils

from rl.models.actor_critic import ActorCritic


def build_model(
    model_cfg: Mapping[str, Any], observation_space: gym.spaces.Dict, action_space: gym.Space
) -> ActorCritic:
    """Instantiate a model config (a ``_partial_`` ``_target_``) for the given spaces.

    Callers get the spaces of a task with :func:`rl.tasks.task_spaces`:
    ``build_model(cfg["model"], *task_spaces(cfg["task"]))``.
    """
    return hydra.utils.instantiate(dict(model_cfg))(  # type: ignore[no-any-return]
        observation_space=observation_space, action_space=action_space
    )
