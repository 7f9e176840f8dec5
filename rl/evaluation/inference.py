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
(at every episode start), as the engine does, so its argmax actions are the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rl.checkpoints.files import CheckpointError, checkpoint_file, load_checkpoint
from rl.checkpoints.saved_config import ConfigTree, rebuild_config
from rl.collection.episodes import policy_step
from rl.collection.normalization import Normalizer
from rl.models.policy import Policy, build_policy
from rl.tasks.factory import build_env, dict_space
from rl.tasks.spaces import ObservationFlattener, to_env_actions
from rl.utils.saved import checked_weights


def _tree(config_dir: str | Path | None, searchpath: Sequence[str] | None) -> ConfigTree:
    """The config tree a checkpoint is rebuilt on: as given, else this invocation's."""
    current = ConfigTree.current()
    if config_dir is None and searchpath is None:
        return current
    return ConfigTree(
        config_dir,
        searchpath=tuple(current.searchpath if searchpath is None else searchpath),
    )


def load_trained_policy(
    state: Mapping[str, Any],
    where: str | Path,
    spaces: tuple[gym.spaces.Dict, gym.Space],
    *,
    model: Policy | None = None,
    model_config: Mapping[str, Any] | None = None,
    device: torch.device | str,
    groups: Sequence[Any] | None = None,
) -> tuple[Policy, Normalizer | None]:
    """A loaded checkpoint's policy with its weights, and its observation normalisation (frozen).

    ``model`` is reused (it stays where it is), else built from ``model_config`` for ``spaces``
    (flat observation space, action space) and ``groups`` (the task's agents) on ``device``.

    Raises:
        CheckpointError: The weights do not fit the model, or the statistics are malformed
            (naming ``where``).
    """
    if model is None:
        if model_config is None:
            raise ValueError("load_trained_policy: give the model or its config")
        model = build_policy(dict(model_config), *spaces, groups=groups).to(device)
    try:
        model.load_state_dict(checked_weights(state["model"], model, "model"))
    except (KeyError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{where}: its weights do not fit the model its config describes: "
            f"{next(iter(str(e).splitlines()), '')}"
        ) from e
    try:
        normalizer = Normalizer.from_state(spaces[0], state.get("normalizer"))
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from e
    return model, normalizer


class InferenceAgent:
    """A policy that acts on single observations, with its recurrent state handled.

    Args:
        observation_space: The environment's (flattened for the policy as samplers flatten it).
        action_space: The environment's (``Box`` actions are clipped to its bounds; None:
            actions as the policy draws them).
        normalizer: The training run's observation normalisation, applied frozen.
        device: Where the model runs (the CPU by default: this is the deployment API).
        deterministic: Argmax actions, or actions sampled with a generator seeded by ``seed``.
    """

    def __init__(
        self,
        *,
        model: Policy,
        observation_space: gym.Space,
        action_space: gym.Space | None = None,
        normalizer: Normalizer | None = None,
        device: torch.device | str = "cpu",
        deterministic: bool = True,
        seed: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self._flatten = ObservationFlattener(observation_space)
        self._dtypes = {k: s.dtype for k, s in self._flatten.space.spaces.items()}
        self.action_space = action_space
        self.normalizer = normalizer
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
        config_dir: str | Path | None = None,
        searchpath: Sequence[str] | None = None,
    ) -> InferenceAgent:
        """Build the agent from a training checkpoint (loaded with ``weights_only=True``).

        The model and the task are built from the checkpoint's config rebuilt on your config
        tree (:mod:`rl.checkpoints.saved_config`): nothing the file names is imported unless
        your tree names it there, or ``trusted_targets`` allows it.

        Args:
            path: A checkpoint file, a run's ``checkpoints/latest`` pointer or a run folder
                (both: the run's newest checkpoint).
            device: Where the model runs.
            deterministic: Argmax or seeded sampled actions.
            seed: Seed of the action-sampling generator.
            trusted_targets: Patterns of callables the saved config may name where your
                config tree names others (:mod:`rl.checkpoints.trust`).
            config_dir: Your config tree's folder (default: the running Hydra app's, else
                this project's ``conf/``).
            searchpath: Your own config folders or packages on Hydra's search path
                (``["file:///home/me/my_conf"]``, as ``hydra.searchpath`` takes them; None: the
                running or last composed Hydra config's).
        """
        path = checkpoint_file(path)
        state = load_checkpoint(path)
        config = rebuild_config(
            state["config"],
            state["choices"],
            str(path),
            trusted_targets=trusted_targets,
            tree=_tree(config_dir, searchpath),
            built=("task", "model"),
            sources=state["config_sources"],
        ).config
        env = build_env(config["task"])
        try:  # the environment's own observation space: the agent takes what it returns
            space, action_space = env.observation_space, env.action_space
        finally:
            env.close()
        model, normalizer = load_trained_policy(
            state,
            path,
            (dict_space(space), action_space),
            model_config=config["model"],
            device=device,
        )
        return cls(
            model=model,
            observation_space=space,
            action_space=action_space,
            normalizer=normalizer,
            device=device,
            deterministic=deterministic,
            seed=seed,
        )

    @property
    def observation_space(self) -> gym.spaces.Dict:
        """The policy's flat observation space (the environment's, flattened)."""
        return self._flatten.space

    def reset(self) -> None:
        """Start a new episode: the policy's initial state."""
        self._state = self.model.initial_state(1, self.device)
        self._episode_start = True

    @torch.no_grad()
    def act(self, observation: Mapping[str, Any] | np.ndarray | tuple[Any, ...]) -> Any:
        """The action for what the environment returned, in the form it takes.

        An ``int`` (``Discrete``), an array clipped to the bounds (``Box``) or an int64 array
        (``MultiDiscrete``); the agent keeps the recurrent state.
        """
        action, self._state = self.predict(observation, self._state, self._episode_start)
        self._episode_start = False
        return action

    def predict(
        self,
        observation: Mapping[str, Any] | np.ndarray | tuple[Any, ...],
        state: TensorDict | None = None,
        episode_start: bool = False,
    ) -> tuple[Any, TensorDict]:
        """``(action, state after it)`` for one observation; the caller holds the state.

        stable-baselines3's ``predict(observation, state, episode_start)``: for several agents
        or episodes interleaved, keep one state each (None, or ``episode_start``: a new
        episode's). The action is as :meth:`act` returns it.
        """
        return self.predict_flat(self._flatten(observation), state, episode_start)

    def predict_flat(
        self, obs: Mapping[str, Any], state: TensorDict | None = None, episode_start: bool = False
    ) -> tuple[Any, TensorDict]:
        """:meth:`predict` for a flat observation (:attr:`observation_space`'s entries)."""
        batch = {
            k: torch.from_numpy(np.asarray(obs[k], dtype=dtype)[None]).to(self.device)
            for k, dtype in self._dtypes.items()
        }
        if state is None:
            state, episode_start = self.model.initial_state(1, self.device), True
        starts = torch.tensor([episode_start], device=self.device)
        actions, state = policy_step(
            self.model, batch, starts, state, deterministic=self.deterministic,
            generator=self.generator, normalizer=self.normalizer,
        )  # fmt: skip
        action = actions[0].cpu().numpy()
        if action.ndim == 0:
            return int(action), state
        if self.action_space is not None:
            return to_env_actions(self.action_space, action), state
        return action, state
