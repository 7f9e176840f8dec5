"""Use a trained policy outside the engine: one environment, one observation at a time.

.. code-block:: python

    agent = InferenceAgent.from_checkpoint("outputs/ppo_nav/<time>/checkpoints/<file>.pt")
    obs, _ = env.reset(seed=0)
    agent.reset()
    while True:
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
        if terminated or truncated:
            break

The agent keeps the recurrent state between calls and resets it at :meth:`InferenceAgent.reset`
(call it at every episode start), exactly as the engine does, so argmax actions match the
engine's ``model.act(..., deterministic=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rl.checkpoints.files import CheckpointError, load_checkpoint
from rl.models.actor_critic import ActorCritic
from rl.models.factory import build_model
from rl.tasks.factory import build_env, dict_space


class InferenceAgent:
    """A policy that acts on single observations, with its recurrent state handled.

    Args:
        model: The actor-critic (its weights are used as they are).
        observation_space: The environment's observation space (a Dict space, or any space
            whose observations are then given as ``{"obs": ...}`` to the model).
        device: Where the model runs.
        deterministic: Argmax actions (True) or actions sampled with a seeded generator.
        seed: Seed of the action-sampling generator (sampled mode).
    """

    def __init__(
        self,
        *,
        model: ActorCritic,
        observation_space: gym.Space,
        device: torch.device | str = "cpu",
        deterministic: bool = True,
        seed: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self._dict_obs = isinstance(observation_space, gym.spaces.Dict)
        spaces = (
            observation_space.spaces if self._dict_obs else {"obs": observation_space}  # type: ignore[attr-defined]
        )
        self._dtypes = {k: s.dtype for k, s in spaces.items()}
        self.deterministic = deterministic
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.reset()

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: torch.device | str = "cpu",
        deterministic: bool = True,
        seed: int = 0,
        trusted_targets: Sequence[str] = (),
    ) -> InferenceAgent:
        """Build the agent from a training checkpoint (loaded with ``weights_only=True``).

        The model and the task's observation space are rebuilt from the config saved in the
        checkpoint.

        Args:
            path: A checkpoint file.
            device: Where the model runs.
            deterministic: Argmax actions (True) or seeded sampled ones.
            seed: Seed of the action-sampling generator.
            trusted_targets: Patterns of callables the saved config may name beyond the
                defaults (:mod:`rl.checkpoints.trust`).

        Returns:
            The agent, reset for a first episode.
        """
        state = load_checkpoint(path, trusted_targets=trusted_targets)
        config = state["config"]
        env = build_env(config["task"])
        try:  # the environment's own observation space: the agent takes what it returns
            space, action_space = env.observation_space, env.action_space
        finally:
            env.close()
        model = build_model(config["model"], dict_space(space), action_space)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise CheckpointError(
                f"{path}: its weights do not fit the model its config describes: "
                f"{next(iter(str(e).splitlines()), '')}"
            ) from e
        return cls(
            model=model,
            observation_space=space,
            device=device,
            deterministic=deterministic,
            seed=seed,
        )

    def reset(self) -> None:
        """Start a new episode: zero the recurrent state."""
        self._hidden = self.model.initial_hidden(1, self.device)
        self._episode_start = True

    @torch.no_grad()
    def act(self, observation: Mapping[str, Any] | np.ndarray) -> int:
        """The action for one observation, as the environment returned it.

        Args:
            observation: A dict of arrays (Dict spaces) or an array.

        Returns:
            The action index.
        """
        obs = dict(observation) if self._dict_obs else {"obs": observation}  # type: ignore[arg-type]
        batch = {
            k: torch.from_numpy(np.asarray(obs[k], dtype=dtype)[None]).to(self.device)
            for k, dtype in self._dtypes.items()
        }
        starts = torch.tensor([self._episode_start], device=self.device)
        actions, _, _, _, self._hidden = self.model.act(
            batch, starts, self._hidden, self.deterministic, self.generator
        )
        self._episode_start = False
        return int(actions[0])
