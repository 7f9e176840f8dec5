"""Collection workers (PyTorchRL's ``CWorkerSet``): the learner's :class:`Collector`.

:class:`CollectionWorkerSet` starts ``num_workers`` :class:`CollectionWorker` s, as Ray actors
(``collector=ray``, on this machine or a cluster) or as child processes of the learner
(``collector=process``, this machine, no Ray), splits the run's environments over them
(contiguous blocks of the global seed stream), and hands the trainer one ``[T, N]`` rollout per
:meth:`~CollectionWorkerSet.collect`:

- **sync** (on-policy): the current weights go to every worker (shared once), every worker
  collects a rollout with them, and the learner waits for all. With ``fraction_samples < 1``,
  once that fraction of workers is done the others end their rollouts early (after
  ``min_rollout_frac`` of it); the learner then keeps the steps every worker has (the shortest
  rollout), each environment bootstrapped from its stored value at the cut.
- **async** (no barrier): every worker always has a rollout in flight. The learner updates on
  the first ``rollouts_per_update`` rollouts that are ready (first come, first served; the
  others keep collecting), sends its weights of that moment only to the workers whose rollout
  it took, and they start their next rollout at once, so collection overlaps the update and
  a slow worker never holds the others up (``rollouts_per_update: null``: every worker's
  rollout each update, the barrier). Each rollout carries the version of the weights it was
  collected with; one more than ``max_policy_lag`` versions behind the learner is dropped
  (``collection/dropped``) and its worker collects again with the current weights. PPO's
  ratio uses the behaviour log-probabilities stored with the data
  (``pipeline/advantage=vtrace`` corrects the advantages too); ``collection/policy_lag`` (mean) and
  ``collection/policy_lag_max`` are logged. What is collected ahead is what the learner will
  ask for: the trainer hands its plan (:meth:`~CollectionWorkerSet.set_request_plan`), and
  the rollouts in flight are counted against it in the order they were asked for, so the last
  update of a stage is cut to the stage's budget, the next stage's rollouts are collected with
  that stage's settings, and nothing is asked for past the run's budget (or once a stop was
  asked for). Data collected for another stage than the learner's (a stage ended early by its
  criterion) is dropped and collected again; a rollout longer than asked for is cut.

Stage changes reach each worker through ``update_algorithm_parameter`` (rollout length,
teacher forcing) with its next request, and so does a forced scene advance
(:meth:`~CollectionWorkerSet.new_episodes`).

Under DDP (``distributed=ddp``) every rank owns a set of its own (PyTorchRL's ``index_parent``
is the rank, ``total_parent_workers`` the world size): environment ``i`` of worker ``w`` of
rank ``r`` is global environment ``r * num_envs + w's first + i`` of one seed stream, errors
name the rank, and each rank's workers' state goes into the checkpoint.

A worker that raises or dies is a :class:`CollectionWorkerError` naming it,
with the original traceback. A worker that does not answer is a hang: ``timeout`` (seconds per
call, scaled to long calls, see :class:`CollectionWorkerSet`) is a watchdog that warns, naming
the worker, its pid and its environments, once half of it has passed, and then fails with a
``CollectionWorkerError`` naming them. :meth:`~CollectionWorkerSet.close` ends every worker,
and the Ray instance when this set started it (``address: null``: a private instance sized by
the config; ``auto`` or ``HOST:PORT`` joins a cluster, which is left running).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from rl.collection.actors import Actors, CollectionWorkerError, ProcessActors, RayActors
from rl.collection.base import CollectionSpec, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, evaluate_policy, summarise_episodes
from rl.collection.transport import RolloutAssembler, cut_packed_rollout
from rl.collection.worker import ALGORITHM_PARAMETERS, CollectionWorker
from rl.distributed.setup import DistContext
from rl.models.policy import Policy
from rl.sampling.worker_pool import WARN_FRACTION
from rl.tasks.factory import task_spaces, with_split
from rl.utils.config import ConfigError
from rl.utils.misc import evenly_distribute_count_into_bins

log = logging.getLogger(__name__)

MODES = ("sync", "async")
BACKENDS = ("ray", "process")
# Seconds to wait for workers to start (building environments) before failing.
START_TIMEOUT_S = 120.0
# The watchdog's default (collector.timeout): seconds a worker may take to answer a call, per
# ROLLOUT_UNIT_STEPS steps of a rollout and per round of evaluation episodes. Generous: a
# worker's rollout of the slowest shipped task (nav3d: ~2 ms a step, ~30 ms a reset; 16 envs x
# 128 steps on one worker, policy included) takes about 5-10 s on a 2-core machine.
DEFAULT_TIMEOUT_S = 120.0
ROLLOUT_UNIT_STEPS = 128


@dataclasses.dataclass
class _InFlight:
    """A rollout asked of a worker (async): its call, the request, when it was asked."""

    ref: Any
    request: RolloutRequest
    since: float


class CollectionWorkerSet:
    """Rollouts from ``num_workers`` workers, each with its share of the environments.

    Args:
        spec: What to collect from (task, sampler and model configs, seeds); ``sampler``'s
            ``num_envs`` are split over the workers.
        model: The learner's policy (its weights are sent to the workers).
        device: The learner's device (the assembled rollout lives there).
        dist: This learner's place among DDP ranks (each rank owns its workers; None: one
            learner).
        num_workers: Remote collection workers (of this rank).
        mode: ``sync`` or ``async`` (see the module docstring).
        rollouts_per_update: Async: worker rollouts per update, first come first served
            (None: every worker's, the barrier). Fewer than ``num_workers`` needs the
            environments split evenly (``sampler.num_envs`` a multiple of ``num_workers``).
        backend: ``ray`` (Ray actors) or ``process`` (child processes of this one).
        address: Ray only: None starts a private Ray instance with
            ``num_workers * cpus_per_worker`` CPUs; ``auto`` or ``HOST:PORT`` joins that cluster.
        cpus_per_worker: Ray CPUs reserved per worker (also its torch threads, at least 1).
        gpus_per_worker: Ray GPUs reserved per worker (a cluster's GPU nodes).
        memory_per_worker: Ray memory reserved per worker, in bytes (None: none).
        fraction_samples: Sync: fraction of workers that must finish before the rest stop.
        min_rollout_frac: ... once they have this fraction of their steps.
        max_policy_lag: Async: largest accepted ``learner version - data version``.
        timeout: The hang watchdog: seconds a worker may take to answer a call, for a rollout
            of up to 128 steps per environment (longer ones get it per 128 steps), for each
            round of episodes of an evaluation (``ceil(episodes / environments)`` on that
            worker, plus one for building them), and for everything else (settings, weights,
            state; restoring a state gets at least ``START_TIMEOUT_S``). A warning names a
            worker silent for half of it (pid, environments); the end of it is a
            :class:`CollectionWorkerError`. None: wait as long as it takes (a dead worker is
            an error at once regardless).
        compress: Workers lz4-compress the rollouts they send.
        evaluate_on_workers: Spread evaluations (``eval``) over the workers.
        allow_unauthenticated: Ray only: join a cluster even without token authentication
            (a loud warning); the private instance always uses it.
    """

    supports_distributed: ClassVar[bool] = True

    def __init__(
        self,
        *,
        spec: CollectionSpec,
        model: Policy,
        device: torch.device | str = "cpu",
        dist: DistContext | None = None,
        num_workers: int = 2,
        mode: str = "sync",
        rollouts_per_update: int | None = None,
        backend: str = "ray",
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        memory_per_worker: int | None = None,
        fraction_samples: float = 1.0,
        min_rollout_frac: float = 0.25,
        max_policy_lag: int = 1,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        compress: bool = True,
        evaluate_on_workers: bool = True,
        allow_unauthenticated: bool = False,
    ) -> None:
        per_update = num_workers if rollouts_per_update is None else rollouts_per_update
        _check(
            num_workers, mode, backend, fraction_samples, min_rollout_frac, max_policy_lag, spec,
            timeout, per_update,
        )  # fmt: skip
        self.spec, self.model, self.device = spec, model, torch.device(device)
        self.dist = dist if dist is not None and dist.enabled else None
        # "rank 1 " under DDP: every message names the rank that owns the worker.
        self.owner = "" if self.dist is None else f"rank {self.dist.rank} "
        self.rollouts_per_update = per_update if mode == "async" else num_workers
        self.mode, self.backend, self.fraction_samples = mode, backend, fraction_samples
        self.max_policy_lag, self.evaluate_on_workers = max_policy_lag, evaluate_on_workers
        self.timeout = timeout
        # (worker, call) of settings sent whose outcome is checked with the next results
        self._acks: list[tuple[int, Any]] = []
        shares = evenly_distribute_count_into_bins(spec.num_envs, num_workers)
        starts = [sum(shares[:i]) for i in range(num_workers)]
        self.env_slices = [slice(a, a + n) for a, n in zip(starts, shares, strict=True)]
        kwargs = [
            {
                "index": i,
                "spec": spec,
                "num_envs": shares[i],
                "env_offset": starts[i],
                "min_rollout_frac": min_rollout_frac if fraction_samples < 1.0 else None,
                "compress": compress,
                "torch_threads": max(1, int(cpus_per_worker)),
            }
            for i in range(num_workers)
        ]
        self.actors: Actors
        if backend == "ray":
            self.actors = RayActors(
                CollectionWorker,
                kwargs,
                address=address,
                cpus_per_worker=cpus_per_worker,
                gpus_per_worker=gpus_per_worker,
                memory_per_worker=memory_per_worker,
                start_timeout=START_TIMEOUT_S,
                allow_unauthenticated=allow_unauthenticated,
                owner=self.owner,
            )
        else:
            self.actors = ProcessActors(
                CollectionWorker, kwargs, start_timeout=START_TIMEOUT_S, owner=self.owner
            )
        self.num_workers = num_workers
        self.pids = self.actors.pids
        self.assembler = RolloutAssembler(num_envs=self.num_envs, device=self.device)
        # The run's normalisation statistics: the workers' moments merged, sent with the weights.
        self.normalizer = spec.build_normalizer(task_spaces(spec.task)[0])
        # The learner's weights version: one more per collect() (every rollout is followed by
        # an update), and the version the workers last received.
        self.version = 0
        self._versions = [-1] * num_workers  # the weights' version each worker last received
        self._shared: tuple[int, Any] | None = None  # (version, its weights shared once)
        self._sent: list[dict[str, Any]] = [{} for _ in range(num_workers)]
        self._in_flight: dict[int, _InFlight] = {}  # async: worker -> its rollout in flight
        self._new_episodes_due: set[int] = set()  # workers to start new episodes first
        self._ready: dict[int, Any] = {}  # async: results received, kept for the next update
        self._warned: set[int] = set()  # async: workers the watchdog warned about
        self._plan: Callable[[int], RolloutRequest | None] | None = None
        self._longest = 1  # longest rollout asked for (steps): the watchdog's scale
        self._hung = False  # a worker did not answer in time (close does not wait long)
        self._requested = [0] * num_workers  # rollouts asked of each worker (its own count)
        self.dropped = 0
        log.info(
            "collection: %s%d %s workers (%s, pids %s), environments %s",
            self.owner,
            num_workers,
            "Ray" if backend == "ray" else "process",
            mode,
            ", ".join(map(str, self.pids)),
            ", ".join(f"{s.start}-{s.stop - 1}" for s in self.env_slices),
        )

    @property
    def num_envs(self) -> int:
        """Environments of one update's rollout (every worker's, or ``rollouts_per_update``'s)."""
        if self.rollouts_per_update == self.num_workers:
            return self.spec.num_envs
        return self.rollouts_per_update * (self.spec.num_envs // self.num_workers)

    # ----------------------------------------------------------------- faults
    def _label(self, worker: int) -> str:
        """``collection worker 1 (pid 4242, environments 8-15)``, for messages."""
        envs = self.env_slices[worker]
        where = (
            f"environment {envs.start}"
            if envs.stop - envs.start == 1
            else f"environments {envs.start}-{envs.stop - 1}"
        )
        return f"{self.owner}collection worker {worker} (pid {self.pids[worker]}, {where})"

    def _budget(self, units: float = 1.0) -> float | None:
        """The watchdog's seconds for a call of ``units`` (None: no watchdog).

        Every call may wait behind a rollout in flight, so each gets a rollout's budget
        (``timeout`` per :data:`ROLLOUT_UNIT_STEPS` steps of the longest rollout asked for)
        plus ``units - 1`` more ``timeout`` s.
        """
        if self.timeout is None:
            return None
        rollout = max(1, math.ceil(self._longest / ROLLOUT_UNIT_STEPS))
        return self.timeout * (rollout + max(0.0, units - 1.0))

    def _wait(
        self,
        calls: Sequence[tuple[int, Any]],
        num_returns: int,
        budget: float | None,
        what: str,
        done: Callable[[Any], None] | None = None,
    ) -> None:
        """Wait until ``num_returns`` of ``calls`` (``(worker, ref)``) are done: the watchdog.

        A worker silent for :data:`~rl.sampling.worker_pool.WARN_FRACTION` of ``budget`` is
        named in a warning (once); one silent for all of it is a :class:`CollectionWorkerError`.
        ``done(ref)`` runs for each call as it completes.
        """
        owner = {ref: w for w, ref in calls}
        waiting = [ref for _, ref in calls]
        start = time.monotonic()
        deadline = None if budget is None else start + budget
        warn_at = None if budget is None else start + WARN_FRACTION * budget
        finished = 0
        while finished < num_returns:
            wake = deadline if warn_at is None else warn_at
            left = None if wake is None else max(0.0, wake - time.monotonic())
            ready, waiting = self.actors.wait(waiting, num_returns=1, timeout=left)
            for ref in ready:
                finished += 1
                if done is not None:
                    done(ref)
            if ready or deadline is None:
                continue
            late = "; ".join(self._label(w) for w in sorted({owner[r] for r in waiting}))
            now = time.monotonic()
            if warn_at is not None:
                warn_at = None
                log.warning(
                    "%s: no answer for %.1f s while %s; hung after %.0f s (collector.timeout)",
                    late,
                    now - start,
                    what,
                    budget,
                )
            elif now >= deadline:
                self._hung = True
                raise CollectionWorkerError(
                    f"{late}: did not answer within {budget:.0f} s while {what} (hung? "
                    "collector.timeout)"
                )

    def _gather(
        self,
        refs: Sequence[Any],
        workers: Sequence[int] | None = None,
        *,
        what: str = "answering the learner",
        budget: float | None = None,
    ) -> list[Any]:
        """The results of calls to workers, a failure named after its worker.

        Args:
            refs: The calls' object refs.
            workers: The worker of each call (default: call ``i`` is worker
                ``i % num_workers``, as for one call per worker, or several in turn).
            what: What the workers are doing, for the watchdog's messages.
            budget: The watchdog's seconds (None: :meth:`_budget`'s for one call).

        Settings sent before (:meth:`_send_parameters`) are checked with them.
        """
        n = max(1, self.num_workers)
        owner = list(workers) if workers is not None else [i % n for i in range(len(refs))]
        acks, self._acks = self._acks, []
        calls = [*acks, *zip(owner, refs, strict=True)]
        position = {ref: i for i, (_, ref) in enumerate(calls)}
        results: list[Any] = [None] * len(calls)

        def done(ref: Any) -> None:
            i = position[ref]
            results[i] = self.actors.get(ref, calls[i][0])

        seconds = self._budget() if budget is None else budget
        self._wait(calls, len(calls), seconds, what, done)
        return results[len(acks) :]

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every worker."""
        return [self.actors.call(i, method, *args) for i in range(self.num_workers)]

    # ------------------------------------------------------------- collection
    def _send_parameters(self, request: RolloutRequest, workers: Sequence[int]) -> None:
        """``update_algorithm_parameter`` on ``workers`` for each setting that changed.

        Not waited for: a worker runs its calls in order, so its next rollout sees them, and
        their outcomes are checked with that rollout's (:meth:`_gather`, :meth:`_take`).
        """
        request = _as_sent(request)
        self._longest = max(self._longest, request.num_steps)
        for i in workers:
            sent = self._sent[i]
            for name in ALGORITHM_PARAMETERS:
                value = getattr(request, name)
                if name not in sent or sent[name] != value:
                    sent[name] = value
                    self._acks.append(
                        (i, self.actors.call(i, "update_algorithm_parameter", name, value))
                    )

    def _send_weights(self, workers: Sequence[int]) -> None:
        """The learner's weights to ``workers`` that lack them (queued behind their work).

        Shared once per version (Ray's object store: one copy for every worker).
        """
        workers = [i for i in workers if self._versions[i] != self.version]
        if not workers:
            return
        if self._shared is None or self._shared[0] != self.version:
            # A copy: a process worker's pipe sends a CPU tensor as a handle to its shared
            # storage, which the learner's next update would then change under the worker
            # before it loads them (torn weights, tagged with the wrong version).
            weights = {
                k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
            }
            self._shared = (self.version, self.actors.share(weights))
        normalizer = None if self.normalizer is None else self.normalizer.state_dict()
        for i in workers:
            self._versions[i] = self.version
            # Checked with the next results, like the settings (and not left unread).
            self._acks.append(
                (i, self.actors.call(i, "set_weights", self._shared[1], self.version, normalizer))
            )

    def _request(self, workers: Sequence[int], request: RolloutRequest) -> list[Any]:
        """Ask ``workers`` for a rollout as ``request`` says, with the current weights.

        A forced scene advance (:meth:`new_episodes`) reaches a worker with this request.
        """
        self._send_parameters(request, workers)
        self._send_weights(workers)
        refs = []
        for i in workers:
            if i in self._new_episodes_due:
                self._new_episodes_due.discard(i)
                self._acks.append((i, self.actors.call(i, "new_episodes")))
            self._requested[i] += 1
            refs.append(self.actors.call(i, "collect_data"))
        return refs

    # ------------------------------------------------------------ run-time hooks
    def update_storage_parameter(self, name: str, value: Any) -> None:
        """``update_storage_parameter`` on every worker (e.g. ``gamma``; checked at once)."""
        self._gather(
            self._call_all("update_storage_parameter", name, value),
            what=f"updating storage parameter {name}",
        )

    def replace_agent_component(
        self, name: str, config: Mapping[str, Any], model: Policy | None = None
    ) -> None:
        """Replace every worker's ``policy`` or ``environments`` (PyTorchRL's hook).

        Args:
            name: ``policy`` or ``environments`` (see
                :meth:`~rl.collection.worker.CollectionWorker.replace_agent_component`).
            config: The new component's plain config (a model or a task config).
            model: ``policy``: the learner's new policy, built from ``config``; its weights
                go to the workers with their next request.

        Asynchronous collection: the rollouts in flight finish with the old component.
        """
        if name == "policy":
            if model is None:
                raise ValueError("replace_agent_component('policy'): pass the learner's model")
            self.model = model
            self.spec = dataclasses.replace(self.spec, model=dict(config))
            self.assembler.storage = None  # its fields may differ (the recurrent state's)
        elif name == "environments":
            self.spec = dataclasses.replace(self.spec, task=dict(config))
        self._gather(
            self._call_all("replace_agent_component", name, dict(config)),
            what=f"replacing its {name}",
            budget=None if self.timeout is None else max(self._budget() or 0.0, START_TIMEOUT_S),
        )
        self._versions = [-1] * self.num_workers  # the (new) weights go with the next request
        self._shared = None

    def set_request_plan(self, plan: Callable[[int], RolloutRequest | None]) -> None:
        """Tell asynchronous collection what to collect ahead (the trainer's budget).

        Args:
            plan: ``plan(k)``: the request of the update ``k`` updates after the one being
                collected (``k >= 1``; each stage's last one cut to its budget, the next
                stage's first after it), or None when none will come (the run's budget is
                spent, or it is stopping): nothing is collected for it. Without a plan, the
                same request is collected ahead (its teacher-forcing position moved on).
        """
        self._plan = plan

    def collect(self, request: RolloutRequest) -> Rollout:
        """One update's rollout (see the module docstring for sync and async)."""
        self.version += 1  # the learner updated its weights since the last rollout
        request = _as_sent(request)
        if self.mode == "async":
            return self._collect_async(request)
        refs = self._request(range(self.num_workers), request)
        workers = list(range(self.num_workers))
        results = self._collect_sync(refs)
        return self._assemble(workers, results)

    def _collect_sync(self, refs: list[Any]) -> list[Any]:
        what = "collecting a rollout"
        if self.fraction_samples >= 1.0:
            return self._gather(refs, what=what)
        # DD-PPO's straggler rule across workers: once enough are done, the rest stop early.
        enough = math.ceil(self.fraction_samples * len(refs) - 1e-9)
        self._wait(list(enumerate(refs)), enough, self._budget(), what)
        for i, requested in enumerate(self._requested):
            # A no-op for workers already done; its outcome is checked with the results.
            self._acks.append((i, self.actors.call(i, "stop_collecting", requested - 1)))
        return self._gather(refs, what=what)

    # ------------------------------------------------------------------ async
    def _planned(self, updates_ahead: int, current: RolloutRequest) -> RolloutRequest | None:
        """The request of the update ``updates_ahead`` after ``current`` (None: none comes)."""
        if updates_ahead == 0:
            return current
        if self._plan is not None:
            planned = self._plan(updates_ahead)
            return None if planned is None else _as_sent(planned)
        moved = current.stage_steps + updates_ahead * current.num_steps * current.steps_per_step
        return dataclasses.replace(current, stage_steps=moved)

    def _refill(self, current: RolloutRequest, taken: int = 0) -> None:
        """Ask every idle worker for a rollout, planned in the order they are asked for.

        The rollouts in flight are planned for the coming updates in the order they were asked
        for, ``rollouts_per_update`` each, though an update takes the first ready ones (a short
        rollout cut to the stage's budget may overtake a full one asked for before it);
        ``taken``: rollouts already taken for ``current``'s update (the next one asked for is
        planned for the update after it once it has them all).
        """
        for i in range(self.num_workers):
            if i in self._in_flight:
                continue
            queued = taken + len(self._in_flight)
            planned = self._planned(queued // self.rollouts_per_update, current)
            if planned is None:
                continue  # past the budget: this worker waits
            (ref,) = self._request([i], planned)
            self._in_flight[i] = _InFlight(ref=ref, request=planned, since=time.monotonic())

    def _collect_async(self, request: RolloutRequest) -> Rollout:
        """The first ``rollouts_per_update`` acceptable rollouts; their workers go on at once."""
        need = self.rollouts_per_update
        self._refill(request)
        taken: dict[int, Any] = {}
        while len(taken) < need:
            if not self._in_flight:
                raise RuntimeError("asynchronous collection: no rollout in flight (a bug)")
            for i in self._take_ready():
                flight = self._in_flight.pop(i)
                data, info = self._result(i, flight)
                lag = self._lag(info)
                if flight.request.stage != request.stage or lag > self.max_policy_lag:
                    self.dropped += 1  # too old, or for another stage: collected again now
                elif len(taken) < need:
                    taken[i] = (data, info)
                    continue
                else:  # more are ready than the update takes: keep it for the next one
                    self._in_flight[i] = flight
                    self._ready[i] = (data, info)
                    continue
                self._refill(request, taken=len(taken))
        workers = sorted(taken)
        steps = request.num_steps
        results = [
            (cut_packed_rollout(data, steps), {**info, "num_steps": steps})
            if int(info["num_steps"]) > steps
            else (data, info)
            for data, info in (taken[i] for i in workers)
        ]
        if self.normalizer is not None:  # the statistics the taken workers get with the weights
            self.normalizer.merge(
                [info["normalizer_moments"] for _, info in results], distributed=self._ddp
            )
        # The taken workers start their next rollouts before this one is unpacked.
        self._refill(request, taken=len(workers))
        return self._assemble(workers, results, merged=True)

    def _take_ready(self) -> list[int]:
        """Workers whose rollout in flight is done (at least one; the watchdog per rollout).

        Rollouts already received (kept for the next update) come first, oldest first.
        """
        kept = sorted(self._ready, key=lambda i: self._in_flight[i].since)
        if kept:
            return kept
        flights = sorted(self._in_flight.items(), key=lambda kv: kv[1].since)
        owner = {f.ref: i for i, f in flights}
        warned: set[int] = set()
        while True:
            now = time.monotonic()
            budget = self._budget()
            left = None
            if budget is not None:
                for i, f in flights:
                    age = now - f.since
                    if age >= budget:
                        self._hung = True
                        raise CollectionWorkerError(
                            f"{self._label(i)}: did not answer within {budget:.0f} s while "
                            "collecting a rollout (hung? collector.timeout)"
                        )
                    if age >= WARN_FRACTION * budget and i not in warned and i not in self._warned:
                        warned.add(i)
                        self._warned.add(i)
                        log.warning(
                            "%s: no answer for %.1f s while collecting a rollout; hung after "
                            "%.0f s (collector.timeout)", self._label(i), age, budget,
                        )  # fmt: skip
                deadlines = [
                    f.since + (budget if i in self._warned else WARN_FRACTION * budget)
                    for i, f in flights
                ]
                left = max(0.0, min(deadlines) - now)
            ready, _ = self.actors.wait([f.ref for _, f in flights], num_returns=1, timeout=left)
            if ready:
                done = {owner[r] for r in ready}
                return [i for i, _ in flights if i in done]

    def _result(self, worker: int, flight: _InFlight) -> tuple[dict[str, Any], dict[str, Any]]:
        """A rollout in flight that is done, and the outcomes of the worker's calls before it."""
        self._warned.discard(worker)
        if worker in self._ready:
            return self._ready.pop(worker)
        mine = [ref for w, ref in self._acks if w == worker]
        self._acks = [(w, ref) for w, ref in self._acks if w != worker]
        for ref in mine:
            self.actors.get(ref, worker)
        result: tuple[dict[str, Any], dict[str, Any]] = self.actors.get(flight.ref, worker)
        return result

    def _lag(self, info: Mapping[str, Any]) -> int:
        """Versions between the weights the data was collected with and the learner's now."""
        return self.version - int(info["actor_version"])

    def _assemble(
        self, workers: Sequence[int], results: Sequence[Any], merged: bool = False
    ) -> Rollout:
        """One rollout of ``workers``' results (in worker order), their statistics logged."""
        data = [d for d, _ in results]
        infos = [info for _, info in results]
        steps = min(int(info["num_steps"]) for info in infos)
        if any(int(info["num_steps"]) != steps for info in infos):
            data = [cut_packed_rollout(d, steps) for d in data]
        columns, start = [], 0
        for i in workers:
            width = self.env_slices[i].stop - self.env_slices[i].start
            columns.append(slice(start, start + width))
            start += width
        rollout = self.assembler.assemble(data, columns)
        if self.normalizer is not None and not merged:  # in worker order: one worker is exact
            self.normalizer.merge([info["normalizer_moments"] for info in infos], self._ddp)
        lags = [self._lag(info) for info in infos]
        extra = {
            "collection/policy_lag": sum(lags) / len(lags),
            "collection/policy_lag_max": float(max(lags)),
            "collection/dropped": float(self.dropped),
            "collection/worker_fps": sum(float(i["fps"]) for i in infos) / len(infos),
            "collection/bytes_sent": float(sum(int(d["packed_bytes"]) for d in data)),
            "collection/compression": sum(int(d["bytes"]) for d in data)
            / max(1, sum(int(d["packed_bytes"]) for d in data)),
            "collection/pack_seconds": max(float(d["pack_seconds"]) for d in data),
        }
        stats = rollout.stats
        for key, value in extra.items():
            stats["sums"][key] = stats["sums"].get(key, 0.0) + value
            stats["counts"][key] = stats["counts"].get(key, 0.0) + 1.0
        return rollout

    @property
    def _ddp(self) -> bool:
        return self.dist is not None

    def new_episodes(self) -> None:
        """Every worker's environments start new episodes before its next rollout.

        Sync: at once. Async: with each worker's next request (a rollout in flight is not
        interrupted).
        """
        if self.mode == "async":
            self._new_episodes_due = set(range(self.num_workers))
            return
        self._gather(self._call_all("new_episodes"), what="starting new episodes")

    # ------------------------------------------------------------- evaluation
    def evaluate(
        self,
        *,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None = None,
    ) -> EvalResult:
        """Run the learner's current policy on ``episode_seeds``, each episode exactly once.

        With ``evaluate_on_workers`` the list is split into contiguous shares, one per worker
        (each its own action generator seeded with ``action_seed``), else it runs here.
        """
        if not self.evaluate_on_workers:
            return evaluate_policy(
                model=self.model,
                task=with_split(self.spec.task, split),
                episode_seeds=episode_seeds,
                num_envs=num_envs,
                deterministic=deterministic,
                action_seed=action_seed,
                device=self.device,
                normalizer=self.normalizer,
            )
        self._send_weights(range(self.num_workers))
        k = min(self.num_workers, len(episode_seeds))
        shares = evenly_distribute_count_into_bins(len(episode_seeds), k)
        bounds = [sum(shares[:i]) for i in range(k + 1)]
        calls = [
            self.actors.call(
                i,
                "evaluate",
                list(episode_seeds[bounds[i] : bounds[i + 1]]),
                max(1, min(num_envs, shares[i])),
                deterministic,
                action_seed,
                split,
            )
            for i in range(k)
        ]
        # The watchdog: a round of episodes over a worker's environments at a time, plus one
        # for building them (behind a rollout in flight).
        rounds = max(math.ceil(shares[i] / max(1, min(num_envs, shares[i]))) for i in range(k))
        parts = self._gather(
            calls,
            what=f"evaluating {len(episode_seeds)} episodes",
            budget=self._budget(2 + rounds),
        )
        records = {r["episode_seed"]: r for part in parts for r in part}
        return summarise_episodes(records, episode_seeds)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Every worker's episodes in flight, carried state and generators.

        In async mode the rollouts in flight are not part of it: a resumed run continues from
        the workers' state after them, so it is not bitwise the same as an uninterrupted one.
        """
        states = self._gather(self._call_all("state_dict"), what="saving its state")
        return {
            "sampler": None,
            "rollout": None,
            "collection_workers": {
                "num_workers": self.num_workers,
                "mode": self.mode,
                "version": self.version,
                "requested": [int(s["rollouts"]) for s in states],
                "workers": states,
            },
            "normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every worker from a checkpoint of the same layout (else fresh episodes)."""
        if self.normalizer is not None and state.get("normalizer") is not None:
            self.normalizer.load_state_dict(state["normalizer"])  # sent with the next weights
        saved = state.get("collection_workers")
        if saved is None or int(saved["num_workers"]) != self.num_workers:
            log.warning(
                "the checkpoint holds no state for %d collection workers (saved with %s): every "
                "worker starts fresh episodes",
                self.num_workers,
                "in-process collection" if saved is None else f"{saved['num_workers']} workers",
            )
            return
        if saved["mode"] == "async" or self.mode == "async":
            log.warning(
                "resuming asynchronous collection: the rollouts that were in flight are lost, "
                "so the run continues from its checkpoint but not bitwise as an uninterrupted one"
            )
        self.version = int(saved["version"])
        self._requested = [int(n) for n in saved["requested"]]
        states = saved["workers"]
        budget = self._budget()
        self._gather(
            [self.actors.call(i, "load_state_dict", s) for i, s in enumerate(states)],
            what="restoring its state (replaying its episodes)",
            budget=None if budget is None else max(budget, START_TIMEOUT_S),
        )

    def close(self) -> None:
        """End every worker (closing its environments), and Ray if this set started it."""
        actors = getattr(self, "actors", None)
        if actors is not None:
            del self.actors
            actors.close(timeout=2 if self._hung else 10)  # a hung worker never answers


def _check(
    num_workers: int,
    mode: str,
    backend: str,
    fraction_samples: float,
    min_rollout_frac: float,
    max_policy_lag: int,
    spec: CollectionSpec,
    timeout: float | None,
    rollouts_per_update: int,
) -> None:
    """Problems of the ``collector`` settings, all at once (``ConfigError``)."""
    errors = []
    if timeout is not None and not timeout > 0:
        errors.append(f"collector.timeout: must be > 0 seconds or null (none), got {timeout}")
    if num_workers < 1:
        errors.append(f"collector.num_workers: must be >= 1, got {num_workers}")
    elif spec.num_envs < num_workers:
        errors.append(
            f"collector.num_workers={num_workers} > sampler.num_envs={spec.num_envs}: every "
            "worker needs at least one environment"
        )
    if mode not in MODES:
        errors.append(f"collector.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if backend not in BACKENDS:
        errors.append(f"collector.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if not 0.0 < fraction_samples <= 1.0:
        errors.append(f"collector.fraction_samples: must be in (0, 1], got {fraction_samples}")
    if not 0.0 <= min_rollout_frac <= 1.0:
        errors.append(f"collector.min_rollout_frac: must be in [0, 1], got {min_rollout_frac}")
    if max_policy_lag < 0:
        errors.append(f"collector.max_policy_lag: must be >= 0, got {max_policy_lag}")
    if not 1 <= rollouts_per_update <= max(1, num_workers):
        errors.append(
            f"collector.rollouts_per_update: must be in [1, num_workers={num_workers}] or null "
            f"(every worker's), got {rollouts_per_update}"
        )
    elif (
        mode == "async"
        and rollouts_per_update < num_workers
        and spec.num_envs % max(1, num_workers)
    ):
        errors.append(
            f"collector.rollouts_per_update={rollouts_per_update} < num_workers={num_workers} "
            f"needs the environments split evenly: sampler.num_envs={spec.num_envs} is not a "
            f"multiple of {num_workers}"
        )
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def _as_sent(request: RolloutRequest) -> RolloutRequest:
    """``request`` as the workers get it: without teacher forcing, its position is moot."""
    if request.teacher_forcing is None:
        return dataclasses.replace(request, stage_steps=0, steps_per_step=1)
    return request


__all__ = ["CollectionWorker", "CollectionWorkerError", "CollectionWorkerSet"]
