"""The worker process of the multiprocess sampler: its command protocol and process body.

Each worker process runs :func:`worker_main`: a :class:`~rl.sampling.SerialSampler` over its
contiguous block of environments that serves one-byte commands from the main process
(:data:`RESET`, :data:`STEP`, ...) and writes its environments' results into their rows of the
shared arrays (:mod:`rl.sampling.shared_memory`). Replies are pickled objects: ``None``, the
finished episodes, a state dict, or ``("error", env_index, traceback)`` after which the worker
exits. :func:`worker_main` is module-level so that ``forkserver``/``spawn`` children can import
it. The main process's side is :mod:`rl.sampling.worker_pool`.

A worker never outlives the process that started it: it ends on its closed pipe when idle, and
on Linux :func:`die_with_parent` kills it with its parent process even when busy (a parent
killed with SIGKILL runs no cleanup). Collection-worker processes use the same guard, so a
learner, its collection workers and their sampler workers go together.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import select
import signal
import sys
import threading
import traceback
from typing import Any

import numpy as np
from tensordict import TensorDict

from rl.sampling.base import EpisodeRecord, finished_episodes
from rl.sampling.serial import SerialSampler
from rl.sampling.shared_memory import SharedArrays, step_key

__all__ = ["CLOSE", "LOAD", "NEW", "RESET", "SAVE", "STEP", "die_with_parent", "worker_main"]

# Commands (main -> worker), one byte each; replies are pickled objects.
RESET, STEP, CLOSE, SAVE, LOAD, NEW = b"r", b"s", b"c", b"S", b"L", b"n"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int | None = None) -> None:
    """Linux: this process is killed (SIGKILL) when its parent ends; elsewhere a no-op.

    A child whose parent was killed with SIGKILL, or is otherwise gone without cleaning up,
    goes too, even while busy (a hung environment never reads its closed pipe). Call it first
    thing in the child:

    - the process that forked this one is its parent: ``prctl(PR_SET_PDEATHSIG)``, the kernel
      kills this process when the thread that forked it exits (not inherited by its own
      children: each sets its own);
    - ``parent_pid`` is another process (a ``forkserver`` child: the fork server forked it for
      ``parent_pid``), or one that ended before this call: a thread waits on a pidfd of it and
      kills this process when it ends (zombie included). The fork server's own end does not
      count: it shares its parent's process group, so a SIGTERM to the group (the learner's
      signal to save and stop) ends it at once, and its children must live on until their
      parent closes them. Without pidfds (Linux < 5.3) the fork server's end is the best
      signal there is, and ``PR_SET_PDEATHSIG`` is set after all.

    Args:
        parent_pid: The process that started this one (None: the one that forked it).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if parent_pid is None or parent_pid == os.getppid():
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if parent_pid is None or parent_pid == os.getppid():  # not ended in between
            return
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)  # the parent is gone already
    except (AttributeError, OSError):
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        return  # no pidfds (Linux < 5.3): the closed pipe still ends an idle worker

    def watch() -> None:
        select.select([pidfd], [], [])  # readable once the parent process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def worker_main(
    worker_index: int,
    conn: mpc.Connection,
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
    """Worker process: a SerialSampler over global envs ``env_offset ..``, serving commands.

    Its environments' results go to rows ``row_offset ..`` of the shared arrays. It replies
    ``("ready", None, None)`` once its environments are built, or an error reply if building
    them failed.
    """
    creator = mp.parent_process()  # the sampler's process (a forkserver child's parent differs)
    die_with_parent(None if creator is None else creator.pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    sampler: SerialSampler | None = None
    try:
        try:
            shared = SharedArrays(raw, layout)
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
        _serve(conn, sampler, _WorkerRows(shared.arrays, row_offset))
    finally:
        if sampler is not None:
            with contextlib.suppress(Exception):
                sampler.close()
        with contextlib.suppress(Exception):
            conn.close()


def _is_final(key: str | tuple[str, str]) -> bool:
    return isinstance(key, tuple) and key[0] == "final_obs"


class _WorkerRows:
    """One worker's writer into its rows (``row_offset ..``) of the shared arrays.

    Every shared array but the actions and the final observations holds the step
    ``TensorDict`` entry of its name (:func:`~rl.sampling.shared_memory.step_key`), so a task's
    own step fields are written like the observations, with no list of fields here.

    Args:
        arrays: The shared arrays, by name.
        row_offset: Shared-array row of the worker's first environment.
    """

    def __init__(self, arrays: dict[str, np.ndarray], row_offset: int) -> None:
        self.row_offset = row_offset
        self.actions, self.paused = arrays["actions"], arrays["paused"]
        self.per_step = [(a, step_key(k)) for k, a in arrays.items() if k != "actions"]
        self.finals = [(a, key) for a, key in self.per_step if _is_final(key)]
        self.per_step = [(a, key) for a, key in self.per_step if not _is_final(key)]
        # what a reset writes: the observations and the task's fields
        flags = ("rewards", "terminated", "truncated", "paused")
        self.on_reset = [(a, key) for a, key in self.per_step if key not in flags]

    def step(self, sampler: SerialSampler) -> list[EpisodeRecord] | None:
        """Step the active environments with their shared actions; write back the results.

        Returns:
            The episodes that finished, or None if none did.
        """
        rows = np.asarray(sampler.active_indices, dtype=np.int64) + self.row_offset
        step = sampler.step(self.actions[rows])
        for buf, key in self.per_step:
            buf[rows] = step.get(key).numpy()
        if "final_obs" in step.keys():
            truncated = step.get("truncated").numpy()
            for buf, key in self.finals:
                buf[rows[truncated]] = step.get(key).numpy()[truncated]
        return finished_episodes(step) or None

    def restart(self, num_envs: int, first: TensorDict) -> None:
        """Write the first observations (and fields) of all ``num_envs`` environments."""
        rows = np.arange(self.row_offset, self.row_offset + num_envs)
        for buf, key in self.on_reset:
            buf[rows] = first.get(key).numpy()
        self.paused[rows] = False


def _serve(conn: mpc.Connection, sampler: SerialSampler, rows: _WorkerRows) -> None:
    """Serve commands until told to close, the main process goes, or a command fails.

    A failing command sends ``("error", env_index, traceback)`` and ends the loop.
    """
    while True:
        try:
            cmd = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the main process is gone
        try:
            if cmd == STEP:
                conn.send(rows.step(sampler))
            elif cmd in (RESET, NEW, LOAD):
                if cmd == RESET:
                    first = sampler.reset()
                elif cmd == NEW:
                    first = sampler.new_episodes()
                else:
                    first = sampler.load_state_dict(conn.recv())
                rows.restart(sampler.num_envs, first)
                conn.send(None)
            elif cmd == SAVE:
                conn.send(sampler.state_dict())
            elif cmd == CLOSE:
                return
            else:
                raise ValueError(f"unknown sampler command {cmd!r}")
        except Exception:
            conn.send(("error", sampler.current_env, traceback.format_exc()))
            return
