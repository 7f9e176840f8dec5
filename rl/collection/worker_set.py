"""Collection workers (PyTorchRL's ``CWorkerSet``): the learner's :class:`Collector`.

:class:`CollectionWorkerSet` starts ``num_workers`` :class:`CollectionWorker` s (Ray actors or
child processes), splits the run's environments over them in contiguous blocks of the global
seed stream, and hands the trainer one ``[T, N]`` rollout per ``collect``:

- **sync**: every worker collects with the current weights and the learner waits for all. With
  ``fraction_samples < 1``, once that fraction is done the rest stop early (after
  ``min_rollout_frac`` of their steps) and the rollouts are cut to the shortest, each
  environment bootstrapped from its stored value at the cut (DD-PPO's straggler rule).
- **async** (:mod:`rl.collection.async_collection`): every worker always has a rollout in
  flight; an update takes the first ``rollouts_per_update`` that are ready and drops data more
  than ``max_policy_lag`` weight versions old.

Under DDP every rank owns a set: environment ``i`` of worker ``w`` of rank ``r`` is global
environment ``r * num_envs + w's first + i``, and errors name the rank. The settings' rules
(:func:`collector_errors`) run in the config check and in the constructor.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar

import torch

from rl.collection.async_collection import AsyncCollection, as_sent
from rl.collection.base import CollectionSpec, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, EvalSampler, evaluate_policy
from rl.collection.hosts import CollectionWorkerError
from rl.collection.transport import RolloutAssembler, ShippedRollout
from rl.collection.worker import ALGORITHM_PARAMETERS, CollectionWorker
from rl.collection.worker_calls import START_TIMEOUT_S, WorkerCalls
from rl.distributed.setup import DistContext
from rl.models.policy import Policy
from rl.tasks.factory import with_split
from rl.utils.config import MAX_WORKERS, Check, ConfigError, argument_errors
from rl.utils.misc import evenly_distribute_count_into_bins
from rl.utils.threads import AUTO, auto_count

__all__ = ["CollectionWorker", "CollectionWorkerError", "CollectionWorkerSet"]

log = logging.getLogger(__name__)

MODES = ("sync", "async")
BACKENDS = ("ray", "process")


def collector_errors(
    *,
    num_workers: int | str,
    num_envs: int,
    mode: str,
    rollouts_per_update: int | None,
    address: str | None,
) -> list[str]:
    """The rules between the ``collector`` settings and ``sampler.num_envs``, one message each.

    Single settings' types and ranges are :class:`CollectionWorkerSet`'s annotations.
    """
    if num_workers == AUTO and address is not None:
        return [
            "collector.num_workers: auto counts this machine's cores; joining a cluster "
            f"(collector.address={address}) needs a number"
        ]
    if num_workers == AUTO:
        num_workers = auto_count(num_workers, num_envs, "collector.num_workers")
    if not isinstance(num_workers, int) or num_workers < 1:
        return []  # (its annotation names it)
    errors = []
    if num_envs < num_workers:
        errors.append(
            f"collector.num_workers={num_workers} > sampler.num_envs={num_envs}: every "
            "worker needs at least one environment"
        )
    per_update = num_workers if rollouts_per_update is None else rollouts_per_update
    if not isinstance(per_update, int):
        return errors
    if per_update > num_workers:
        errors.append(
            f"collector.rollouts_per_update: must be in [1, num_workers={num_workers}] or null "
            f"(every worker's), got {rollouts_per_update}"
        )
    elif mode == "async" and per_update < num_workers and num_envs % num_workers:
        errors.append(
            f"collector.rollouts_per_update={per_update} < num_workers={num_workers} "
            f"needs the environments split evenly: sampler.num_envs={num_envs} is not a "
            f"multiple of {num_workers}"
        )
    return errors


def worker_kwargs(
    spec: CollectionSpec,
    num_workers: int,
    *,
    compress: bool,
    shared_memory: bool,
    cpus_per_worker: float,
    min_rollout_frac: float | None,
) -> tuple[list[slice], list[dict[str, Any]]]:
    """Each worker's rows (its environments' agents, a contiguous block) and arguments."""
    shares = evenly_distribute_count_into_bins(spec.num_envs, num_workers)
    starts = [sum(shares[:i]) for i in range(num_workers)]
    rows = spec.agents
    slices = [slice(a * rows, (a + n) * rows) for a, n in zip(starts, shares, strict=True)]
    kwargs = [
        {
            "index": i,
            "spec": spec,
            "num_envs": shares[i],
            "env_offset": starts[i],
            "min_rollout_frac": min_rollout_frac,
            "compress": compress,
            "shared_memory": shared_memory,
            "torch_threads": max(1, int(cpus_per_worker)),
        }
        for i in range(num_workers)
    ]
    return slices, kwargs


class CollectionWorkerSet:
    """Rollouts from ``num_workers`` workers, each with its share of the environments.

    Args:
        spec: What to collect from; ``sampler``'s ``num_envs`` are split over the workers.
        model: The learner's policy (its weights are sent to the workers).
        device: The learner's device (the assembled rollout lives there).
        dist: This learner's place among DDP ranks (None: one learner).
        num_workers: Collection workers of this rank; ``auto``: one a core this process may
            use, less the learner's, at most one an environment.
        mode: ``sync`` or ``async`` (see the module docstring).
        rollouts_per_update: Async: worker rollouts per update, first come first served
            (None: every worker's). Fewer than ``num_workers`` needs ``sampler.num_envs`` a
            multiple of ``num_workers``.
        backend: ``ray`` (Ray actors) or ``process`` (child processes of this one).
        address: Ray only: None starts a private instance with ``num_workers *
            cpus_per_worker`` CPUs, ended by :meth:`close`; ``auto`` or ``HOST:PORT`` joins
            that cluster, left running.
        cpus_per_worker: Ray CPUs reserved per worker (also its torch threads, at least 1).
        gpus_per_worker: Ray GPUs reserved per worker.
        memory_per_worker: Ray memory reserved per worker, in bytes (None: none).
        fraction_samples: Sync: fraction of workers that must finish before the rest stop.
        min_rollout_frac: ... once they have this fraction of their steps.
        max_policy_lag: Async: largest accepted ``learner version - data version``.
        timeout: The hang watchdog: seconds a worker may take to answer a call, per 128 steps
            of a rollout and per round of evaluation episodes; a warning at half of it, a
            :class:`CollectionWorkerError` at its end (None: no limit).
        compress: Workers lz4-compress the rollouts they send.
        evaluate_on_workers: Spread evaluations (``eval``) over the workers.
        allow_unauthenticated: Ray only: join a cluster even without token authentication
            (a loud warning); a private instance always uses it.
    """

    supports_distributed: ClassVar[bool] = True

    @staticmethod
    def config_errors(section: Mapping[str, Any], num_envs: int) -> list[str]:
        """:func:`collector_errors` of a ``collector`` config section, for the config check."""
        return collector_errors(
            num_workers=section.get("num_workers", 1),
            num_envs=num_envs,
            mode=section.get("mode", ""),
            rollouts_per_update=section.get("rollouts_per_update"),
            address=section.get("address"),
        )

    # No defaults: conf/collector/ray.yaml holds them (process.yaml changes a few); the
    # annotations are the types and ranges the config check reads before anything is built.
    def __init__(
        self,
        *,
        spec: CollectionSpec,
        model: Policy,
        device: torch.device | str,
        dist: DistContext | None = None,
        num_workers: Annotated[int | str, Check(ge=1, le=MAX_WORKERS, words=(AUTO,))],
        mode: Annotated[str, Check(choices=MODES)],
        rollouts_per_update: Annotated[int | None, Check(ge=1, le=MAX_WORKERS)],
        backend: Annotated[str, Check(choices=BACKENDS)],
        address: str | None,
        cpus_per_worker: Annotated[float, Check(gt=0)],
        gpus_per_worker: Annotated[float, Check(ge=0)],
        memory_per_worker: Annotated[int | None, Check(gt=0)],
        fraction_samples: Annotated[float, Check(gt=0, le=1)],
        min_rollout_frac: Annotated[float, Check(ge=0, le=1)],
        max_policy_lag: Annotated[int, Check(ge=0)],
        timeout: Annotated[float | None, Check(gt=0)],
        compress: bool,
        evaluate_on_workers: bool,
        allow_unauthenticated: bool,
    ) -> None:
        settings = {
            "num_workers": num_workers, "mode": mode, "backend": backend,
            "rollouts_per_update": rollouts_per_update, "fraction_samples": fraction_samples,
            "min_rollout_frac": min_rollout_frac, "max_policy_lag": max_policy_lag,
            "timeout": timeout, "cpus_per_worker": cpus_per_worker,
            "gpus_per_worker": gpus_per_worker, "memory_per_worker": memory_per_worker,
        }  # fmt: skip
        errors = argument_errors(CollectionWorkerSet.__init__, settings, "collector")
        errors += collector_errors(
            num_workers=num_workers, num_envs=spec.num_envs, mode=mode,
            rollouts_per_update=rollouts_per_update, address=address,
        )  # fmt: skip
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        num_workers = auto_count(num_workers, spec.num_envs, "collector.num_workers")
        per_update = num_workers if rollouts_per_update is None else rollouts_per_update
        self.spec, self.model, self.device = spec, model, torch.device(device)
        self.dist = dist if dist is not None and dist.enabled else None
        self.owner = "" if self.dist is None else f"rank {self.dist.rank} "
        self.rollouts_per_update = per_update if mode == "async" else num_workers
        self.mode, self.backend, self.fraction_samples = mode, backend, fraction_samples
        self.evaluate_on_workers, self.timeout = evaluate_on_workers, timeout
        self.env_slices, kwargs = worker_kwargs(
            spec, num_workers, compress=compress, shared_memory=backend == "process",
            cpus_per_worker=cpus_per_worker,
            min_rollout_frac=min_rollout_frac if fraction_samples < 1.0 else None,
        )  # fmt: skip
        ray_options = dict(
            address=address, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
            memory_per_worker=memory_per_worker, allow_unauthenticated=allow_unauthenticated,
        )  # fmt: skip
        self.calls = WorkerCalls(
            kwargs, self.env_slices, backend=backend, ray_options=ray_options, timeout=timeout,
            owner=self.owner,
        )  # fmt: skip
        self.num_workers, self.pids = num_workers, self.calls.pids
        self.assembler = RolloutAssembler(num_envs=self.num_envs, device=self.device)
        # The run's normalisation statistics: the workers' moments merged, sent with the weights.
        self.normalizer = spec.build_normalizer(spec.task_spaces()[0])
        self.version = 0  # the learner's weights: one more per collect (an update follows each)
        self._versions = [-1] * num_workers  # the version each worker last received
        self._shared: tuple[int, Any] | None = None  # (version, its weights shared once)
        self._sent: list[dict[str, Any]] = [{} for _ in range(num_workers)]
        self._new_episodes_due: set[int] = set()  # workers to start new episodes first
        self._requested = [0] * num_workers  # rollouts asked of each worker (its own count)
        self._async = AsyncCollection(
            self.calls, self._request, rollouts_per_update=self.rollouts_per_update,
            max_policy_lag=max_policy_lag,
        )  # fmt: skip
        log.info(
            "collection: %s%d %s workers (%s, pids %s), environments %s", self.owner,
            num_workers, "Ray" if backend == "ray" else "process", mode,
            ", ".join(map(str, self.pids)),
            ", ".join(f"{s.start}-{s.stop - 1}" for s in self.env_slices),
        )  # fmt: skip

    @property
    def dropped(self) -> int:
        """Async: rollouts dropped (too old, or for another stage) and collected again."""
        return self._async.dropped

    @property
    def max_policy_lag(self) -> int:
        """Async: the largest accepted ``learner version - data version`` (settable)."""
        return self._async.max_policy_lag

    @max_policy_lag.setter
    def max_policy_lag(self, value: int) -> None:
        self._async.max_policy_lag = value

    @property
    def num_envs(self) -> int:
        """Rows of one update's rollout (every worker's, or ``rollouts_per_update``'s)."""
        if self.rollouts_per_update == self.num_workers:
            return self.spec.num_rows
        return self.rollouts_per_update * (self.spec.num_rows // self.num_workers)

    def _send_parameters(self, request: RolloutRequest, workers: Sequence[int]) -> None:
        """``update_algorithm_parameter`` on ``workers`` for each setting that changed.

        Not waited for: a worker runs its calls in order, so its next rollout sees them; their
        outcomes are checked with that rollout's.
        """
        request = as_sent(request)
        self.calls.longest = max(self.calls.longest, request.num_steps)
        for i in workers:
            sent = self._sent[i]
            for name in ALGORITHM_PARAMETERS:
                value = getattr(request, name)
                if name not in sent or sent[name] != value:
                    sent[name] = value
                    self.calls.ack(i, "update_algorithm_parameter", name, value)

    def _send_weights(self, workers: Sequence[int]) -> None:
        """The learner's weights to ``workers`` that lack them, shared once per version."""
        workers = [i for i in workers if self._versions[i] != self.version]
        if not workers:
            return
        if self._shared is None or self._shared[0] != self.version:
            # A copy: the learner's next update must not change them under a worker that has
            # not loaded them yet (torn weights, tagged with the wrong version).
            weights = {
                k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
            }
            self._shared = (self.version, self.calls.share(weights))
        normalizer = None if self.normalizer is None else self.normalizer.state_dict()
        for i in workers:
            self._versions[i] = self.version
            self.calls.ack(i, "set_weights", self._shared[1], self.version, normalizer)

    def _request(self, workers: Sequence[int], request: RolloutRequest) -> list[Any]:
        """Ask ``workers`` for a rollout with the current weights (and a due scene advance)."""
        self._send_parameters(request, workers)
        self._send_weights(workers)
        refs = []
        for i in workers:
            if i in self._new_episodes_due:
                self._new_episodes_due.discard(i)
                self.calls.ack(i, "new_episodes")
            self._requested[i] += 1
            refs.append(self.calls.call(i, "collect_data"))
        return refs

    def update_storage_parameter(self, name: str, value: Any) -> None:
        """``update_storage_parameter`` on every worker (e.g. ``gamma``; checked at once)."""
        self.calls.on_all(
            "update_storage_parameter", name, value, what=f"updating storage parameter {name}"
        )

    def replace_agent_component(
        self, name: str, config: Mapping[str, Any], model: Policy | None = None
    ) -> None:
        """Replace every worker's ``policy`` or ``environments`` (PyTorchRL's hook).

        ``model``: for ``policy``, the learner's new policy built from ``config``; its weights
        go with the next request. Rollouts in flight (async) finish with the old component.
        """
        if name == "policy":
            if model is None:
                raise ValueError("replace_agent_component('policy'): pass the learner's model")
            self.model = model
            self.spec = dataclasses.replace(self.spec, model=dict(config))
            self.assembler.storage = None  # its fields may differ (the recurrent state's)
        elif name == "environments":
            self.spec = self.spec.with_task(dict(config))
        budget = self.calls.budget()
        budget = None if budget is None else max(budget, START_TIMEOUT_S)
        what = f"replacing its {name}"
        self.calls.on_all("replace_agent_component", name, dict(config), what=what, budget=budget)
        self._versions = [-1] * self.num_workers  # the (new) weights go with the next request
        self._shared = None

    def set_request_plan(self, plan: Callable[[int], RolloutRequest | None]) -> None:
        """Tell asynchronous collection what to collect ahead (the trainer's budget).

        ``plan(k)``: the request of the update ``k >= 1`` updates after the one being collected,
        or None when none will come: nothing is collected for it. Without a plan the same
        request is collected ahead (its teacher-forcing position moved on).
        """
        self._async.set_plan(plan)

    def collect(self, request: RolloutRequest) -> Rollout:
        """One update's rollout (see the module docstring for sync and async)."""
        self.version += 1  # the learner updated its weights since the last rollout
        request = as_sent(request)
        if self.mode == "async":
            return self._collect_async(request)
        workers = list(range(self.num_workers))
        return self._assemble(workers, self._collect_sync(self._request(workers, request)))

    def _collect_sync(self, refs: list[Any]) -> list[Any]:
        what = "collecting a rollout"
        if self.fraction_samples >= 1.0:
            return self.calls.gather(refs, what=what)
        enough = math.ceil(self.fraction_samples * len(refs) - 1e-9)
        self.calls.wait(list(enumerate(refs)), enough, self.calls.budget(), what)
        for i, requested in enumerate(self._requested):
            # A no-op for workers already done; its outcome is checked with the results.
            self.calls.ack(i, "stop_collecting", requested - 1)
        return self.calls.gather(refs, what=what)

    def _collect_async(self, request: RolloutRequest) -> Rollout:
        """The first acceptable rollouts."""
        workers, results = self._async.take(request, self.version)
        if self.normalizer is not None:  # the statistics the taken workers get with the weights
            self.normalizer.merge(_moments(results), distributed=self._ddp)
        # Refilled once assembled: a process worker writes its next rollout where this one lies.
        rollout = self._assemble(workers, results, merged=True)
        self._async.refill(request, taken=len(workers))
        return rollout

    def _assemble(
        self, workers: Sequence[int], results: Sequence[ShippedRollout], merged: bool = False
    ) -> Rollout:
        """One rollout of ``workers``' results (in worker order), their statistics logged."""
        steps = min(d.steps for d in results)
        data = [d.cut(steps) for d in results]  # (the same rollout where it is that long)
        if self.normalizer is not None and not merged:  # in worker order: one worker is exact
            self.normalizer.merge(_moments(data), self._ddp)
        lags = [self.version - d.actor_version for d in data]
        widths = [self.env_slices[i].stop - self.env_slices[i].start for i in workers]
        return self.assembler.assemble(
            data,
            widths,
            {
                "collection/policy_lag": sum(lags) / len(lags),
                "collection/policy_lag_max": float(max(lags)),
                "collection/dropped": float(self.dropped),
                "collection/worker_fps": sum(d.fps for d in data) / len(data),
            },
        )

    @property
    def _ddp(self) -> bool:
        return self.dist is not None

    def new_episodes(self) -> None:
        """Every worker starts new episodes: at once (sync) or with its next request (async)."""
        if self.mode == "async":
            self._new_episodes_due = set(range(self.num_workers))
            return
        self.calls.on_all("new_episodes", what="starting new episodes")

    def evaluate(
        self,
        *,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None = None,
    ) -> EvalResult:
        """Run the learner's current policy once on each of ``episode_seeds``.

        With ``evaluate_on_workers`` the list is split over the workers, else it runs here.
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
                sampler=EvalSampler.of_run(self.spec.sampler),
            )
        self._send_weights(range(self.num_workers))
        return self.calls.evaluate(episode_seeds, num_envs, deterministic, action_seed, split)

    def state_dict(self) -> dict[str, Any]:
        """Every worker's episodes in flight, carried state and generators.

        Async rollouts in flight are not saved: a resumed run is not bitwise an uninterrupted
        one.
        """
        states = self.calls.on_all("state_dict", what="saving its state")
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
        budget = self.calls.budget()
        self.calls.gather(
            [self.calls.call(i, "load_state_dict", s) for i, s in enumerate(states)],
            what="restoring its state (replaying its episodes)",
            budget=None if budget is None else max(budget, START_TIMEOUT_S),
        )

    def close(self) -> None:
        """End every worker (closing its environments), and Ray if this set started it."""
        calls = getattr(self, "calls", None)
        if calls is not None:
            del self.calls
            calls.close()
        if getattr(self, "assembler", None) is not None:
            self.assembler.close()  # unmap the workers' shared blocks


def _moments(results: Sequence[ShippedRollout]) -> list[dict[str, Any]]:
    """The normalisation moments the rollouts bring (a normalising run's workers all send some)."""
    moments = [d.normalizer_moments for d in results]
    missing = [d.worker for d, m in zip(results, moments, strict=True) if m is None]
    if missing:
        raise RuntimeError(f"collection worker(s) {missing} sent no normalisation moments")
    return [m for m in moments if m is not None]
