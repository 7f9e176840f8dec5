"""Any ``gymnasium.vector.VectorEnv`` as a :class:`~rl.tasks.batched.BatchedEnv` on the CPU.

How each of gymnasium's autoreset modes becomes the contract's, and what :class:`TaskEnv` (the
framework's own copies of a task's environment) records for exact resume, are described in
docs/concepts/samplers.md ("Gymnasium's vector environments").
"""

from __future__ import annotations

import functools
import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import hydra.utils
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDict

from rl.tasks.batched import EPISODE_KEY, BatchedEnv
from rl.tasks.env_state import checked_episodes, np_random_state, replay_episode, reset_state
from rl.tasks.factory import FRAMEWORK_KEYS, build_env, env_name, episode_metrics
from rl.tasks.fields import StepField, declared_step_fields, step_fields_of
from rl.tasks.spaces import ObservationFlattener
from rl.utils.processes import resolve_start_method

__all__ = ["GymVectorEnv", "TaskEnv", "autoreset_mode", "builds_vector_env"]

log = logging.getLogger(__name__)

VECTORIZATION_MODES = ("sync", "async")

# (infos, rows): read a key of ``infos`` for the rows where ``rows`` (None: all) and its mask hold
_Source = tuple[Mapping[str, Any], np.ndarray | None]


def autoreset_mode(env: VectorEnv) -> AutoresetMode:
    """``env.metadata["autoreset_mode"]``; where unset, gymnasium's default with a warning."""
    mode = env.metadata.get("autoreset_mode")
    if mode is None:
        log.warning(
            "%s does not say how it resets finished episodes (metadata['autoreset_mode']); "
            "assuming gymnasium's default, NEXT_STEP",
            env,
        )
        return AutoresetMode.NEXT_STEP
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(getattr(mode, "value", mode))
    except ValueError as e:
        raise ValueError(f"{env}: unknown metadata['autoreset_mode'] {mode!r}") from e


def builds_vector_env(target: Any) -> bool:
    """Whether a task's ``_target_`` is a ``VectorEnv`` class or annotated to return one."""
    if isinstance(target, type):
        return issubclass(target, VectorEnv)
    try:
        returned = typing.get_type_hints(target).get("return")
    except Exception:  # noqa: BLE001  (an annotation that does not resolve says nothing)
        return False
    return isinstance(returned, type) and issubclass(returned, VectorEnv)


def typed_info(
    info: Mapping[str, Any], fields: Mapping[str, StepField], name: str
) -> dict[str, Any]:
    """The task's step fields of one ``info``, typed as the serial sampler records them.

    (Typed per environment, so that a batch mixing an ``int`` and a ``float`` cannot take the
    first one's type.)
    """
    out: dict[str, Any] = {}
    for key, field in fields.items():
        missing = field.empty(1)[0] if field.shape else field.missing
        try:
            out[key] = np.asarray(info.get(field.info, missing), dtype=field.dtype).reshape(
                field.shape
            )
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{name}: step field {key!r} (info[{field.info!r}]) is not a "
                f"{field.dtype} of shape {field.shape}: {e}"
            ) from e
    return out


