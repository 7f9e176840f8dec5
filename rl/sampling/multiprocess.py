"""Multiprocess sampler: worker processes each step several environments into shared memory.

Modelled on AllenAct's ``VectorSampledTasks`` (worker processes each running several tasks,
``max_sampler_processes_per_worker``) and PyTorchRL's collection workers, with Sample Factory's
transport: every observation, reward, flag and action lives in one shared-memory block (numpy
views over a ``multiprocessing.RawArray``), indexed by the global environment index, so only a
one-byte command goes to each worker per step and a ``None`` (or the finished episodes) comes
back.

Each worker runs a :class:`~rl.sampling.SerialSampler` over its contiguous block of
environments, built in the worker from the plain task config (``hydra.utils.instantiate`` runs
in the child), with the global seed stream (``env_offset``/``total_envs``) or its contiguous
share of the evaluation episode list. The result is therefore bitwise what one
``SerialSampler`` over all environments returns, whatever the process layout (tested).

Faults never hang: the main process waits on the pipes and the process sentinels together, so a
worker that dies (killed, segfault, ``os._exit``) is noticed at once; an environment that raises
sends its traceback. Both end every worker and raise :class:`SamplerWorkerError` naming the
worker, the global environment index and the original traceback. ``close()`` (also run by the
garbage collector and at interpreter exit) stops every worker, escalating to SIGTERM and
SIGKILL after short grace periods. Workers ignore SIGINT, so Ctrl-C reaches only the main
process, whose ``finally`` closes the sampler.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import signal
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

from rl.sampling.base import EpisodeRecord, Sampler, StepBatch
from rl.sampling.serial import SerialSampler, build_env, dict_space
from rl.utils.misc import evenly_distribute_count_into_bins

log = logging.getLogger(__name__)

__all__ = ["MultiprocessSampler", "SamplerWorkerError", "resolve_start_method"]

# Commands (main -> worker), one byte each; replies are pickled objects.
_RESET, _STEP, _CLOSE, _SAVE, _LOAD, _NEW = b"r", b"s", b"c", b"S", b"L", b"n"
_ALIGN = 64  # byte alignment of each array in the shared block
_DEAD = object()  # marks a pipe closed by a dead worker


class SamplerWorkerError(RuntimeError):
    """A sampler worker failed: an environment raised, or the process died.

    Attributes:
        worker_index: Index of the worker process.
        env_index: Global index of the environment that raised (None if unknown, e.g. a
            worker that died).
    """

    def __init__(self, message: str, *, worker_index: int, env_index: int | None) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_index = env_index


def resolve_start_method(method: str | None) -> str:
    """The start method to use: ``method`` if available, else ``spawn`` (``forkserver`` first).

    Args:
        method: ``forkserver``, ``spawn``, ``fork`` or None (``forkserver``).

    Returns:
        An available start method; ``forkserver`` falls back to ``spawn`` where it is missing.
    """
    method = method or "forkserver"
    available = mp.get_all_start_methods()
    if method in available:
        return method
    if method == "forkserver":
        log.info("start method 'forkserver' is not available here; using 'spawn'")
        return "spawn"
    raise ValueError(f"sampler.mp_start_method={method!r} is not available (have {available})")


# ----------------------------------------------------------------------- shared memory
class _SharedArrays:
    """Numpy arrays carved out of one shared byte block (same layout in every process).

    Args:
        raw: The shared block (a ``RawArray`` of bytes).
        layout: ``name -> (offset, shape, dtype string)``.
    """

    def __init__(self, raw: Any, layout: Mapping[str, tuple[int, tuple[int, ...], str]]) -> None:
        self.raw = raw
        self.layout = dict(layout)
        buffer = np.frombuffer(raw, dtype=np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        for name, (offset, shape, dtype) in self.layout.items():
            dt = np.dtype(dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.arrays[name] = buffer[offset : offset + size].view(dt).reshape(shape)

    @staticmethod
    def plan(specs: Mapping[str, tuple[tuple[int, ...], Any]]) -> tuple[dict[str, Any], int]:
        """Lay out ``name -> (shape, dtype)`` arrays; return the layout and the total bytes."""
        layout: dict[str, tuple[int, tuple[int, ...], str]] = {}
        offset = 0
        for name, (shape, dtype) in specs.items():
            dt = np.dtype(dtype)
            layout[name] = (offset, tuple(int(s) for s in shape), dt.str)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            offset += -(-size // _ALIGN) * _ALIGN
        return layout, max(offset, _ALIGN)


def _obs_key(key: str) -> str:
    return f"obs/{key}"


def _final_key(key: str) -> str:
    return f"final/{key}"


# ----------------------------------------------------------------------------- worker
def _worker_main(
    worker_index: int,
    conn: mpc.Connection,
    raw: Any,
    layout: dict[str, tuple[int, tuple[int, ...], str]],
    obs_keys: list[str],
    task: dict[str, Any],
    row_offset: int,
    env_offset: int,
    num_envs: int,
    total_envs: int,
    seed: int | None,
    episode_seeds: list[int] | None,
) -> None:
    """Worker process: a SerialSampler over global envs ``env_offset ..``, serving commands.

    Its environments' results go to rows ``row_offset ..`` of the shared arrays.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    sampler: SerialSampler | None = None
    try:
        try:
            shared = _SharedArrays(raw, layout)
            sampler = SerialSampler(
                task=task,
                num_envs=num_envs,
                seed=seed,
                episode_seeds=episode_seeds,
                env_offset=env_offset,
                total_envs=total_envs,
            )
        except BaseException:
            conn.send(("error", None, traceback.format_exc()))
            return
        conn.send(("ready", None, None))
        arr = shared.arrays
        obs_views = [(arr[_obs_key(k)], arr[_final_key(k)], k) for k in obs_keys]
        actions, rewards = arr["actions"], arr["rewards"]
        terminated, truncated = arr["terminated"], arr["truncated"]
        experts, paused = arr["expert_actions"], arr["paused"]
        while True:
            try:
                cmd = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the main process is gone
            try:
                if cmd == _STEP:
                    rows = np.asarray(sampler.active_indices, dtype=np.int64) + row_offset
                    batch = sampler.step(actions[rows])
                    for obs_buf, final_buf, k in obs_views:
                        obs_buf[rows] = batch.obs[k]
                        if len(batch.final_obs_indices):
                            final_buf[rows[batch.final_obs_indices]] = batch.final_obs[k]
                    rewards[rows] = batch.rewards
                    terminated[rows] = batch.terminated
                    truncated[rows] = batch.truncated
                    experts[rows] = batch.expert_actions
                    paused[rows] = batch.paused
                    conn.send(batch.episodes or None)
                elif cmd in (_RESET, _NEW, _LOAD):
                    if cmd == _RESET:
                        obs, expert = sampler.reset()
                    elif cmd == _NEW:
                        obs, expert = sampler.new_episodes()
                    else:
                        obs, expert = sampler.load_state_dict(conn.recv())
                    rows = np.arange(row_offset, row_offset + sampler.num_envs)
                    for obs_buf, _, k in obs_views:
                        obs_buf[rows] = obs[k]
                    experts[rows] = expert
                    paused[rows] = False
                    conn.send(None)
                elif cmd == _SAVE:
                    conn.send(sampler.state_dict())
                elif cmd == _CLOSE:
                    return
                else:
                    raise ValueError(f"unknown sampler command {cmd!r}")
            except Exception:
                conn.send(("error", sampler.current_env, traceback.format_exc()))
                return
    finally:
        if sampler is not None:
            with contextlib.suppress(Exception):
                sampler.close()
        with contextlib.suppress(Exception):
            conn.close()


