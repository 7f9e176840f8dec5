"""The reference sampler: every environment stepped in a loop in this process.

The other samplers must return bitwise what this one does for the same seeds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
from tensordict import TensorDict

from rl.sampling.base import (
    MAX_NUM_ENVS,
    EpisodeRecord,
    Sampler,
    check_state_layout,
    split_episode_seeds,
    step_tensordict,
)
from rl.sampling.finite_checks import FiniteChecks, is_float
from rl.sampling.watchdog import DEFAULT_TIMEOUT_S, Watchdog
from rl.tasks.agents import num_agents
from rl.tasks.env_state import checked_episodes, np_random_state, replay_episode, reset_state
from rl.tasks.factory import build_env, env_name, episode_metrics
from rl.tasks.fields import step_fields_of
from rl.tasks.spaces import (
    ObservationFlattener,
    action_array_spec,
    check_action_space,
    to_env_actions,
)
from rl.utils.config import Check
from rl.utils.seeding import env_seeds


def _scatter_rows(rows: np.ndarray, positions: list[int], like: np.ndarray) -> np.ndarray:
    """``rows`` at ``positions`` of an array of zeros shaped and typed like ``like``."""
    out = np.zeros_like(like)
    out[positions] = rows
    return out


class SerialSampler(FiniteChecks, Sampler):
    """Steps ``num_envs`` environments one after the other.

    Each step's rewards and float observations must be finite (else a
    :class:`~rl.utils.finite.NonFiniteError` naming the environment, step and field).

    Args:
        task: Plain (resolved) task config with a ``_target_`` returning a ``gymnasium.Env``.
        num_envs: Number of environments.
        seed: Environment ``i``'s first reset has seed ``env_seeds(total_envs, seed)[i]``
            (``i`` global: counted from ``env_offset``).
        episode_seeds: Evaluation mode: fixed episode seeds, split into contiguous shares (one
            per environment); an environment that has run its share is paused.
        env_offset: Global index of this sampler's first environment.
        total_envs: Size of the global seed stream (default ``env_offset + num_envs``).
        timeout: Seconds one ``reset`` or ``step`` of all the environments may take before a
            :class:`~rl.sampling.watchdog.SamplerTimeoutError` (warning at half; None: wait
            forever).
    """

    def __init__(
        self,
        *,
        task: Mapping[str, Any],
        num_envs: Annotated[int, Check(ge=1, le=MAX_NUM_ENVS)],
        seed: int | None = 0,
        episode_seeds: Sequence[int] | None = None,
        env_offset: int = 0,
        total_envs: int | None = None,
        timeout: Annotated[float | None, Check(gt=0)] = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._closed = False
        self.envs: list[gym.Env] = []
        self._watchdog: Watchdog | None = None
        if num_envs < 1:
            raise ValueError(f"sampler.num_envs must be >= 1, got {num_envs}")
        self.eval_mode = episode_seeds is not None
        if episode_seeds is not None:
            self._episode_lists = split_episode_seeds(episode_seeds, num_envs)
            self._queues = [list(share) for share in self._episode_lists]
            num_envs = len(self._episode_lists)
        self.num_envs = num_envs
        self.env_offset = env_offset
        total = env_offset + num_envs if total_envs is None else total_envs
        self._seeds = env_seeds(total, seed)[env_offset : env_offset + num_envs]
        self._timeout = timeout
        try:
            for _ in range(num_envs):
                self.envs.append(build_env(task))
            first = self.envs[0]
            name = env_name(task, first)
            self._name = name
            self._flatten = ObservationFlattener(first.observation_space, name)
            self.step_fields = step_fields_of(task, first, name)
            self.action_space = check_action_space(
                first.action_space, name, num_agents(self.step_fields)
            )
            self._transition_fields = any(f.transition for f in self.step_fields.values())
        except Exception:
            self.close()
            raise
        self._dict_obs = isinstance(first.observation_space, gym.spaces.Dict | gym.spaces.Tuple)
        self.observation_space = self._flatten.space
        self._action_shape, _ = action_array_spec(self.action_space)
        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._active = list(range(num_envs))
        # Python numbers, not arrays: the hot loop updates them one environment at a time
        self._returns: list[float] = [0.0] * num_envs
        self._lengths: list[int] = [0] * num_envs
        self._current_seed: list[int | None] = [None] * num_envs
        self._float_keys = [
            k for k, space in self.observation_space.spaces.items() if is_float(space.dtype)
        ]
        # How each current episode started and its actions since, to save and replay it.
        self._episode_start: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._episode_actions: list[list[Any]] = [[] for _ in range(num_envs)]
        # Global index of the environment being reset or stepped (None between calls): a
        # caller catching an environment's exception names it.
        self.current_env: int | None = None

    def _fields(
        self,
        infos: Sequence[Mapping[str, Any]],
        step_infos: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, np.ndarray]:
        """The task's step fields ``[N, ...]`` from each environment's ``info``.

        ``infos`` came with the observations (a reset's after an episode ended); ``step_infos``
        with the steps, for ``transition`` fields (None after a reset: their ``missing`` value).
        """
        out = {}
        for key, field in self.step_fields.items():
            name = field.info
            missing = field.empty(1)[0] if field.shape else field.missing
            source = infos
            if field.transition:
                source = step_infos if step_infos is not None else [{}] * len(infos)
            try:
                out[key] = np.asarray(
                    [info.get(name, missing) for info in source], dtype=field.dtype
                ).reshape(len(infos), *field.shape)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"{self._name}: step field {key!r} (info[{name!r}]) is not a "
                    f"{field.dtype} of shape {field.shape}: {e}"
                ) from e
        return out

    def _stack(self, rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        out = {}
        for key, space in self.observation_space.spaces.items():
            # np.array, not np.stack: a third of the time for small arrays
            out[key] = np.array([r[key] for r in rows], dtype=space.dtype)
        return out

    def _reset_env(self, i: int, first: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.eval_mode:
            seed: int | None = self._queues[i].pop(0)
            self._current_seed[i] = seed
        else:
            seed = self._seeds[i] if first else None
        self.current_env = self.env_offset + i
        self._episode_start[i] = {"seed": seed, "np_random": np_random_state(self.envs[i])}
        env_state = reset_state(self.envs[i])
        if env_state is not None:  # a task that keeps state across episodes
            self._episode_start[i]["env_state"] = env_state
        self._episode_actions[i] = []
        obs, info = self.envs[i].reset(seed=seed)
        self._returns[i] = 0.0
        self._lengths[i] = 0
        return self._flatten(obs), info

    @property
    def num_active(self) -> int:
        """Environments still running."""
        return len(self._active)

    @property
    def active_indices(self) -> list[int]:
        """Local indices of the running environments, in batch order."""
        return list(self._active)

    def reset(self) -> TensorDict:
        """Reset every environment (training: with its seed; evaluation: its first episode).

        Evaluation starts each share of the episode list again (the same episodes each time).
        """
        self._active = list(range(self.num_envs))
        if self.eval_mode:
            self._queues = [list(share) for share in self._episode_lists]
        with self._guard("resetting"):
            return self._reset_active(first=True)

    def _guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The hang watchdog around one call of the environments (started on first use)."""
        if self._watchdog is None:
            self._watchdog = Watchdog(self._timeout, self._describe_current)
        return self._watchdog.guard(what)

    def _describe_current(self) -> str:
        env = self.current_env
        return f"environment {env} ({self._name})" if env is not None else f"a {self._name}"

    def new_episodes(self) -> TensorDict:
        """Cut every episode and start new ones (unseeded resets; training mode only)."""
        if self.eval_mode:
            raise RuntimeError("new_episodes() would skip evaluation episodes")
        return self._reset_active(first=False)

    def _reset_active(self, first: bool) -> TensorDict:
        rows, infos = [], []
        for i in self._active:
            obs, info = self._reset_env(i, first=first)
            rows.append(obs)
            infos.append(info)
        self.current_env = None
        batch = self._stack(rows)
        self._check_obs(batch, self._active, lambda pos: "the first observation of an episode")
        return step_tensordict(batch, self._fields(infos))

    def step(self, actions: np.ndarray) -> TensorDict:
        """Step the active environments (:func:`~rl.sampling.base.step_tensordict`)."""
        with self._guard("stepping"):
            return self._step(actions)

    def _step(self, actions: np.ndarray) -> TensorDict:
        n = len(self._active)
        actions = to_env_actions(self.action_space, np.asarray(actions))
        if actions.shape != (n, *self._action_shape):
            raise ValueError(
                f"expected {n} actions of shape {self._action_shape} for {self.action_space}, "
                f"got shape {actions.shape}"
            )
        # Python lists in the loop (setting a NumPy element costs ~10x more), arrays after it.
        rows: list[dict[str, Any]] = []
        rewards: list[float] = []
        terminated: list[bool] = []
        truncated: list[bool] = []
        infos: list[Mapping[str, Any]] = []
        step_infos: list[Mapping[str, Any]] | None = [] if self._transition_fields else None
        paused = [False] * n
        final_rows: list[dict[str, Any]] = []
        final_idx: list[int] = []
        episodes: list[EpisodeRecord] = []
        steps: list[int] = []  # each environment's step of its episode
        reset = [False] * n
        active = list(self._active)
        env_actions = actions.tolist() if self._discrete else actions
        for pos, i in enumerate(active):
            self.current_env = self.env_offset + i
            action = env_actions[pos]
            self._episode_actions[i].append(action if self._discrete else action.tolist())
            obs, reward, term, trunc, info = self.envs[i].step(action)
            step_info = info
            obs = self._flatten(obs)
            reward = float(reward)
            self._returns[i] += reward
            self._lengths[i] += 1
            steps.append(self._lengths[i])
            rewards.append(reward)
            cut = bool(trunc) and not term
            terminated.append(bool(term))
            truncated.append(cut)
            if term or trunc:
                metrics = {"return": self._returns[i], "length": float(self._lengths[i])}
                metrics.update(episode_metrics(info))
                episodes.append(EpisodeRecord(self.env_offset + i, metrics, self._current_seed[i]))
                if cut:
                    final_rows.append(obs)
                    final_idx.append(pos)
                if self.eval_mode and not self._queues[i]:
                    paused[pos] = True
                else:
                    obs, info = self._reset_env(i, first=False)
                    reset[pos] = True
            infos.append(info)
            if step_infos is not None:
                step_infos.append(step_info)  # the step's own, even where a reset followed
            rows.append(obs)
        self.current_env = None
        reward_array = np.asarray(rewards, dtype=np.float32)
        paused_array = np.asarray(paused, dtype=bool)
        obs_batch = self._stack(rows)
        final_obs = self._stack(final_rows) if final_rows else {}
        self._check_step(obs_batch, reward_array, final_obs, final_idx, active, steps, reset)
        if final_rows:  # every row, zeros where the episode was not truncated
            final_obs = {
                k: _scatter_rows(v, final_idx, obs_batch[k]) for k, v in final_obs.items()
            }
        if paused_array.any():
            self._active = [i for pos, i in enumerate(self._active) if not paused[pos]]
        return step_tensordict(
            obs_batch,
            self._fields(infos, step_infos),
            rewards=reward_array,
            terminated=np.asarray(terminated, dtype=bool),
            truncated=np.asarray(truncated, dtype=bool),
            paused=paused_array,
            final_obs=final_obs,
            episodes=episodes,
        )

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight: per environment, how it started and the actions since.

        Restoring resets with the episode's seed or, for an auto-reset, the ``np_random`` state
        (and ``reset_state()``, :mod:`rl.tasks.env_state`) from just before it, then replays the
        actions: exact for environments deterministic given those. Not in evaluation mode.
        """
        if self.eval_mode:
            raise NotImplementedError("a SerialSampler in evaluation mode cannot be saved")
        return {
            "num_envs": self.num_envs,
            "env_offset": self.env_offset,
            "episodes": [
                {**start, "actions": list(actions)}
                for start, actions in zip(self._episode_start, self._episode_actions, strict=True)
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore the episodes saved by :meth:`state_dict`; returns what :meth:`reset` would.

        Raises:
            ValueError: The state belongs to a different sampler layout, or a value of it is
                of another kind, size or range (named: it may come from a file).
            RuntimeError: Replaying an episode ended it (a nondeterministic environment).
        """
        if self.eval_mode:
            raise NotImplementedError("a SerialSampler in evaluation mode cannot be restored")
        check_state_layout(state, self.num_envs, self.env_offset)
        episodes = checked_episodes(state, self.num_envs, self.action_space)
        self._active = list(range(self.num_envs))
        rows, infos = [], []
        for i, episode in enumerate(episodes):
            self.current_env = self.env_offset + i
            name = f"environment {self.current_env} ({self._name})"
            obs, info, returned, length = replay_episode(
                self.envs[i], episode, self.action_space, name
            )
            self._episode_start[i] = {k: v for k, v in episode.items() if k != "actions"}
            self._episode_actions[i] = list(episode["actions"])
            self._returns[i], self._lengths[i] = returned, length
            rows.append(self._flatten(obs))
            infos.append(info)
        self.current_env = None
        batch = self._stack(rows)
        self._check_obs(batch, self._active, lambda pos: "its restored episode")
        return step_tensordict(batch, self._fields(infos))

    def render(self, env_index: int = 0) -> np.ndarray | None:
        """RGB frame of one environment (it must have been built with ``render_mode``)."""
        frame = self.envs[env_index].render()
        return None if frame is None else np.asarray(frame)

    def close(self) -> None:
        """Close every environment."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.close()
        for env in self.envs:
            env.close()
