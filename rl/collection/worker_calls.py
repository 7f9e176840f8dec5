"""Calls to collection workers and their watchdog: how the learner talks to its workers.

A worker silent for half of its budget is named in a warning, one silent for all of it is a
:class:`CollectionWorkerError`. Calls whose outcome nobody waits for at once (settings, weights)
are kept as *acks* and checked with the worker's next results, so no failure is left unread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl.collection.episodes import EvalResult, summarise_episodes
from rl.collection.hosts import CollectionWorkerError, ProcessHosts, RayHosts, WorkerHosts
from rl.collection.worker import CollectionWorker
from rl.utils.deadline import Deadline
from rl.utils.misc import evenly_distribute_count_into_bins

__all__ = ["ROLLOUT_UNIT_STEPS", "START_TIMEOUT_S", "WorkerCalls"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # for workers to start (build their environments)
ROLLOUT_UNIT_STEPS = 128  # collector.timeout is seconds per this many steps of a rollout


class WorkerCalls:
    """The workers of one collection set: start them, call them, wait for them, end them.

    Args:
        kwargs: Each worker's :class:`~rl.collection.worker.CollectionWorker` arguments.
        env_slices: Each worker's environments (for messages).
        ray_options: Ray only: :class:`~rl.collection.hosts.RayHosts`' placement arguments.
        timeout: The watchdog's seconds per call unit (None: none; see :meth:`budget`).
        owner: ``"rank 1 "`` under DDP: every message names the rank that owns the worker.
    """

    def __init__(
        self,
        kwargs: Sequence[Mapping[str, Any]],
        env_slices: Sequence[slice],
        *,
        backend: str,
        ray_options: Mapping[str, Any],
        timeout: float | None,
        owner: str = "",
    ) -> None:
        self.env_slices = list(env_slices)
        self.timeout, self.owner = timeout, owner
        self.hosts: WorkerHosts
        if backend == "ray":
            self.hosts = RayHosts(
                CollectionWorker,
                list(kwargs),
                start_timeout=START_TIMEOUT_S,
                owner=owner,
                **ray_options,
            )
        else:
            self.hosts = ProcessHosts(
                CollectionWorker, list(kwargs), start_timeout=START_TIMEOUT_S, owner=owner
            )
        self.pids: list[int] = list(self.hosts.pids)
        self.num_workers = len(kwargs)
        self.acks: list[tuple[int, Any]] = []  # (worker, call) checked with its next results
        self.unread: list[list[Any]] = [[] for _ in kwargs]  # each worker's calls, in order
        self.longest = 1  # the longest rollout asked for (steps): the watchdog's scale
        self.hung = False  # a worker did not answer in time (close does not wait long)

    def label(self, worker: int) -> str:
        """``collection worker 1 (pid 4242, environments 8-15)``, for messages."""
        envs = self.env_slices[worker]
        where = (
            f"environment {envs.start}"
            if envs.stop - envs.start == 1
            else f"environments {envs.start}-{envs.stop - 1}"
        )
        return f"{self.owner}collection worker {worker} (pid {self.pids[worker]}, {where})"

    def budget(self, units: float = 1.0) -> float | None:
        """The watchdog's seconds for a call of ``units`` (None: no watchdog).

        Every call may wait behind a rollout in flight, so each gets a rollout's budget
        (``timeout`` per :data:`ROLLOUT_UNIT_STEPS` steps of the longest rollout asked for)
        plus ``units - 1`` more ``timeout`` s.
        """
        if self.timeout is None:
            return None
        rollout = max(1, math.ceil(self.longest / ROLLOUT_UNIT_STEPS))
        return self.timeout * (rollout + max(0.0, units - 1.0))

    def call(self, worker: int, method: str, *args: Any) -> Any:
        """``method(*args)`` on ``worker``; its handle."""
        ref = self.hosts.call(worker, method, *args)
        self.unread[worker].append(ref)
        return ref

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every worker."""
        return [self.call(i, method, *args) for i in range(self.num_workers)]

    def on_all(self, method: str, *args: Any, what: str, budget: float | None = None) -> list[Any]:
        """``method(*args)`` on every worker, waited for: their results."""
        return self.gather(self.call_all(method, *args), what=what, budget=budget)

    def ack(self, worker: int, method: str, *args: Any) -> None:
        """``method(*args)`` on ``worker``, its outcome checked with the worker's next results."""
        self.acks.append((worker, self.call(worker, method, *args)))

    def share(self, value: Any) -> Any:
        """``value`` shared once for every worker (Ray's object store)."""
        return self.hosts.share(value)

    def get(self, handle: Any, worker: int) -> Any:
        """A finished call's result; if it raised, the worker's first failed unread call's error.

        A worker runs its calls in order and one failure explains those after it (a rollout
        whose environment returned NaN closes the sampler; the ``state_dict`` asked next then
        finds "the sampler is closed").
        """
        try:
            return self.hosts.get(handle, worker)
        except CollectionWorkerError as e:
            raise self._first_failure(worker, handle) or e from None
        finally:
            self._read(worker, handle)

    def _read(self, worker: int, handle: Any) -> None:
        unread = self.unread[worker]
        for i, ref in enumerate(unread):
            if ref is handle:
                del unread[i]
                return

    def _first_failure(self, worker: int, handle: Any) -> CollectionWorkerError | None:
        """The failure of ``worker``'s first failed call before ``handle`` (None: none failed)."""
        unread = self.unread[worker]
        earlier = next((unread[:i] for i, ref in enumerate(unread) if ref is handle), [])
        for ref in earlier:
            if not self.hosts.wait([ref], 1, 0)[0]:
                continue  # (a control call served alongside, still running)
            try:
                self.hosts.get(ref, worker)
            except CollectionWorkerError as e:
                return e
            finally:
                self._read(worker, ref)
        return None

    def check_acks(self, worker: int) -> None:
        """Check the outcomes of ``worker``'s acks (raises a failure among them)."""
        mine = [ref for w, ref in self.acks if w == worker]
        self.acks = [(w, ref) for w, ref in self.acks if w != worker]
        for ref in mine:
            self.get(ref, worker)

    def wait(
        self,
        calls: Sequence[tuple[int, Any]],
        num_returns: int,
        budget: float | None,
        what: str,
        done: Callable[[Any], None] | None = None,
    ) -> None:
        """Wait until ``num_returns`` of ``calls`` (``(worker, ref)``) are done, under ``budget``.

        ``done(ref)`` runs for each call as it completes.
        """
        owner = {ref: w for w, ref in calls}
        waiting = [ref for _, ref in calls]
        deadline = Deadline(budget)
        finished = 0
        while finished < num_returns:
            ready, waiting = self.hosts.wait(
                waiting, num_returns=1, timeout=deadline.seconds_left()
            )
            for ref in ready:
                finished += 1
                if done is not None:
                    done(ref)
            if ready or budget is None:
                continue
            late = "; ".join(self.label(w) for w in sorted({owner[r] for r in waiting}))
            now = time.monotonic()
            if deadline.should_warn(now):
                log.warning(
                    "%s: no answer for %.1f s while %s; hung after %.0f s (collector.timeout)",
                    late,
                    deadline.elapsed(now),
                    what,
                    budget,
                )
            elif deadline.expired(now):
                self.hung = True
                raise CollectionWorkerError(
                    f"{late}: did not answer within {budget:.0f} s while {what} (hung? "
                    "collector.timeout)"
                )

    def gather(
        self,
        refs: Sequence[Any],
        workers: Sequence[int] | None = None,
        *,
        what: str = "answering the learner",
        budget: float | None = None,
    ) -> list[Any]:
        """The results of calls to workers (and the acks' outcomes), a failure named.

        Args:
            refs: The calls' handles.
            workers: The worker of each call (default: call ``i`` is worker
                ``i % num_workers``).
            what: What the workers are doing, for the watchdog's messages.
            budget: The watchdog's seconds (None: :meth:`budget`'s for one call).
        """
        n = max(1, self.num_workers)
        owner = list(workers) if workers is not None else [i % n for i in range(len(refs))]
        acks, self.acks = self.acks, []
        calls = [*acks, *zip(owner, refs, strict=True)]
        position = {ref: i for i, (_, ref) in enumerate(calls)}
        results: list[Any] = [None] * len(calls)

        def done(ref: Any) -> None:
            i = position[ref]
            results[i] = self.get(ref, calls[i][0])

        seconds = self.budget() if budget is None else budget
        self.wait(calls, len(calls), seconds, what, done)
        return results[len(acks) :]

    def first_done(self, flights: Sequence[tuple[int, Any, Deadline]], what: str) -> list[int]:
        """Workers of ``flights`` (``(worker, call, its deadline)``) whose call is done.

        Waits for at least one; each call is judged by its own deadline, its budget raised to
        :meth:`budget`'s of now.
        """
        owner = {ref: worker for worker, ref, _ in flights}
        while True:
            now = time.monotonic()
            budget = self.budget()
            left: float | None = None
            for worker, _, deadline in flights:
                deadline.budget = budget
                if deadline.expired(now):
                    self.hung = True
                    raise CollectionWorkerError(
                        f"{self.label(worker)}: did not answer within {budget:.0f} s while "
                        f"{what} (hung? collector.timeout)"
                    )
                if deadline.should_warn(now):
                    log.warning(
                        "%s: no answer for %.1f s while %s; hung after %.0f s "
                        "(collector.timeout)", self.label(worker), deadline.elapsed(now), what,
                        budget,
                    )  # fmt: skip
                seconds = deadline.seconds_left(now)
                if seconds is not None:
                    left = seconds if left is None else min(left, seconds)
            ready, _ = self.hosts.wait([ref for _, ref, _ in flights], num_returns=1, timeout=left)
            if ready:
                done = {owner[r] for r in ready}
                return [worker for worker, _, _ in flights if worker in done]

    def evaluate(
        self,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None,
    ) -> EvalResult:
        """Episodes ``episode_seeds`` split into contiguous shares, one per worker, each once.

        Each worker seeds its own action generator with ``action_seed``. The watchdog allows a
        rollout's budget plus a unit per round of episodes and one to build the environments.
        """
        k = min(self.num_workers, len(episode_seeds))
        shares = evenly_distribute_count_into_bins(len(episode_seeds), k)
        bounds = [sum(shares[:i]) for i in range(k + 1)]
        envs = [max(1, min(num_envs, shares[i])) for i in range(k)]
        calls = [
            self.call(
                i, "evaluate", list(episode_seeds[bounds[i] : bounds[i + 1]]), envs[i],
                deterministic, action_seed, split,
            )
            for i in range(k)
        ]  # fmt: skip
        rounds = max(math.ceil(shares[i] / envs[i]) for i in range(k))
        parts = self.gather(
            calls,
            what=f"evaluating {len(episode_seeds)} episodes",
            budget=self.budget(2 + rounds),
        )
        records = {r["episode_seed"]: r for part in parts for r in part}
        return summarise_episodes(records, episode_seeds)

    def close(self) -> None:
        """End every worker (a hung one is not waited for long)."""
        self.hosts.close(timeout=2 if self.hung else 10)