def _stop_workers(
    processes: Sequence[mp.process.BaseProcess], conns: Sequence[mpc.Connection], grace: float
) -> None:
    """Ask every worker to close, then SIGTERM and SIGKILL the ones still alive; reap all."""
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.send_bytes(_CLOSE)
    deadline = time.monotonic() + grace
    for proc in processes:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
    for escalate in ("terminate", "kill"):
        alive = [p for p in processes if p.pid is not None and p.exitcode is None]
        if not alive:
            break
        for proc in alive:
            with contextlib.suppress(Exception):
                getattr(proc, escalate)()
        deadline = time.monotonic() + 1.0
        for proc in alive:
            proc.join(max(0.0, deadline - time.monotonic()))
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()
    for proc in processes:
        with contextlib.suppress(Exception):
            if proc.exitcode is not None:
                proc.close()


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died with {name}"
    return f"exited with code {exitcode}"


# ---------------------------------------------------------------------------- sampler
class MultiprocessSampler(Sampler):
    """Steps environments in ``num_processes`` worker processes through shared memory.

    Environment ``i`` (global index) lives in the worker whose contiguous block holds it; the
    blocks are ``evenly_distribute_count_into_bins(num_envs, num_processes)`` (larger first).
    Observations, rewards, flags and actions are ``[N, ...]`` shared arrays; results are bitwise
    those of a :class:`~rl.sampling.SerialSampler` with the same arguments.

    Args:
        task: Plain (resolved) task config with a ``_target_`` returning a ``gymnasium.Env``;
            every worker instantiates it itself.
        num_processes: Worker processes (capped at the number of environments).
        envs_per_process: Environments per worker when ``num_envs`` is not given.
        num_envs: Total environments, split as evenly as possible over the workers (takes
            precedence over ``envs_per_process``).
        seed: Seeds environment ``i``'s first reset with ``worker_seeds(total_envs, seed)[i]``.
        episode_seeds: Evaluation mode: a fixed list of episode seeds, split into contiguous
            shares over all environments exactly as ``SerialSampler`` splits it; an
            environment that has run its share is paused.
        mp_start_method: ``forkserver`` (falls back to ``spawn`` where unavailable), ``spawn``
            or ``fork``.
        env_offset: Global index of this sampler's first environment (samplers sharing one
            seed stream, e.g. one per distributed rank).
        total_envs: Size of the global seed stream (default ``env_offset + num_envs``).
        timeout: Seconds to wait for a worker's reply before declaring it hung (None: wait
            as long as the workers are alive; dead workers are detected at once regardless).
        start_timeout: Seconds allowed for the workers to build their environments.
    """

    def __init__(
        self,
        *,
        task: Mapping[str, Any],
        num_processes: int = 2,
        envs_per_process: int = 8,
        num_envs: int | None = None,
        seed: int | None = 0,
        episode_seeds: Sequence[int] | None = None,
        mp_start_method: str = "forkserver",
        env_offset: int = 0,
        total_envs: int | None = None,
        timeout: float | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self._closed = True
        self._processes: list[mp.process.BaseProcess] = []
        self._conns: list[mpc.Connection] = []
        self._pids: list[int | None] = []
        if num_processes < 1:
            raise ValueError(f"sampler.num_processes must be >= 1, got {num_processes}")
        if num_envs is None:
            if envs_per_process < 1:
                raise ValueError(f"sampler.envs_per_process must be >= 1, got {envs_per_process}")
            num_envs = num_processes * envs_per_process
        if num_envs < 1:
            raise ValueError(f"sampler.num_envs must be >= 1, got {num_envs}")
        self.eval_mode = episode_seeds is not None
        shares: list[list[int]] | None = None
        if episode_seeds is not None:
            if len(episode_seeds) == 0:
                raise ValueError("evaluation needs at least one episode")
            num_envs = min(num_envs, len(episode_seeds))
            counts = evenly_distribute_count_into_bins(len(episode_seeds), num_envs)
            bounds = np.cumsum([0, *counts])
            shares = [
                [int(s) for s in episode_seeds[bounds[i] : bounds[i + 1]]] for i in range(num_envs)
            ]
        self.num_envs = num_envs
        self.num_processes = min(num_processes, num_envs)
        self.env_offset = env_offset
        self.total_envs = env_offset + num_envs if total_envs is None else total_envs
        self.timeout = timeout
        self.start_method = resolve_start_method(mp_start_method)
        blocks = evenly_distribute_count_into_bins(num_envs, self.num_processes)
        starts = np.cumsum([0, *blocks])
        #: ``(first, end)`` local environment indices of each worker.
        self.worker_envs: list[tuple[int, int]] = [
            (int(starts[w]), int(starts[w + 1])) for w in range(self.num_processes)
        ]

        # Spaces from one probe environment (the workers build their own).
        probe = build_env(task)
        try:
            self._dict_obs = isinstance(probe.observation_space, gym.spaces.Dict)
            self.observation_space = dict_space(probe.observation_space)
            if not isinstance(probe.action_space, gym.spaces.Discrete):
                raise ValueError(
                    f"only Discrete action spaces are supported, got {probe.action_space}"
                )
            self.action_space: gym.spaces.Discrete = probe.action_space
        finally:
            probe.close()

        n = num_envs
        specs: dict[str, tuple[tuple[int, ...], Any]] = {}
        for key, space in self.observation_space.spaces.items():
            specs[_obs_key(key)] = ((n, *space.shape), space.dtype)
            specs[_final_key(key)] = ((n, *space.shape), space.dtype)
        specs.update(
            actions=((n,), np.int64),
            rewards=((n,), np.float32),
            terminated=((n,), np.bool_),
            truncated=((n,), np.bool_),
            expert_actions=((n,), np.int64),
            paused=((n,), np.bool_),
        )
        layout, nbytes = _SharedArrays.plan(specs)
        ctx = mp.get_context(self.start_method)
        raw = ctx.RawArray("B", nbytes)
        self._shared = _SharedArrays(raw, layout)
        self._obs_keys = list(self.observation_space.spaces)

        if self.start_method == "forkserver":
            # Workers fork from a server that has already imported this module (and the
            # main module): starting them costs a fork, not a fresh interpreter.
            ctx.set_forkserver_preload(["__main__", __name__])
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_workers, self._processes, self._conns, 2.0)
        try:
            for w, (lo, hi) in enumerate(self.worker_envs):
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    name=f"rl-sampler-{w}",
                    args=(
                        w,
                        child,
                        raw,
                        layout,
                        self._obs_keys,
                        dict(task),
                        lo,
                        env_offset + lo,
                        hi - lo,
                        self.total_envs,
                        seed,
                        None if shares is None else [s for sh in shares[lo:hi] for s in sh],
                    ),
                    daemon=True,
                )
                proc.start()
                child.close()
                self._processes.append(proc)
                self._pids.append(proc.pid)
                self._conns.append(parent)
            self._await(range(self.num_processes), start_timeout, "starting")
        except BaseException:
            self.close()
            raise
        self._active = np.arange(num_envs, dtype=np.int64)
        self._all_active = True
        self._stepping: list[int] | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers."""
        return list(self._pids)

    def _fail(self, message: str, worker: int, env_index: int | None) -> NoReturn:
        self.close()
        raise SamplerWorkerError(message, worker_index=worker, env_index=env_index)

    def _worker_label(self, w: int) -> str:
        lo, hi = self.worker_envs[w]
        lo, hi = self.env_offset + lo, self.env_offset + hi - 1
        envs = f"environment {lo}" if lo == hi else f"environments {lo}..{hi}"
        return f"sampler worker {w} (pid {self._pids[w]}, {envs})"

    def _handle(self, w: int, msg: Any, what: str) -> Any:
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            _, env_index, tb = msg
            where = (
                f"environment {env_index} raised"
                if env_index is not None
                else "failed while building its environments"
                if what == "starting"
                else "failed"
            )
            self._fail(
                f"{self._worker_label(w)}: {where} while {what}; "
                f"original traceback:\n{tb.rstrip()}",
                w,
                env_index,
            )
        return msg

    def _await(self, workers: Sequence[int], timeout: float | None, what: str) -> list[Any]:
        """Collect one reply from each of ``workers`` (in worker order); fail fast on death.

        Waits on the pipes and the process sentinels together, so a worker that dies is
        reported as soon as the operating system reaps it, not after a timeout.
        """
        replies: dict[int, Any] = {}
        pending = {w: self._conns[w] for w in workers}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            sentinels = {self._processes[w].sentinel: w for w in pending}
            ready = set(mpc.wait([*pending.values(), *sentinels], left))
            if not ready:
                late = ", ".join(self._worker_label(w) for w in pending)
                self._fail(
                    f"no reply within {timeout} s while {what} from {late}",
                    next(iter(pending)),
                    None,
                )
            for w in [w for w, c in pending.items() if c in ready]:
                try:
                    msg = pending[w].recv()
                except (EOFError, OSError):
                    msg = _DEAD
                if msg is _DEAD:
                    self._died(w, what)
                del pending[w]
                replies[w] = self._handle(w, msg, what)
            for sentinel in ready.intersection(sentinels):
                w = sentinels[sentinel]
                if w in pending and not self._poll(pending[w]):
                    self._died(w, what)
        return [replies[w] for w in workers]

    def _died(self, w: int, what: str) -> NoReturn:
        proc = self._processes[w]
        proc.join(1.0)
        self._fail(f"{self._worker_label(w)} {_exit_reason(proc.exitcode)} while {what}", w, None)

    @staticmethod
    def _poll(conn: mpc.Connection) -> bool:
        try:
            return conn.poll()
        except (EOFError, OSError):
            return False

    def _broadcast(self, workers: Sequence[int], cmd: bytes) -> None:
        for w in workers:
            try:
                self._conns[w].send_bytes(cmd)
            except (BrokenPipeError, OSError):
                pass  # dead: _await reports it through the sentinel

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the sampler is closed")

    # ----------------------------------------------------------------- interface
    @property
    def num_active(self) -> int:
        """Environments still running."""
        return len(self._active)

    def reset(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Reset every environment (training: with its seed; evaluation: its first episode)."""
        return self._reset_all(_RESET)

    def new_episodes(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Cut every episode and start new ones (unseeded resets; training mode only)."""
        if self.eval_mode:
            raise RuntimeError("new_episodes() would skip evaluation episodes")
        return self._reset_all(_NEW)

    def _reset_all(self, cmd: bytes) -> tuple[dict[str, np.ndarray], np.ndarray]:
        self._check_open()
        if self._stepping is not None:
            self.step_wait()  # finish a step left in flight
        workers = list(range(self.num_processes))
        self._broadcast(workers, cmd)
        self._await(workers, self.timeout, "resetting")
        self._active = np.arange(self.num_envs, dtype=np.int64)
        self._all_active = True
        arr = self._shared.arrays
        obs = {k: arr[_obs_key(k)].copy() for k in self._obs_keys}
        return obs, arr["expert_actions"].copy()

    def step(self, actions: np.ndarray) -> StepBatch:
        """Step the active environments; see :class:`rl.sampling.StepBatch`.

        Args:
            actions: ``[N_active]`` integer actions, in the order of the active environments.

        Returns:
            The step's results for the environments that were active before it.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step and return at once (the workers step while the caller computes).

        Finish it with :meth:`step_wait` before the next ``step``/``reset``. Two samplers over
        halves of the environments (``env_offset``/``total_envs``) give double-buffered
        sampling: one half steps while the policy acts on the other.

        Args:
            actions: ``[N_active]`` integer actions, in the order of the active environments.
        """
        self._check_open()
        if self._stepping is not None:
            raise RuntimeError("step_async called twice without step_wait")
        actions = np.asarray(actions)
        n = len(self._active)
        if actions.shape != (n,):
            raise ValueError(f"expected {n} actions, got shape {actions.shape}")
        idx: slice | np.ndarray = slice(None) if self._all_active else self._active
        self._shared.arrays["actions"][idx] = actions
        if self._all_active:
            workers = list(range(self.num_processes))
        else:
            workers = [
                w
                for w, (lo, hi) in enumerate(self.worker_envs)
                if np.any((self._active >= lo) & (self._active < hi))
            ]
        self._broadcast(workers, _STEP)
        self._stepping = workers

    def step_wait(self) -> StepBatch:
        """Wait for the step started by :meth:`step_async`; return its results."""
        self._check_open()
        if self._stepping is None:
            raise RuntimeError("step_wait called without step_async")
        workers, self._stepping = self._stepping, None
        replies = self._await(workers, self.timeout, "stepping")
        arr = self._shared.arrays
        idx: slice | np.ndarray = slice(None) if self._all_active else self._active
        episodes: list[EpisodeRecord] = [ep for r in replies if r for ep in r]
        truncated = arr["truncated"][idx].copy()
        final_idx = np.flatnonzero(truncated)
        final_obs: dict[str, np.ndarray] = {}
        if len(final_idx):
            rows = self._active[final_idx]
            final_obs = {k: arr[_final_key(k)][rows] for k in self._obs_keys}
        paused = arr["paused"][idx].copy()
        batch = StepBatch(
            obs={k: arr[_obs_key(k)][idx].copy() for k in self._obs_keys},
            rewards=arr["rewards"][idx].copy(),
            terminated=arr["terminated"][idx].copy(),
            truncated=truncated,
            expert_actions=arr["expert_actions"][idx].copy(),
            final_obs=final_obs,
            final_obs_indices=final_idx.astype(np.int64),
            episodes=episodes,
            paused=paused,
        )
        if paused.any():
            self._active = self._active[~paused]
            self._all_active = False
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight, in :class:`~rl.sampling.SerialSampler`'s format.

        Each worker saves its block (how each episode started and the actions since); the
        blocks are concatenated, so the state loads into a ``SerialSampler`` or a
        ``MultiprocessSampler`` of any layout over the same environments.

        Raises:
            NotImplementedError: In evaluation mode.
        """
        self._check_open()
        if self.eval_mode:
            raise NotImplementedError("a MultiprocessSampler in evaluation mode cannot be saved")
        workers = list(range(self.num_processes))
        self._broadcast(workers, _SAVE)
        blocks = self._await(workers, self.timeout, "saving its state")
        return {
            "num_envs": self.num_envs,
            "env_offset": self.env_offset,
            "episodes": [ep for block in blocks for ep in block["episodes"]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Restore the episodes in flight saved by :meth:`state_dict` (replaces :meth:`reset`).

        Args:
            state: From this class's or ``SerialSampler``'s ``state_dict`` over the same
                environments (``num_envs`` and ``env_offset`` must match).

        Returns:
            ``(obs [N, ...], expert_actions [N])``: what the saved sampler was about to act on.
        """
        self._check_open()
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
        workers = list(range(self.num_processes))
        for w, (lo, hi) in enumerate(self.worker_envs):
            block = {
                "num_envs": hi - lo,
                "env_offset": self.env_offset + lo,
                "episodes": state["episodes"][lo:hi],
            }
            try:
                self._conns[w].send_bytes(_LOAD)
                self._conns[w].send(block)
            except (BrokenPipeError, OSError):
                pass  # dead: _await reports it through the sentinel
        self._await(workers, self.timeout, "restoring its state")
        self._active = np.arange(self.num_envs, dtype=np.int64)
        self._all_active = True
        arr = self._shared.arrays
        obs = {k: arr[_obs_key(k)].copy() for k in self._obs_keys}
        return obs, arr["expert_actions"].copy()

    def close(self) -> None:
        """Stop every worker (idempotent; never hangs: SIGTERM, then SIGKILL)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