class TaskEnv(gym.Wrapper):
    """Environment ``index`` of a vector environment :meth:`GymVectorEnv.from_task` builds.

    Its ``info`` holds the task's step fields only, typed, and ``episode_metrics`` at an
    episode's end; it records how each episode started and the actions since, so that
    :meth:`episode` and :meth:`restore` save and replay the episode in flight as
    :class:`~rl.sampling.SerialSampler` does.
    """

    def __init__(
        self, env: gym.Env, *, index: int, fields: Mapping[str, StepField], name: str
    ) -> None:
        super().__init__(env)
        self.index, self.fields, self.name = index, dict(fields), name
        self._start: dict[str, Any] = {}
        self._actions: list[Any] = []
        self._discrete = isinstance(env.action_space, gym.spaces.Discrete)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset (the ``{}`` options a masked vector reset passes become None)."""
        self._started(seed)
        obs, info = self.env.reset(seed=seed, options=options or None)
        return obs, typed_info(info, self.fields, self.name)

    def _started(self, seed: int | None) -> None:
        self._start = {"seed": seed, "np_random": np_random_state(self.env)}
        state = reset_state(self.env)
        if state is not None:  # only for tasks that keep state across episodes
            self._start["env_state"] = state
        self._actions = []

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step, recording the action.

        A discrete action reaches the environment as a Python ``int``, as the serial sampler
        hands it over (gymnasium's checks of a NumPy integer cost more than the step).
        """
        action = int(action) if self._discrete else action
        self._actions.append(action if self._discrete else np.asarray(action).tolist())
        obs, reward, terminated, truncated, info = self.env.step(action)
        out = typed_info(info, self.fields, self.name)
        if terminated or truncated:
            out["episode_metrics"] = {k: np.float64(v) for k, v in episode_metrics(info).items()}
        return obs, reward, terminated, truncated, out

    def episode(self) -> dict[str, Any]:
        """The episode in flight: how it started and the actions since (plain values)."""
        return {**self._start, "actions": list(self._actions)}

    def restore(self, episodes: Sequence[Mapping[str, Any]]) -> tuple[Any, dict[str, Any]]:
        """Replay this environment's saved episode (``episodes[index]``); its last obs, info.

        The episodes were checked by :func:`~rl.tasks.env_state.checked_episodes`.
        """
        episode = episodes[self.index]
        name = f"{self.name} (environment {self.index})"
        obs, info, _, _ = replay_episode(self.env, episode, self.action_space, name)
        self._start = {k: v for k, v in episode.items() if k != "actions"}
        self._actions = list(episode["actions"])
        return obs, typed_info(info, self.fields, self.name)


def _task_env(
    task: Mapping[str, Any], index: int, fields: Mapping[str, StepField], name: str
) -> TaskEnv:
    """A :class:`TaskEnv` over a new environment of ``task`` (picklable for workers)."""
    return TaskEnv(build_env(task), index=index, fields=fields, name=name)


