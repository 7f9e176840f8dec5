"""Multiprocess sampler: child processes each step a block of environments into shared memory.

AllenAct's ``VectorSampledTasks`` layout with Sample Factory's transport: every observation,
reward, flag and action lives in one shared-memory block (NumPy views over a ``RawArray``) with
a row per environment, so a step sends each process a ``step`` call and gets back ``None`` or the
finished episodes. Each process runs a :class:`~rl.sampling.SerialSampler` over its contiguous
block (building it from the plain task config) with the global seed stream, so the result is
bitwise one ``SerialSampler``'s over all environments, whatever the layout.

The processes run on :class:`~rl.utils.processes.ChildProcesses`: a process that dies or an
environment that raises ends them all with a :class:`SamplerProcessError` naming the process,
the environment and the traceback; one silent past ``timeout`` is named at half of it, then
ends them all. Processes ignore SIGINT and SIGTERM (the main process finishes its rollout, saves
and closes the sampler) and die with their parent on Linux, even one killed with SIGKILL.
"""

from __future__ import annotations

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
    finished_episodes,
    split_episode_seeds,
    step_tensordict,
)
from rl.sampling.serial import SerialSampler
from rl.tasks.agents import num_agents
from rl.tasks.env_state import checked_episodes
from rl.tasks.factory import build_env, dict_space, env_name
from rl.tasks.fields import StepField, step_fields_of
from rl.tasks.spaces import action_array_spec, check_action_space
from rl.utils.config import MAX_WORKERS, Check
from rl.utils.misc import evenly_distribute_count_into_bins
from rl.utils.processes import (
    Call,
    ChildFailed,
    ChildProcesses,
    process_context,
    resolve_start_method,
)
from rl.utils.shared_memory import SharedArrays
from rl.utils.threads import auto_count

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MultiprocessSampler",
    "SamplerProcess",
    "SamplerProcessError",
    "final_key",
    "obs_key",
    "sampler_array_specs",
    "sampler_processes",
    "step_key",
]

# Seconds a process may take to reply to one step, reset or save: the slowest shipped task
# (nav3d) takes well under 1 s for a step of 8 environments that all reset.
DEFAULT_TIMEOUT_S = 60.0


def obs_key(key: str) -> str:
    """The shared array holding observation ``key``."""
    return f"obs/{key}"


def final_key(key: str) -> str:
    """The shared array holding the final observation ``key`` of truncated episodes."""
    return f"final_obs/{key}"


def step_key(name: str) -> str | tuple[str, str]:
    """The step ``TensorDict`` key of shared array ``name`` (``obs/k`` -> ``("obs", "k")``)."""
    head, sep, tail = name.partition("/")
    return (head, tail) if sep else name


