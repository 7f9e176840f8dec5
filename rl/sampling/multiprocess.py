"""Multiprocess sampler: child processes each step several environments into shared memory.

Modelled on AllenAct's ``VectorSampledTasks`` (child processes each running several tasks,
``max_sampler_processes_per_worker``) and PyTorchRL's collection workers, with Sample Factory's
transport: every observation, reward, flag and action lives in one shared-memory block (numpy
views over a ``multiprocessing.RawArray``), indexed by the global environment index, so only a
``step`` call goes to each process per step and a ``None`` (or the finished episodes) comes
back.

Each process runs a :class:`~rl.sampling.SerialSampler` over its contiguous block of
environments, built in the process from the plain task config (``hydra.utils.instantiate`` runs
in the child), with the global seed stream (``env_offset``/``total_envs``) or its contiguous
share of the evaluation episode list. The result is therefore bitwise what one
``SerialSampler`` over all environments returns, whatever the process layout (tested).

The processes are children of the process runtime (:class:`~rl.utils.processes.ChildProcesses`),
started, called, watched and ended as process collection workers and validation are. Faults
never hang: a process that dies (killed, segfault, ``os._exit``) is noticed at once; an
environment that raises sends its traceback. Both end every process and raise
:class:`SamplerProcessError` naming the process, the global environment index and the original
traceback. An environment that hangs is caught by ``timeout`` (:data:`DEFAULT_TIMEOUT_S` seconds
per step by default): a warning names the silent process, its pid and its environments after half
of it, and the timeout ends every process with a ``SamplerProcessError`` naming them. ``close()``
(also run by the garbage collector and at interpreter exit) stops every process, escalating to
SIGKILL after a short grace period. Processes ignore SIGINT and SIGTERM, so Ctrl-C and a SIGTERM
to the process group (SLURM's) reach only the main process, which finishes its rollout, saves
and closes the sampler; on Linux they are killed with the process
that started them (:func:`~rl.utils.processes.die_with_parent`), even one killed with SIGKILL.

This module is the sampler itself: the environment layout over the processes, the shared arrays
and the :class:`~rl.sampling.Sampler` interface. What a child process runs is
:class:`~rl.sampling.sampler_process.SamplerProcess`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
from tensordict import TensorDict

from rl.sampling.base import (
    MAX_NUM_ENVS,
    EpisodeRecord,
    Sampler,
    split_episode_seeds,
    step_tensordict,
)
from rl.sampling.sampler_process import SamplerProcess, final_key, obs_key, sampler_array_specs
from rl.tasks.agents import num_agents
from rl.tasks.factory import build_env, dict_space, env_name
from rl.tasks.fields import step_fields_of
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

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MultiprocessSampler",
    "SamplerProcessError",
    "sampler_processes",
]

# Seconds a process may take to reply to one step (or reset, or save) before it counts as hung.
# Generous: the slowest shipped task (nav3d) steps in about 2 ms and resets in about 30 ms
# (first reset of a process 0.3 s), so a step of 8 environments that all reset takes well under
# 1 s and a first reset of 16 about 5 s, even on a loaded machine.
DEFAULT_TIMEOUT_S = 60.0


def _count_envs(num_processes: int, envs_per_process: int, num_envs: int | None) -> int:
    """Total environments: ``num_envs``, else ``num_processes * envs_per_process`` (validated).

    ``num_processes`` is a number here (``auto`` resolved by :func:`sampler_processes`).
    """
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
    """``sampler.num_processes`` as a number.

    ``auto`` is the cores this process may use less one (the learner's), at most one a given
    environment (:func:`rl.utils.threads.auto_count`).
    """
    return auto_count(num_processes, num_envs, "sampler.num_processes")


class SamplerProcessError(ChildFailed):
    """A sampler process failed: an environment raised, or the process died or hung.

    Attributes:
        process_index: Index of the child process.
        env_index: Global index of the environment that raised (None if unknown, e.g. a
            process that died).
    """

    @property
    def process_index(self) -> int:
        """Index of the child process."""
        return self.child

    @property
    def env_index(self) -> int | None:
        """Global index of the environment that raised (None if unknown)."""
        return self.site_index


# ---------------------------------------------------------------------------- sampler
class MultiprocessSampler(Sampler):
    """Steps environments in ``num_processes`` child processes through shared memory.

    Environment ``i`` (global index) lives in the process whose contiguous block holds it; the
    blocks are ``evenly_distribute_count_into_bins(num_envs, num_processes)`` (larger first).
    Observations, rewards, flags and actions are ``[N, ...]`` shared arrays; results are bitwise
    those of a :class:`~rl.sampling.SerialSampler` with the same arguments.

    Args:
        task: Plain (resolved) task config with a ``_target_`` returning a ``gymnasium.Env``;
            every process instantiates it itself.
        num_processes: Child processes (capped at the number of environments).
        envs_per_process: Environments per process when ``num_envs`` is not given.
        num_envs: Total environments, split as evenly as possible over the processes (takes
            precedence over ``envs_per_process``).
        seed: Seeds environment ``i``'s first reset with ``env_seeds(total_envs, seed)[i]``.
        episode_seeds: Evaluation mode: a fixed list of episode seeds, split into contiguous
            shares over all environments exactly as ``SerialSampler`` splits it; an
            environment that has run its share is paused.
        mp_start_method: ``forkserver`` (falls back to ``spawn`` where unavailable), ``spawn``
            or ``fork``.
        env_offset: Global index of this sampler's first environment (samplers sharing one
            seed stream, e.g. one per distributed rank).
        total_envs: Size of the global seed stream (default ``env_offset + num_envs``).
        timeout: Seconds a live process may take to reply to one step, reset or save before
            it counts as hung (a warning names it after half of that; None: wait as long as
            the processes live). Dead processes are detected at once regardless.
        start_timeout: Seconds allowed for the processes to build their environments (and to
            restore saved episodes, which replays them, if longer than ``timeout``).
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
        #: ``(first, end)`` local environment indices of each process.
        self.process_envs: list[tuple[int, int]] = [
            (int(starts[w]), int(starts[w + 1])) for w in range(self.num_processes)
        ]
        self._probe_spaces(task)

        ctx = process_context(self.start_method)
        layout, nbytes = SharedArrays.plan(
            sampler_array_specs(
                self.observation_space, num_envs, self.action_space, self.step_fields
            )
        )
        raw = ctx.RawArray("B", nbytes)
        self._shared = SharedArrays(raw, layout)
        self._obs_keys = list(self.observation_space.spaces)
        self._start_workers(raw, layout, task, seed, shares, start_timeout)
        self._active = np.arange(num_envs, dtype=np.int64)
        self._all_active = True
        self._stepping: list[Call] | None = None

    def _probe_spaces(self, task: Mapping[str, Any]) -> None:
        """Set the spaces from one probe environment (the processes build their own)."""
        probe = build_env(task)
        try:
            name = env_name(task, probe)
            self._dict_obs = isinstance(
                probe.observation_space, gym.spaces.Dict | gym.spaces.Tuple
            )
            self.observation_space = dict_space(probe.observation_space, name)
            self.step_fields = step_fields_of(task, probe, name)
            self.action_space: gym.Space = check_action_space(
                probe.action_space, name, num_agents(self.step_fields)
            )
            self._action_shape = action_array_spec(self.action_space)[0]
        finally:
            probe.close()

    def _start_workers(
        self,
        raw: Any,
        layout: dict[str, tuple[int, tuple[int, ...], str]],
        task: Mapping[str, Any],
        seed: int | None,
        shares: list[list[int]] | None,
        start_timeout: float,
    ) -> None:
        """Start a child process per block; wait until all have built their environments."""
        off = self.env_offset
        kwargs = [
            {
                "raw": raw,
                "layout": layout,
                "task": dict(task),
                "row_offset": lo,
                "env_offset": off + lo,
                "num_envs": hi - lo,
                "total_envs": self.total_envs,
                "seed": seed,
                "episode_seeds": None
                if shares is None
                else [s for sh in shares[lo:hi] for s in sh],
            }
            for lo, hi in self.process_envs
        ]
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
        """The process pool, checking that the sampler is open (RuntimeError if closed)."""
        if self._pool is None or self._pool.closed:
            raise RuntimeError("the sampler is closed")
        return self._pool

    # ----------------------------------------------------------------- interface
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
        """Step the active environments (:func:`~rl.sampling.base.step_tensordict`).

        Args:
            actions: ``[N_active, ...]`` actions, in the order of the active environments.

        Returns:
            The step's results for the environments that were active before it.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step and return at once (the processes step while the caller computes).

        Finish it with :meth:`step_wait` before the next ``step``/``reset``. Two samplers over
        halves of the environments (``env_offset``/``total_envs``) give double-buffered
        sampling: one half steps while the policy acts on the other.

        Args:
            actions: ``[N_active, ...]`` actions, in the order of the active environments.
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

        Each process saves its block (how each episode started and the actions since); the
        blocks are concatenated, so the state loads into a ``SerialSampler`` or a
        ``MultiprocessSampler`` of any layout over the same environments.

        Raises:
            NotImplementedError: In evaluation mode.
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
        """Restore the episodes in flight saved by :meth:`state_dict` (replaces :meth:`reset`).

        Args:
            state: From this class's or ``SerialSampler``'s ``state_dict`` over the same
                environments (``num_envs`` and ``env_offset`` must match).

        Returns:
            What :meth:`reset` returns: what the saved sampler was about to act on.
        """
        pool = self._open_pool()
        if self.eval_mode:
            raise NotImplementedError(
                "a MultiprocessSampler in evaluation mode cannot be restored"
            )
        if int(state["num_envs"]) != self.num_envs or int(state["env_offset"]) != self.env_offset:
            raise ValueError(
                f"sampler state for {state['num_envs']} envs at offset {state['env_offset']}, "
                f"but this sampler has {self.num_envs} at offset {self.env_offset}"
            )
        if self._stepping is not None:
            self.step_wait()
        calls = [
            pool.call(
                w,
                "load_state_dict",
                {
                    "num_envs": hi - lo,
                    "env_offset": self.env_offset + lo,
                    "episodes": state["episodes"][lo:hi],
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