class GymVectorEnv(BatchedEnv):
    """A ``gymnasium.vector.VectorEnv`` as a :class:`~rl.tasks.batched.BatchedEnv` on the CPU.

    Args:
        env: The vector environment, in any autoreset mode.
        step_fields: The task's step fields (read from the infos by their ``info`` key).
        name: The task's name in messages (default: the vector environment's spec id).
        typed_infos: The environments are :class:`TaskEnv` s (:meth:`from_task`).
    """

    device = torch.device("cpu")

    def __init__(
        self,
        env: VectorEnv,
        *,
        step_fields: Mapping[str, StepField] | None = None,
        name: str | None = None,
        typed_infos: bool = False,
    ) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        spec = getattr(env.unwrapped, "spec", None)
        self.name = name or (spec.id if spec is not None else type(env.unwrapped).__name__)
        self.mode = autoreset_mode(env)
        unwrapped = env.unwrapped
        if (
            isinstance(unwrapped, AsyncVectorEnv)
            and self.mode is AutoresetMode.NEXT_STEP
            and not unwrapped.shared_memory
        ):
            # gymnasium 1.4's worker forgets a pending auto-reset on a masked reset only with
            # shared memory: without it, the next step would reset again (reward 0).
            raise ValueError(
                f"{self.name}: an AsyncVectorEnv in NEXT_STEP mode needs shared_memory=True "
                "(or autoreset_mode SAME_STEP or DISABLED) to be stepped as a batch"
            )
        self._flatten = ObservationFlattener(env.single_observation_space, self.name)
        self.observation_space = self._flatten.space
        self.action_space = env.single_action_space
        self.step_fields = dict(step_fields or {})
        # Each field's infos key: TaskEnv's typed infos use the field's own name.
        self._typed = typed_infos
        self._info_keys = {k: k if typed_infos else f.info for k, f in self.step_fields.items()}
        # A vector environment that hands out its own buffers is copied (the step keeps them).
        self._copy = getattr(env.unwrapped, "copy", True) is False
        self._closed = False

    @classmethod
    def from_task(
        cls,
        task: Mapping[str, Any],
        num_envs: int,
        *,
        mode: str = "sync",
        mp_start_method: str | None = "forkserver",
    ) -> GymVectorEnv:
        """``num_envs`` :class:`TaskEnv` copies of the task's environment.

        ``mode``: ``sync`` (``SyncVectorEnv``, in this process) or ``async`` (``AsyncVectorEnv``,
        a process each started with ``mp_start_method``, shared memory).
        """
        if mode not in VECTORIZATION_MODES:
            raise ValueError(f"vectorization mode {mode!r}: expected one of {VECTORIZATION_MODES}")
        probe = build_env(task)  # its name and fields (and, sync, environment 0)
        try:
            name = env_name(task, probe)
            fields = step_fields_of(task, probe, name)
        except Exception:
            probe.close()
            raise
        fns: list[Callable[[], gym.Env]] = [
            functools.partial(_task_env, dict(task), i, fields, name) for i in range(num_envs)
        ]
        if mode == "sync":
            fns[0] = functools.partial(TaskEnv, probe, index=0, fields=fields, name=name)
            try:
                vector: VectorEnv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
            except Exception:
                probe.close()
                raise
        else:
            probe.close()
            vector = AsyncVectorEnv(
                fns,
                context=resolve_start_method(mp_start_method),
                autoreset_mode=AutoresetMode.DISABLED,
            )
        return cls(vector, step_fields=fields, name=name, typed_infos=True)

    @classmethod
    def from_vector_task(cls, task: Mapping[str, Any], num_envs: int) -> GymVectorEnv:
        """A task whose ``_target_`` builds the vector environment itself, with ``num_envs``."""
        vector = hydra.utils.instantiate(
            {k: v for k, v in task.items() if k not in FRAMEWORK_KEYS}, num_envs=num_envs
        )
        if not isinstance(vector, VectorEnv):
            raise TypeError(
                f"task._target_={task.get('_target_')!r} built {type(vector)}, not a "
                "gymnasium.vector.VectorEnv"
            )
        if vector.num_envs != num_envs:
            vector.close()
            raise ValueError(
                f"task._target_={task.get('_target_')!r} built {vector.num_envs} environments "
                f"for num_envs={num_envs}"
            )
        spec = getattr(vector.unwrapped, "spec", None)
        name = str(task.get("env_id") or (spec.id if spec is not None else task["_target_"]))
        try:
            fields = declared_step_fields(task, _declared_fields(vector), name)
            return cls(vector, step_fields=fields, name=name)
        except Exception:
            vector.close()
            raise

    def reset(self, seeds: Sequence[int | None]) -> TensorDict:
        """Reset every environment, each with its seed (None: its own random stream)."""
        obs, infos = self.env.reset(seed=list(seeds))  # type: ignore[arg-type]  # one each
        return self._first_step(obs, infos)

    def step(
        self, actions: torch.Tensor, next_seeds: Sequence[int | None] | None = None
    ) -> TensorDict:
        """Step every environment; those whose episode ended start the next at once."""
        obs, rewards, terminated, truncated, infos = self.env.step(actions.numpy())
        terminated = np.asarray(terminated, dtype=bool)
        done = terminated | np.asarray(truncated, dtype=bool)
        truncated = done & ~terminated
        flat = self._obs(obs)
        n = self.num_envs
        final: dict[str, np.ndarray] | None = None
        if self.mode is AutoresetMode.SAME_STEP:
            steps: list[_Source] = [(infos, ~done), (infos.get("final_info") or {}, done)]
            if truncated.any():
                final = self._final_rows(infos["final_obs"], truncated, flat)
            reset = done & _seeded(next_seeds, n)  # reset again: a seed of its own (evaluation)
            observed = self._reset_rows(flat, infos, reset, next_seeds)
        else:  # NEXT_STEP, DISABLED: the adapter resets what ended, now
            steps = [(infos, None)]
            if truncated.any():
                final = {k: _rows_or_zeros(v, truncated) for k, v in flat.items()}
            observed = self._reset_rows(flat, infos, done, next_seeds)
        data: dict[str, Any] = {
            "obs": flat,
            **self._read_fields(observed, steps),
            "rewards": np.asarray(rewards, dtype=np.float64),
            "terminated": terminated,
            "truncated": truncated,
        }
        if final is not None:
            data["final_obs"] = final
        if done.any():
            data[EPISODE_KEY] = self._episode_metrics(steps, done)
        return _tensordict(data, n)

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight: each environment's start and the actions since."""
        if self._typed:
            return {"episodes": list(self.env.call("episode"))}  # type: ignore[attr-defined]
        own = getattr(self.env, "state_dict", None)
        if own is None:
            raise NotImplementedError(
                f"{self.name}: this vector environment cannot save its episodes in flight "
                "(no state_dict())"
            )
        return dict(own())

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Replay the saved episodes; what the saved environments were about to act on."""
        if self._typed:
            episodes = checked_episodes(state, self.num_envs, self.action_space)
            results = self.env.call("restore", episodes)  # type: ignore[attr-defined]
            rows = [self._flatten(obs) for obs, _ in results]
            flat = {
                k: np.array([r[k] for r in rows], dtype=space.dtype)
                for k, space in self.observation_space.spaces.items()
            }
            fields = {
                key: np.array([info[key] for _, info in results], dtype=field.dtype)
                if not field.transition
                else field.empty(self.num_envs)
                for key, field in self.step_fields.items()
            }
            return _tensordict({"obs": flat, **fields}, self.num_envs)
        own = getattr(self.env, "load_state_dict", None)
        if own is None:
            raise NotImplementedError(
                f"{self.name}: this vector environment cannot restore episodes in flight "
                "(no load_state_dict())"
            )
        return self._first_step(*own(state))

    def render(self, index: int = 0) -> Any:
        """Environment ``index``'s frame (built with ``render_mode``), else None."""
        frames = self.env.call("render")  # type: ignore[attr-defined]
        return None if frames is None else frames[index]

    def close(self) -> None:
        """Close the vector environment (its worker processes, for ``async``)."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self.env.unwrapped, AsyncVectorEnv):
            self.env.close(terminate=True)  # (a call may be pending after an error)
        else:
            self.env.close()

    def _first_step(self, obs: Any, infos: Mapping[str, Any]) -> TensorDict:
        """What a reset returns: the observations and the fields that come with them."""
        return _tensordict(
            {"obs": self._obs(obs), **self._read_fields([(infos, None)], None)}, self.num_envs
        )

    def _obs(self, obs: Any) -> dict[str, np.ndarray]:
        flat = self._flatten(obs)
        return {k: np.array(v) for k, v in flat.items()} if self._copy else dict(flat)

    def _final_rows(
        self, final_obs: np.ndarray, rows: np.ndarray, like: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """SAME_STEP's ``info["final_obs"]`` (one observation per row) as zeros-elsewhere rows."""
        out = {k: np.zeros_like(v) for k, v in like.items()}
        for i in np.flatnonzero(rows):
            for k, v in self._flatten(final_obs[i]).items():
                out[k][i] = v
        return out

    def _reset_rows(
        self,
        flat: dict[str, np.ndarray],
        infos: Mapping[str, Any],
        rows: np.ndarray,
        next_seeds: Sequence[int | None] | None,
    ) -> list[_Source]:
        """Reset the environments of ``rows`` into ``flat``; where observed fields are read."""
        if not rows.any():
            return [(infos, None)]
        seeds = [
            (None if next_seeds is None else next_seeds[i]) if row else None
            for i, row in enumerate(rows.tolist())
        ]
        obs, reset_infos = self.env.reset(
            seed=seeds,  # type: ignore[arg-type]  # one each (a list)
            options={"reset_mask": rows},
        )
        for k, v in self._flatten(obs).items():
            flat[k][rows] = np.asarray(v)[rows]
        return [(infos, ~rows), (reset_infos, rows)]

    def _read_fields(
        self, observed: list[_Source], steps: list[_Source] | None
    ) -> dict[str, np.ndarray]:
        """The step fields: transition ones from ``steps`` (None: ``missing``), others observed."""
        out = {}
        for key, field in self.step_fields.items():
            out[key] = field.empty(self.num_envs)
            for infos, rows in (steps or []) if field.transition else observed:
                _read_into(
                    out[key], infos, self._info_keys[key], rows, f"{self.name}: step field {key!r}"
                )
        return out

    def _episode_metrics(self, steps: list[_Source], done: np.ndarray) -> dict[str, np.ndarray]:
        """The metrics of the episodes that ended (NaN where one has no such metric)."""
        out: dict[str, np.ndarray] = {}
        for infos, rows in steps:
            where = done if rows is None else done & rows
            nested = infos.get("episode_metrics")
            if isinstance(nested, Mapping):
                for key in nested:
                    if not key.startswith("_"):
                        values = out.setdefault(key, np.full(self.num_envs, np.nan))
                        _read_into(values, nested, key, where, f"{self.name}: episode metric")
            if not self._typed and "is_success" in infos:  # (ours: in episode_metrics already)
                success = out.setdefault("success", np.full(self.num_envs, np.nan))
                unset = np.isnan(success)
                _read_into(success, infos, "is_success", where & unset, f"{self.name}: is_success")
        return out


