"""A sampler over one batched environment: N environments stepped at once, tensors throughout.

:class:`BatchedSampler` drives a :class:`~rl.tasks.batched.BatchedEnv` (one call steps every
environment and auto-resets, on the environment's device) and returns what
:class:`~rl.sampling.SerialSampler` does, with the same seeds and episode lists. Returns and
lengths are counted on the device, which is read once a step (a few flags: ended, truncated,
finite sums); episode records are copied to the host only in steps where an episode ended.
Paused evaluation environments leave the batch and are stepped with a filler action.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import gymnasium as gym
import hydra.utils
import numpy as np
import torch
from tensordict import TensorDict

from rl.sampling.base import (
    EPISODES,
    MAX_NUM_ENVS,
    EpisodeRecord,
    Sampler,
    check_state_layout,
    episode_entries,
    split_episode_seeds,
)
from rl.sampling.finite_checks import FiniteChecks, first_nonfinite_row, is_float
from rl.sampling.watchdog import DEFAULT_TIMEOUT_S, Watchdog
from rl.tasks.agents import num_agents
from rl.tasks.batched import EPISODE_KEY, BatchedEnv
from rl.tasks.factory import FRAMEWORK_KEYS
from rl.tasks.gym_vector import VECTORIZATION_MODES, GymVectorEnv, builds_vector_env
from rl.tasks.spaces import action_array_spec, check_action_space, to_env_actions
from rl.utils.config import Check, import_target
from rl.utils.finite import as_count
from rl.utils.seeding import env_seeds

__all__ = ["BatchedSampler", "build_batched_env"]

log = logging.getLogger(__name__)

MODES = ("auto", *VECTORIZATION_MODES)


def build_batched_env(
    task: Mapping[str, Any],
    num_envs: int,
    *,
    device: torch.device | str,
    vectorization_mode: str = "auto",
    mp_start_method: str | None = "forkserver",
) -> BatchedEnv:
    """The batched environment of a task config (``docs/concepts/samplers.md``).

    A ``BatchedEnv`` class is built with the task's keys, ``num_envs`` and ``device``; so is the
    batched twin a gymnasium env class names in its ``batched_env`` attribute (``auto`` mode, no
    ``observations`` or ``step_fields``, which act on gymnasium wrappers and infos); a target
    that builds a ``gymnasium.vector.VectorEnv`` is adapted; any other gymnasium task is stepped
    as copies in gymnasium's ``SyncVectorEnv`` (``async``: ``AsyncVectorEnv``).

    Args:
        task: Plain task config with a ``_target_``.
        num_envs: How many environments.
        device: Where a ``BatchedEnv`` of the task's lives (gymnasium's step on the CPU).
        vectorization_mode: ``auto`` (the task's batched environment if it has one, else
            ``sync``), ``sync`` or ``async`` (gymnasium's, even where a twin exists).
        mp_start_method: The start method of ``async``'s worker processes.

    Raises:
        ValueError: An unknown mode, or one that the task's form cannot take.
    """
    if vectorization_mode not in MODES:
        raise ValueError(
            f"sampler.vectorization_mode: expected one of {MODES}, got {vectorization_mode!r}"
        )
    target = import_target(str(task["_target_"]))
    own = {k: v for k, v in task.items() if k not in FRAMEWORK_KEYS}
    if isinstance(target, type) and issubclass(target, BatchedEnv):
        where = f"task._target_={task['_target_']!r} is a batched environment"
        if vectorization_mode != "auto":
            raise ValueError(
                f"{where}: sampler.vectorization_mode={vectorization_mode!r} has nothing to "
                "vectorise (auto)"
            )
        used = sorted(k for k in FRAMEWORK_KEYS if task.get(k))
        if used:
            raise ValueError(
                f"{where}: task.{used[0]} acts on a gymnasium environment's wrappers and infos; "
                "a batched environment declares its step fields and shapes its observations "
                "itself"
            )
        return _instantiate(own, num_envs, device)
    if builds_vector_env(target):
        if vectorization_mode != "auto":
            raise ValueError(
                f"task._target_={task['_target_']!r} builds its own vector environment: "
                f"sampler.vectorization_mode={vectorization_mode!r} has nothing to choose (auto)"
            )
        return GymVectorEnv.from_vector_task(task, num_envs)
    twin = getattr(target, "batched_env", None)
    if twin and vectorization_mode == "auto":
        if not any(task.get(k) for k in FRAMEWORK_KEYS):
            return _instantiate({**own, "_target_": str(twin)}, num_envs, device)
        log.info(
            "task %s: its batched environment (%s) takes no observations transforms or "
            "step_fields; stepping copies of its gymnasium environment instead",
            task["_target_"],
            twin,
        )
    mode = "sync" if vectorization_mode == "auto" else vectorization_mode
    return GymVectorEnv.from_task(task, num_envs, mode=mode, mp_start_method=mp_start_method)


def _instantiate(
    config: Mapping[str, Any], num_envs: int, device: torch.device | str
) -> BatchedEnv:
    env = hydra.utils.instantiate(dict(config), num_envs=num_envs, device=device)
    if not isinstance(env, BatchedEnv):
        raise TypeError(
            f"task._target_={config['_target_']!r} built {type(env)}, not a BatchedEnv"
        )
    if env.num_envs != num_envs:
        env.close()
        raise ValueError(f"{config['_target_']} built {env.num_envs} environments for {num_envs}")
    return env


def _filler_action(space: gym.Space) -> np.ndarray:
    """A valid action of ``space``, what paused environments are stepped with."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return np.asarray(space.start, dtype=np.int64)
    if isinstance(space, gym.spaces.Box):
        return np.clip(np.zeros(space.shape), space.low, space.high).astype(space.dtype)
    return np.asarray(space.sample())  # a multi-agent task's stacked space


class BatchedSampler(FiniteChecks, Sampler):
    """Steps a batched environment of ``num_envs`` environments.

    Args:
        task: Plain (resolved) task config (:func:`build_batched_env`).
        num_envs: Number of environments.
        seed: Seed of the first resets, as :class:`~rl.sampling.SerialSampler`'s.
        episode_seeds: Evaluation mode: fixed episode seeds, split as the serial sampler does.
        env_offset: Global index of this sampler's first environment.
        total_envs: Size of the global seed stream (default ``env_offset + num_envs``).
        timeout: Seconds one ``reset`` or ``step`` of the batch may take before a
            :class:`~rl.sampling.watchdog.SamplerTimeoutError` (None: wait forever).
        device: Where a task's own batched environment lives (gymnasium's are on the CPU).
        vectorization_mode: ``auto``, ``sync`` or ``async`` (:func:`build_batched_env`).
        mp_start_method: The start method of ``async``'s worker processes.
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
        device: str,
        vectorization_mode: Annotated[str, Check(choices=MODES)] = "auto",
        mp_start_method: str = "forkserver",
    ) -> None:
        self._closed = False
        self.env: BatchedEnv | None = None
        self._watchdog: Watchdog | None = None
        if num_envs < 1:
            raise ValueError(f"sampler.num_envs must be >= 1, got {num_envs}")
        self.eval_mode = episode_seeds is not None
        self._episode_lists: list[list[int]] = []
        if episode_seeds is not None:
            self._episode_lists = split_episode_seeds(episode_seeds, num_envs)
            num_envs = len(self._episode_lists)
        self.num_envs = num_envs
        self.env_offset = env_offset
        total = env_offset + num_envs if total_envs is None else total_envs
        self._seeds = env_seeds(total, seed)[env_offset : env_offset + num_envs]
        self._timeout = timeout
        self.env = build_batched_env(
            task,
            num_envs,
            device=device,
            vectorization_mode=vectorization_mode,
            mp_start_method=mp_start_method,
        )
        env = self.env
        try:
            self.device = torch.device(env.device)
            self._name = str(
                getattr(env, "name", None) or task.get("env_id") or type(env).__name__
            )
            self.observation_space = env.observation_space
            self.step_fields = dict(env.step_fields)
            self.action_space = check_action_space(
                env.action_space, self._name, num_agents(self.step_fields)
            )
        except Exception:
            self.close()
            raise
        self._action_shape, _ = action_array_spec(self.action_space)
        self._box = self.action_space if isinstance(self.action_space, gym.spaces.Box) else None
        if self._box is not None:
            self._low = torch.as_tensor(self._box.low, device=self.device)
            self._high = torch.as_tensor(self._box.high, device=self.device)
            self._action_dtype = _torch_dtype(self._box.dtype)
        else:
            self._action_dtype = torch.int64
        self._filler = torch.as_tensor(_filler_action(self.action_space), device=self.device)
        keys = list(self.observation_space.spaces)
        self._dict_obs = keys != ["obs"]  # messages name keys as the serial sampler does
        self._float_keys = [
            k for k, space in self.observation_space.spaces.items() if is_float(space.dtype)
        ]
        # The environments in the batch (evaluation pauses some), as a list and on the device
        self._active = list(range(num_envs))
        self._active_rows: torch.Tensor | None = None  # None: all of them
        self._returns = torch.zeros(num_envs, dtype=torch.float64, device=self.device)
        self._lengths = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._start_seeds: list[int | None] = [None] * num_envs  # each episode's, for messages
        self._seeded = False  # whether any of them is not None
        # A training step's constant episode entries (_training_episodes).
        self._env_index = env_offset + torch.arange(num_envs, device=self.device)
        self._minus_ones = torch.full((num_envs,), -1, dtype=torch.int64, device=self.device)
        self._nan = torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        self._queues: list[list[int]] = []
        self._next_seeds: list[int | None] | None = None
        self.current_env: int | None = None

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

        Evaluation starts each share of the episode list again.
        """
        if self.eval_mode:
            self._queues = [list(share) for share in self._episode_lists]
            seeds: list[int | None] = [queue.pop(0) for queue in self._queues]
            self._next_seeds = [queue[0] if queue else None for queue in self._queues]
        else:
            seeds = list(self._seeds)
        with self._guard("resetting"):
            return self._reset(seeds)

    def new_episodes(self) -> TensorDict:
        """Cut every episode and start new ones (unseeded resets; training mode only)."""
        if self.eval_mode:
            raise RuntimeError("new_episodes() would skip evaluation episodes")
        with self._guard("resetting"):
            return self._reset([None] * self.num_envs)

    def _reset(self, seeds: list[int | None]) -> TensorDict:
        assert self.env is not None
        self._set_active(list(range(self.num_envs)))
        self._start_seeds = list(seeds)
        self._seeded = any(seed is not None for seed in seeds)
        self._returns.zero_()
        self._lengths.zero_()
        return self._first(self.env.reset(seeds), "the first observation of an episode")

    def _first(self, out: TensorDict, when: str) -> TensorDict:
        """A reset's ``TensorDict`` (``obs`` and the fields), checked."""
        self._check_layout(out)
        obs = out.get("obs")
        flags = [_finite(obs.get(k)) for k in self._float_keys]
        if flags and not all(torch.stack(flags).tolist()):
            self._raise_obs(obs, range(self.num_envs), lambda row: when)
        data: dict[Any, Any] = {"obs": obs, **{k: out.get(k) for k in self.step_fields}}
        return TensorDict._new_unsafe(data, batch_size=torch.Size([self.num_envs]))

    def step(self, actions: np.ndarray | torch.Tensor) -> TensorDict:
        """Step the active environments with ``[N_active, ...]`` actions (:meth:`Sampler.step`).

        Torch actions on the environment's device are not copied.
        """
        with self._guard("stepping"):
            return self._step(actions)

    def _step(self, actions: np.ndarray | torch.Tensor) -> TensorDict:
        assert self.env is not None
        n = len(self._active)
        acts = self._actions(actions, n)
        rows = self._active_rows
        if rows is not None:  # paused environments: a filler action they ignore
            full = self._filler.expand(self.num_envs, *self._filler.shape).clone()
            full[rows] = acts
            acts = full
        out = self.env.step(acts, self._next_seeds)
        raw = out.get("rewards")
        self._returns += raw
        self._lengths += 1
        terminated_all = out.get("terminated")
        truncated_all = out.get("truncated")
        obs = out.get("obs")
        fields = {k: out.get(k) for k in self.step_fields}
        terminated, truncated = terminated_all, truncated_all
        if rows is not None:
            obs = obs[rows]
            fields = {k: v[rows] for k, v in fields.items()}
            terminated, truncated = terminated_all[rows], truncated_all[rows]
            raw = raw[rows]
        rewards = raw if raw.dtype == torch.float32 else raw.to(torch.float32)
        ended = terminated | truncated
        # The one device read a step: episodes ended, truncated; rewards, observations finite
        checks = [ended.any(), truncated.any(), _finite(rewards)]
        checks += [_finite(obs.get(k)) for k in self._float_keys]
        ended_any, truncated_any, *finite = torch.stack(checks).tolist()
        if not all(finite):
            self._raise_step(rewards, obs, finite, ended)
        data: dict[Any, Any] = {"obs": obs, **fields}
        data.update(rewards=rewards, terminated=terminated, truncated=truncated)
        paused = torch.zeros(n, dtype=torch.bool, device=self.device)
        episodes: list[EpisodeRecord] = []
        if truncated_any:
            final = out.get("final_obs")
            final = final if rows is None else final[rows]
            self._check_final(final)
            data["final_obs"] = final
        if ended_any and not self.eval_mode:
            data[EPISODES] = self._training_episodes(out, ended)
        elif ended_any:
            episodes, pausing = self._episodes(out, ended)
            data[EPISODES] = episode_entries(episodes, ended)
            if pausing:
                paused[pausing] = True
                self._set_active([i for pos, i in enumerate(self._active) if pos not in pausing])
        if ended_any:
            self._returns.masked_fill_(terminated_all | truncated_all, 0.0)
            self._lengths.masked_fill_(terminated_all | truncated_all, 0)
        data["paused"] = paused
        return TensorDict._new_unsafe(data, batch_size=torch.Size([n]))

    def _training_episodes(self, out: TensorDict, ended: torch.Tensor) -> TensorDict:
        """The ``episodes`` entries of a training step, on the device, with no host copy.

        What :func:`episode_entries` gives for :meth:`_episodes`' records (every environment
        active, no seeds): -1 and NaN where no episode ended, NaN where the environment gave no
        such metric.
        """
        if self._seeded:  # until each environment's first (seeded) episode has ended
            for i in ended.nonzero().squeeze(1).tolist():
                self._start_seeds[i] = None
            self._seeded = any(seed is not None for seed in self._start_seeds)
        nan = self._nan

        def column(values: torch.Tensor) -> torch.Tensor:
            return torch.where(ended, values.to(torch.float64), nan)

        metrics: dict[Any, Any] = {
            "return": column(self._returns),
            "length": column(self._lengths),
        }
        extra = out.get(EPISODE_KEY, None)
        if extra is not None:
            metrics.update((str(k), column(extra.get(k))) for k in extra.keys())
        size = torch.Size([len(ended)])
        data: dict[Any, Any] = {
            "ended": ended,
            "env_index": torch.where(ended, self._env_index, self._minus_ones),
            "seed": self._minus_ones,  # the same tensor every step: read, never written
            "metrics": TensorDict._new_unsafe(metrics, batch_size=size),
        }
        return TensorDict._new_unsafe(data, batch_size=size)

    def _episodes(
        self, out: TensorDict, ended: torch.Tensor
    ) -> tuple[list[EpisodeRecord], list[int]]:
        """Evaluation: the records of the episodes that ended, and the positions that pause.

        One host copy; a position pauses where its share of the episode list is done.
        """
        positions = ended.nonzero().squeeze(1)
        envs = positions if self._active_rows is None else self._active_rows[positions]
        metrics = out.get(EPISODE_KEY, None)
        names = [] if metrics is None else list(metrics.keys())
        columns = [positions, envs, self._returns[envs], self._lengths[envs]]
        columns += [metrics.get(k)[envs] for k in names]
        table = torch.stack([c.to(torch.float64) for c in columns], 1).tolist()
        records, pausing = [], []
        assert self._next_seeds is not None
        for pos, env, ret, length, *values in table:
            i = int(env)
            record = {"return": ret, "length": length}
            record.update((k, v) for k, v in zip(names, values, strict=True) if v == v)  # not NaN
            records.append(EpisodeRecord(self.env_offset + i, record, self._start_seeds[i]))
            queue = self._queues[i]
            if not queue:
                pausing.append(int(pos))
                continue
            self._start_seeds[i] = queue.pop(0)
            self._next_seeds[i] = queue[0] if queue else None
        return records, pausing

    def _set_active(self, active: list[int]) -> None:
        self._active = active
        self._active_rows = (
            None
            if len(active) == self.num_envs
            else torch.tensor(active, dtype=torch.int64, device=self.device)
        )

    def _actions(self, actions: np.ndarray | torch.Tensor, n: int) -> torch.Tensor:
        """The actions as the environment takes them, on its device (Box: clipped)."""
        if isinstance(actions, torch.Tensor):
            acts = actions.to(self.device)
            if self._box is not None:
                acts = torch.clamp(acts, self._low.to(acts.dtype), self._high.to(acts.dtype))
            acts = acts.to(self._action_dtype)
        else:
            array = to_env_actions(self.action_space, np.asarray(actions))
            acts = torch.as_tensor(array).to(self.device, self._action_dtype)
        if tuple(acts.shape) != (n, *self._action_shape):
            raise ValueError(
                f"expected {n} actions of shape {self._action_shape} for {self.action_space}, "
                f"got shape {tuple(acts.shape)}"
            )
        return acts

    def _start_seed(self, env: int) -> int | None:
        return self._start_seeds[env]

    def _raise_step(
        self, rewards: torch.Tensor, obs: TensorDict, finite: list[bool], ended: torch.Tensor
    ) -> None:
        """Name the first non-finite reward or observation (as the serial sampler does)."""
        steps_list, reset = self._active_lengths(), ended.tolist()
        if self.eval_mode:  # an environment out of episodes pauses without a reset
            reset = [r and bool(self._queues[i]) for r, i in zip(reset, self._active, strict=True)]
        if not finite[0]:
            row = first_nonfinite_row(rewards)
            if row is not None:
                self._nonfinite(
                    self._active[row], "reward", rewards[row].item(),
                    f"step {steps_list[row]} of its episode",
                )  # fmt: skip
        self._raise_obs(
            obs,
            self._active,
            lambda row: (
                f"the reset after step {steps_list[row]} of its episode"
                if reset[row]
                else f"step {steps_list[row]} of its episode"
            ),
        )

    def _check_final(self, final: TensorDict) -> None:
        """Every float final observation finite (zeros where none was truncated)."""
        flags = [_finite(final.get(k)) for k in self._float_keys]
        if not flags or all(torch.stack(flags).tolist()):
            return
        steps_list = self._active_lengths()
        self._raise_obs(
            final,
            self._active,
            lambda row: f"step {steps_list[row]} of its episode (truncated)",
            "final observation",
        )

    def _active_lengths(self) -> list[int]:
        """The active environments' steps of their episodes."""
        steps = self._lengths if self._active_rows is None else self._lengths[self._active_rows]
        return steps.tolist()

    def _raise_obs(
        self, obs: TensorDict, envs: Sequence[int], when: Any, what: str = "observation"
    ) -> None:
        for key in self._float_keys:
            row = first_nonfinite_row(obs.get(key))
            if row is not None:
                field = f"{what} {key!r}" if self._dict_obs else what
                value = obs.get(key)[row].detach().to("cpu", torch.float64).numpy()
                self._nonfinite(envs[row], field, value, when(row))

    def _check_layout(self, out: TensorDict) -> None:
        """The batched environment's reset holds what its spaces say (dtypes, shapes)."""
        n = self.num_envs
        problems = []
        obs = out.get("obs", None)
        if not isinstance(obs, TensorDict):
            problems.append("no obs entries")
        else:
            for key, space in self.observation_space.spaces.items():
                value = obs.get(key, None)
                want = (n, *(space.shape or ())), _torch_dtype(space.dtype)
                if value is None or (tuple(value.shape), value.dtype) != want:
                    got = None if value is None else (tuple(value.shape), value.dtype)
                    problems.append(f"obs {key!r}: expected {want}, got {got}")
        for key, field in self.step_fields.items():
            value = out.get(key, None)
            want = (n, *field.shape), _torch_dtype(field.dtype)
            if value is None or (tuple(value.shape), value.dtype) != want:
                got = None if value is None else (tuple(value.shape), value.dtype)
                problems.append(f"step field {key!r}: expected {want}, got {got}")
        if problems:
            raise ValueError(
                f"{type(self.env).__name__} ({self._name}) returned a batch unlike its spaces: "
                + "; ".join(problems)
            )

    def state_dict(self) -> dict[str, Any]:
        """The environment's state and the returns and lengths so far (not in evaluation)."""
        if self.eval_mode:
            raise NotImplementedError("a BatchedSampler in evaluation mode cannot be saved")
        assert self.env is not None
        return {
            "num_envs": self.num_envs,
            "env_offset": self.env_offset,
            "env": self.env.state_dict(),
            "returns": self._returns.cpu(),
            "lengths": self._lengths.cpu(),
            "start_seeds": list(self._start_seeds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore the episodes saved by :meth:`state_dict`; returns what :meth:`reset` would."""
        if self.eval_mode:
            raise NotImplementedError("a BatchedSampler in evaluation mode cannot be restored")
        assert self.env is not None
        check_state_layout(state, self.num_envs, self.env_offset)
        returns, lengths, seeds = self._checked_counts(state)
        self._set_active(list(range(self.num_envs)))
        with self._guard("restoring"):
            first = self._first(self.env.load_state_dict(state["env"]), "its restored episode")
        self._returns.copy_(returns)
        self._lengths.copy_(lengths)
        self._start_seeds = seeds
        self._seeded = any(seed is not None for seed in seeds)
        return first

    def _checked_counts(
        self, state: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int | None]]:
        """A saved state's returns, lengths and start seeds, or a ValueError naming the entry.

        The state may come from a file: each entry must be of this sampler's size and kind
        (finite returns, lengths >= 0, seeds None or ints in ``[0, 2**64)``).
        """
        n = self.num_envs

        def problem(key: str, expected: str) -> ValueError:
            return ValueError(f"sampler state {key!r}: expected {expected}")

        returns, lengths, seeds = (
            state.get("returns"),
            state.get("lengths"),
            state.get("start_seeds"),
        )
        if not (
            isinstance(returns, torch.Tensor)
            and returns.shape == (n,)
            and returns.is_floating_point()
            and bool(torch.isfinite(returns).all())
        ):
            raise problem("returns", f"{n} finite floats")
        if not (
            isinstance(lengths, torch.Tensor)
            and lengths.shape == (n,)
            and lengths.dtype == torch.int64
            and bool((lengths >= 0).all())
        ):
            raise problem("lengths", f"{n} int64 counts >= 0")
        if not isinstance(seeds, list) or len(seeds) != n:
            raise problem("start_seeds", f"a list of {n} seeds")
        for seed in seeds:
            if seed is not None and (as_count(seed, 0, 2**64) is None):
                raise problem("start_seeds", f"None or ints in [0, 2**64), got {repr(seed)[:40]}")
        return returns, lengths, seeds

    def _guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The hang watchdog around one call of the environments (started on first use)."""
        if self._watchdog is None:
            self._watchdog = Watchdog(self._timeout, self._describe)
        return self._watchdog.guard(what)

    def _describe(self) -> str:
        last = self.env_offset + self.num_envs - 1
        return f"environments {self.env_offset}-{last} ({self._name})"

    def render(self, env_index: int = 0) -> np.ndarray | None:
        """RGB frame of one environment (built with ``render_mode``), else None."""
        assert self.env is not None
        frame = self.env.render(env_index)
        if isinstance(frame, torch.Tensor):
            frame = frame.cpu().numpy()
        return None if frame is None else np.asarray(frame)

    def close(self) -> None:
        """Close the batched environment."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.close()
        if self.env is not None:
            self.env.close()


def _finite(values: torch.Tensor) -> torch.Tensor:
    """Whether the sum of ``values`` is finite (0-d bool; one reduction, where they live)."""
    return torch.isfinite(values.sum())


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