def sampler_array_specs(
    observation_space: gym.spaces.Dict,
    num_envs: int,
    action_space: gym.Space,
    step_fields: Mapping[str, StepField],
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The shared arrays, ``name -> (shape, dtype)`` with ``num_envs`` rows each.

    Observations and final observations by key, actions, rewards, flags, and the step fields,
    named by their step ``TensorDict`` keys (:func:`step_key`).
    """
    n = num_envs
    action_shape, action_dtype = action_array_spec(action_space)
    specs: dict[str, tuple[tuple[int, ...], Any]] = {}
    for key, space in observation_space.spaces.items():
        shape = tuple(space.shape or ())
        specs[obs_key(key)] = ((n, *shape), space.dtype)
        specs[final_key(key)] = ((n, *shape), space.dtype)
    specs.update(
        actions=((n, *action_shape), action_dtype),
        rewards=((n,), np.float32),
        terminated=((n,), np.bool_),
        truncated=((n,), np.bool_),
        paused=((n,), np.bool_),
    )
    for key, field in step_fields.items():
        specs[key] = ((n, *field.shape), field.dtype)
    return specs


def _count_envs(num_processes: int, envs_per_process: int, num_envs: int | None) -> int:
    """Total environments: ``num_envs``, else ``num_processes * envs_per_process`` (validated)."""
    if num_processes < 1:
        raise ValueError(f"sampler.num_processes must be >= 1, got {num_processes}")
    if num_envs is None:
        if envs_per_process < 1:
            raise ValueError(f"sampler.envs_per_process must be >= 1, got {envs_per_process}")
        num_envs = num_processes * envs_per_process
    if num_envs < 1:
        raise ValueError(f"sampler.num_envs must be >= 1, got {num_envs}")
    return num_envs


def sampler_processes(num_processes: int | str, num_envs: int | None) -> int:
    """``sampler.num_processes`` as a number (``auto``: :func:`rl.utils.threads.auto_count`)."""
    return auto_count(num_processes, num_envs, "sampler.num_processes")


class SamplerProcessError(ChildFailed):
    """A sampler process failed: an environment raised, or the process died or hung."""

    @property
    def process_index(self) -> int:
        """Index of the child process."""
        return self.child

    @property
    def env_index(self) -> int | None:
        """Global index of the environment that raised (None if unknown)."""
        return self.site_index


class MultiprocessSampler(Sampler):
    """Steps environments in ``num_processes`` child processes through shared memory.

    Each process holds a contiguous block of environments (larger blocks first); results are
    bitwise a :class:`~rl.sampling.SerialSampler`'s with the same arguments.

    Args:
        task: Plain (resolved) task config; every process instantiates it itself.
        num_processes: Child processes (capped at the number of environments).
        envs_per_process: Environments per process when ``num_envs`` is not given.
        num_envs: Total environments, split as evenly as possible over the processes.
        seed: Seed of the first resets, as :class:`~rl.sampling.SerialSampler`'s.
        episode_seeds: Evaluation mode: fixed episode seeds, split as the serial sampler does.
        mp_start_method: ``forkserver`` (else ``spawn`` where unavailable), ``spawn`` or ``fork``.
        env_offset: Global index of this sampler's first environment.
        total_envs: Size of the global seed stream (default ``env_offset + num_envs``).
        timeout: Seconds a live process may take to reply to one call before it counts as hung
            (warning at half; None: wait while it lives). A dead process is noticed at once.
        start_timeout: Seconds for the processes to build their environments (and to restore
            saved episodes, which replays them, if longer than ``timeout``).
    """

    def __init__(
        self,
        *,
        task: Mapping[str, Any],
        num_processes: Annotated[int | str, Check(ge=1, le=MAX_WORKERS, words=("auto",))] = 2,
        envs_per_process: Annotated[int, Check(ge=1, le=MAX_NUM_ENVS)] = 8,
        num_envs: Annotated[int | None, Check(ge=1, le=MAX_NUM_ENVS)] = None,
        seed: int | None = 0,
        episode_seeds: Sequence[int] | None = None,
        mp_start_method: str = "forkserver",
        env_offset: int = 0,
        total_envs: int | None = None,
        timeout: Annotated[float | None, Check(gt=0)] = DEFAULT_TIMEOUT_S,
        start_timeout: Annotated[float, Check(gt=0)] = 300.0,
    ) -> None:
        self._pool: ChildProcesses | None = None
        num_processes = sampler_processes(num_processes, num_envs)
        num_envs = _count_envs(num_processes, envs_per_process, num_envs)
        self.eval_mode = episode_seeds is not None
        shares: list[list[int]] | None = None
        if episode_seeds is not None:
            shares = split_episode_seeds(episode_seeds, num_envs)
            num_envs = len(shares)
        self.num_envs = num_envs
        self.num_processes = min(num_processes, num_envs)
        self.env_offset = env_offset
        self.total_envs = env_offset + num_envs if total_envs is None else total_envs
        self.timeout = timeout
        self._restore_timeout = None if timeout is None else max(timeout, start_timeout)
        self.start_method = resolve_start_method(mp_start_method, "sampler.mp_start_method")
        blocks = evenly_distribute_count_into_bins(num_envs, self.num_processes)
        starts = np.cumsum([0, *blocks])
        # (first, end) local environment indices of each process
        self.process_envs: list[tuple[int, int]] = [
            (int(starts[w]), int(starts[w + 1])) for w in range(self.num_processes)
        ]
        probe = build_env(task)  # for the spaces; the processes build their own
        try:
            name = env_name(task, probe)
            self.observation_space = dict_space(probe.observation_space, name)
            self.step_fields = step_fields_of(task, probe, name)
            self.action_space: gym.Space = check_action_space(
                probe.action_space, name, num_agents(self.step_fields)
            )
            self._action_shape = action_array_spec(self.action_space)[0]
        finally:
            probe.close()

        ctx = process_context(self.start_method)
        layout, nbytes = SharedArrays.plan(
            sampler_array_specs(
                self.observation_space, num_envs, self.action_space, self.step_fields
            )
        )
        raw = ctx.RawArray("B", nbytes)
        self._shared = SharedArrays(raw, layout)
        self._obs_keys = list(self.observation_space.spaces)
        kwargs = [
            {
                "raw": raw,
                "layout": layout,
                "task": dict(task),
                "row_offset": lo,
                "env_offset": env_offset + lo,
                "num_envs": hi - lo,
                "total_envs": self.total_envs,
                "seed": seed,
                "episode_seeds": None
                if shares is None
                else [s for sh in shares[lo:hi] for s in sh],
            }
            for lo, hi in self.process_envs
        ]
        # Returns once every process has built its environments.
        self._pool = ChildProcesses(
            SamplerProcess,
            kwargs,
            name="rl-sampler",
            label=self._label,
            start_method=self.start_method,
            start_timeout=start_timeout,
            error=SamplerProcessError,
            timeout_key="sampler.timeout",
        )
        self._active = np.arange(num_envs, dtype=np.int64)
        self._all_active = True
        self._stepping: list[Call] | None = None

    def _label(self, w: int, pid: int | None) -> str:
        lo, hi = self.process_envs[w]
        lo, hi = self.env_offset + lo, self.env_offset + hi - 1
        envs = f"environment {lo}" if lo == hi else f"environments {lo}..{hi}"
        return f"sampler process {w} (pid {pid}, {envs})"

    @property
    def process_pids(self) -> list[int | None]:
        """Process ids of the child processes."""
        return [] if self._pool is None else list(self._pool.pids)

    def _open_pool(self) -> ChildProcesses:
        """The process pool (RuntimeError if the sampler is closed)."""
        if self._pool is None or self._pool.closed:
            raise RuntimeError("the sampler is closed")
        return self._pool

    @property
    def num_active(self) -> int:
        """Environments still running."""
        return len(self._active)

    def reset(self) -> TensorDict:
        """Reset every environment (training: with its seed; evaluation: its first episode)."""
        return self._reset_all("reset")

    def new_episodes(self) -> TensorDict:
        """Cut every episode and start new ones (unseeded resets; training mode only)."""
        if self.eval_mode:
            raise RuntimeError("new_episodes() would skip evaluation episodes")
        return self._reset_all("new_episodes")

    def _reset_all(self, method: str) -> TensorDict:
        pool = self._open_pool()
        if self._stepping is not None:
            self.step_wait()  # finish a step left in flight
        pool.gather(pool.call_each(range(self.num_processes), method), self.timeout, "resetting")
        return self._restarted()

    def _restarted(self) -> TensorDict:
        """Mark every environment active; copy out their first observations and fields."""
        self._active = np.arange(self.num_envs, dtype=np.int64)
        self._all_active = True
        arr = self._shared.arrays
        obs = {k: arr[obs_key(k)].copy() for k in self._obs_keys}
        return step_tensordict(obs, {k: arr[k].copy() for k in self.step_fields})

    def step(self, actions: np.ndarray) -> TensorDict:
        """Step the active environments with ``[N_active, ...]`` actions (:meth:`Sampler.step`)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step with ``[N_active, ...]`` actions and return; :meth:`step_wait` ends it.

        Two samplers over halves of the environments (``env_offset``/``total_envs``) give
        double-buffered sampling: one half steps while the policy acts on the other.
        """
        pool = self._open_pool()
        if self._stepping is not None:
            raise RuntimeError("step_async called twice without step_wait")
        actions = np.asarray(actions)
        n = len(self._active)
        if actions.shape != (n, *self._action_shape):
            raise ValueError(
                f"expected {n} actions of shape {self._action_shape} for {self.action_space}, "
                f"got shape {actions.shape}"
            )
        idx: slice | np.ndarray = slice(None) if self._all_active else self._active
        self._shared.arrays["actions"][idx] = actions
        if self._all_active:
            processes = list(range(self.num_processes))
        else:
            processes = [
                w
                for w, (lo, hi) in enumerate(self.process_envs)
                if np.any((self._active >= lo) & (self._active < hi))
            ]
        self._stepping = pool.call_each(processes, "step")

    def step_wait(self) -> TensorDict:
        """Wait for the step started by :meth:`step_async`; return its results."""
        pool = self._open_pool()
        if self._stepping is None:
            raise RuntimeError("step_wait called without step_async")
        calls, self._stepping = self._stepping, None
        replies = pool.gather(calls, self.timeout, "stepping")
        arr = self._shared.arrays
        idx: slice | np.ndarray = slice(None) if self._all_active else self._active
        episodes: list[EpisodeRecord] = [ep for r in replies if r for ep in r]
        truncated = arr["truncated"][idx].copy()
        final_obs: dict[str, np.ndarray] = {}
        if truncated.any():  # zeros where the episode was not truncated, as SerialSampler's
            final_obs = {k: arr[final_key(k)][idx].copy() for k in self._obs_keys}
            for rows in final_obs.values():
                rows[~truncated] = 0
        paused = arr["paused"][idx].copy()
        batch = step_tensordict(
            {k: arr[obs_key(k)][idx].copy() for k in self._obs_keys},
            {k: arr[k][idx].copy() for k in self.step_fields},
            rewards=arr["rewards"][idx].copy(),
            terminated=arr["terminated"][idx].copy(),
            truncated=truncated,
            paused=paused,
            final_obs=final_obs,
            episodes=episodes,
        )
        if paused.any():
            self._active = self._active[~paused]
            self._all_active = False
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight, in :class:`~rl.sampling.SerialSampler`'s format.

        The processes' blocks are concatenated, so the state loads into a sampler of any layout
        over the same environments. Not in evaluation mode.
        """
        pool = self._open_pool()
        if self.eval_mode:
            raise NotImplementedError("a MultiprocessSampler in evaluation mode cannot be saved")
        calls = pool.call_each(range(self.num_processes), "state_dict")
        blocks = pool.gather(calls, self.timeout, "saving its state")
        return {
            "num_envs": self.num_envs,
            "env_offset": self.env_offset,
            "episodes": [ep for block in blocks for ep in block["episodes"]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore a serial or multiprocess ``state_dict`` of the same environments.

        Returns what :meth:`reset` would: what the saved sampler was about to act on.
        """
        pool = self._open_pool()
        if self.eval_mode:
            raise NotImplementedError(
                "a MultiprocessSampler in evaluation mode cannot be restored"
            )
        check_state_layout(state, self.num_envs, self.env_offset)
        episodes = checked_episodes(state, self.num_envs, self.action_space)
        if self._stepping is not None:
            self.step_wait()
        calls = [
            pool.call(
                w,
                "load_state_dict",
                {
                    "num_envs": hi - lo,
                    "env_offset": self.env_offset + lo,
                    "episodes": episodes[lo:hi],
                },
            )
            for w, (lo, hi) in enumerate(self.process_envs)
        ]
        pool.gather(calls, self._restore_timeout, "restoring its state")
        return self._restarted()

    def close(self) -> None:
        """Stop every process (idempotent; never hangs: SIGKILL after a grace period)."""
        if self._pool is not None:
            self._pool.close()


# ------------------------------------------------------------------ child process
class SamplerProcess:
    """What a child process serves: a serial sampler over its block, writing its shared rows.

    ``row_offset`` is the block's first row in the shared arrays (``raw`` laid out as
    ``layout``), ``env_offset`` its global index; the other arguments are the serial sampler's.
    Every array but the actions holds the step entry of its name (:func:`step_key`), so the
    task's step fields need no list here. Only finished episodes go back through the pipe.
    """

    def __init__(
        self,
        *,
        raw: Any,
        layout: dict[str, tuple[int, tuple[int, ...], str]],
        task: dict[str, Any],
        row_offset: int,
        env_offset: int,
        num_envs: int,
        total_envs: int,
        seed: int | None,
        episode_seeds: list[int] | None,
    ) -> None:
        arrays = SharedArrays(raw, layout).arrays
        self.row_offset = row_offset
        self.actions, self.paused = arrays["actions"], arrays["paused"]
        named = [(a, step_key(k)) for k, a in arrays.items() if k != "actions"]
        self.finals = [(a, key) for a, key in named if _is_final(key)]
        self.per_step = [(a, key) for a, key in named if not _is_final(key)]
        flags = ("rewards", "terminated", "truncated", "paused")
        self.on_reset = [(a, key) for a, key in self.per_step if key not in flags]
        self.sampler = SerialSampler(
            task=task,
            num_envs=num_envs,
            seed=seed,
            episode_seeds=episode_seeds,
            env_offset=env_offset,
            total_envs=total_envs,
        )

    def step(self) -> list[EpisodeRecord] | None:
        """Step the active environments with their shared actions; the finished episodes."""
        rows = np.asarray(self.sampler.active_indices, dtype=np.int64) + self.row_offset
        step = self.sampler.step(self.actions[rows])
        for buf, key in self.per_step:
            buf[rows] = step.get(key).numpy()
        if "final_obs" in step.keys():
            truncated = step.get("truncated").numpy()
            for buf, key in self.finals:
                buf[rows[truncated]] = step.get(key).numpy()[truncated]
        return finished_episodes(step) or None

    def reset(self) -> None:
        """Reset every environment; write the first observations."""
        self._restart(self.sampler.reset())

    def new_episodes(self) -> None:
        """Cut every episode and start new ones; write the first observations."""
        self._restart(self.sampler.new_episodes())

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight of this block (:meth:`SerialSampler.state_dict`)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this block's episodes; write what the saved sampler was about to act on."""
        self._restart(self.sampler.load_state_dict(state))

    def _restart(self, first: TensorDict) -> None:
        """Write every environment's first observations and fields."""
        rows = np.arange(self.row_offset, self.row_offset + self.sampler.num_envs)
        for buf, key in self.on_reset:
            buf[rows] = first.get(key).numpy()
        self.paused[rows] = False

    def failure_site(self) -> tuple[str | None, int | None]:
        """The environment that was running when a call raised (global index)."""
        env = self.sampler.current_env
        return (None, None) if env is None else (f"environment {env}", env)

    def close(self) -> None:
        """Close the environments."""
        self.sampler.close()


def _is_final(key: str | tuple[str, str]) -> bool:
    return isinstance(key, tuple) and key[0] == "final_obs"