def _declared_fields(vector: VectorEnv) -> Mapping[str, Any] | None:
    """The ``step_fields`` the environments of ``vector`` declare, if it exposes them."""
    own = getattr(vector.unwrapped, "step_fields", None)
    if own is not None:
        return own
    try:
        return vector.get_attr("step_fields")[0]  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001  (environments without the attribute declare none)
        return None


def _seeded(next_seeds: Sequence[int | None] | None, n: int) -> np.ndarray:
    """Rows whose next episode has a seed of its own."""
    if next_seeds is None:
        return np.zeros(n, dtype=bool)
    return np.array([s is not None for s in next_seeds], dtype=bool)


def _rows_or_zeros(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.zeros_like(values)
    out[rows] = values[rows]
    return out


def _read_into(
    out: np.ndarray, infos: Mapping[str, Any], key: str, rows: np.ndarray | None, what: str
) -> None:
    """``out[r] = infos[key][r]`` for the rows ``r`` of ``rows`` where ``_key`` is set."""
    values = infos.get(key)
    if values is None:
        return
    mask = infos.get(f"_{key}")
    where = np.ones(len(out), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if rows is not None:
        where = where & rows
    if not where.any():
        return
    try:
        out[where] = np.asarray(values)[where].reshape(-1, *out.shape[1:])
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{what} (info[{key!r}]) is not a {out.dtype} of shape {out.shape[1:]}: {e}"
        ) from e


def _tensordict(data: Mapping[str, Any], n: int) -> TensorDict:
    """NumPy arrays (nested by mapping) as one ``TensorDict`` of batch ``[n]`` (no copy)."""
    out: dict[Any, Any] = {}
    for key, value in data.items():
        out[key] = (
            _tensordict(value, n)
            if isinstance(value, Mapping)
            else torch.from_numpy(np.ascontiguousarray(value))
        )
    return TensorDict._new_unsafe(out, batch_size=torch.Size([n]))
