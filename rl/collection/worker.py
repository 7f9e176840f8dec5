"""A collection worker (PyTorchRL's ``CWorker``): a policy copy, its environments, its storage.

:class:`CollectionWorker` runs as a Ray actor, in a child process or in-process. It builds its
own copy of the policy and a sampler over its share of the training environments from plain
configs, and collects with an :class:`~rl.collection.InProcessCollector`. The learner drives it
through its public methods (PyTorchRL's names).

Worker 0 seeds its generators with the run's seed and builds the policy exactly as the trainer
does, so one worker collects bitwise what in-process collection collects; worker ``w > 0``
reseeds with ``seed + w`` after building the policy (as DDP ranks do).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl.collection.base import CollectionSpec, RolloutRequest
from rl.collection.episodes import EvalSampler, evaluate_policy
from rl.collection.local import InProcessCollector
from rl.collection.transport import ShippedRollout, ship
from rl.models.policy import build_policy
from rl.sampling.factory import build_sampler
from rl.tasks.factory import with_split
from rl.utils.finite import as_count
from rl.utils.seeding import rng_state, set_rng_state, set_seed
from rl.utils.shared_memory import SharedBuffers

ALGORITHM_PARAMETERS = tuple(f.name for f in dataclasses.fields(RolloutRequest))
STORAGE_PARAMETERS = ("gamma",)
AGENT_COMPONENTS = ("policy", "environments")
# The worker's policy is built on the CPU and never moved; the learner moves the rollouts.
WORKER_DEVICE = torch.device("cpu")


class StopRequest:
    """A rollout that ends once the learner asks and ``min_rollout_frac`` of it is done."""

    metric = "collection/rollout_frac"

    def __init__(self, min_rollout_frac: float) -> None:
        self.min_rollout_frac = min_rollout_frac
        self._lock = threading.Lock()
        self._current = -1
        self._stop = -1

    def begin(self, rollout_index: int) -> None:
        """The worker's rollout ``rollout_index`` (its own count) begins."""
        with self._lock:
            self._current = rollout_index

    def start(self, rollout_index: int) -> None:
        """The collector's hook; the worker numbers its rollouts itself (:meth:`begin`)."""

    def request(self, rollout_index: int) -> None:
        """End rollout ``rollout_index`` early (ignored once a later one runs)."""
        with self._lock:
            self._stop = max(self._stop, rollout_index)

    def should_stop(self, steps_done: int, num_steps: int) -> bool:
        """Whether this rollout was asked to stop and has its minimum of steps."""
        minimum = max(1, math.ceil(self.min_rollout_frac * num_steps - 1e-9))
        with self._lock:
            asked = self._stop >= self._current
        return asked and minimum <= steps_done < num_steps

    def finished(self) -> None:
        """Nothing to tell anyone: the learner sees the rollout come back."""


class CollectionWorker:
    """Collect rollouts of ``num_envs`` environments with a copy of the policy.

    Args:
        index: The worker's index (its seed offset and its name in errors).
        env_offset: Index of its first environment among the collector's.
        min_rollout_frac: Minimum fraction of a rollout collected before an early stop (None:
            never stopped early).
        compress: lz4-compress the rollouts it returns.
        shared_memory: Keep the rollout storage in shared memory and send the learner its
            blocks' names (a child process of the learner).
    """

    def __init__(
        self,
        *,
        index: int,
        spec: CollectionSpec,
        num_envs: int,
        env_offset: int,
        min_rollout_frac: float | None = None,
        compress: bool = False,
        shared_memory: bool = False,
        torch_threads: int = 1,
    ) -> None:
        torch.set_num_threads(torch_threads)
        self.index = index
        self.spec = spec
        self.compress = compress
        self.shared = SharedBuffers() if shared_memory and not compress else None
        self.num_envs, self.env_offset = num_envs, env_offset
        set_seed(spec.seed)
        self.model = build_policy(spec.model, *spec.task_spaces(), groups=spec.groups)
        if index:
            set_seed(spec.seed + index)
        self.stop_request = None if min_rollout_frac is None else StopRequest(min_rollout_frac)
        sampler = self._sampler(spec.task)
        # The learner merges every worker's moments and sends the statistics back.
        self.normalizer = spec.build_normalizer(sampler.observation_space)
        self.collector = self._collector(sampler)
        self.request = RolloutRequest(num_steps=1)
        self.actor_version = 0
        self.rollouts = 0

    def _sampler(self, task: Mapping[str, Any]) -> Any:
        spec = self.spec
        return build_sampler(
            spec.sampler,
            task=dict(task),
            seed=spec.seed,
            num_envs=self.num_envs,
            env_offset=spec.env_offset + self.env_offset,
            total_envs=spec.total_envs or spec.env_offset + spec.num_envs,
        )

    def _collector(self, sampler: Any) -> InProcessCollector:
        return InProcessCollector(
            model=self.model,
            sampler=sampler,
            device=WORKER_DEVICE,
            preemption=self.stop_request,
            normalizer=self.normalizer,
            update_normalizer=False,
            allocate=None if self.shared is None else self.shared.allocate,
        )

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def set_weights(
        self,
        weights: Mapping[str, torch.Tensor],
        version: int,
        normalizer: Mapping[str, Any] | None = None,
    ) -> None:
        """Install the learner's weights (``version``: its update count) and statistics."""
        self.model.load_state_dict(weights)
        self.actor_version = int(version)
        if self.normalizer is not None and normalizer is not None:
            self.normalizer.load_state_dict(normalizer)

    def update_algorithm_parameter(self, name: str, value: Any) -> None:
        """Change a collection setting (one of :data:`ALGORITHM_PARAMETERS`) from now on."""
        if name not in ALGORITHM_PARAMETERS:
            raise ValueError(
                f"collection worker {self.index}: unknown algorithm parameter {name!r} "
                f"(known: {', '.join(ALGORITHM_PARAMETERS)})"
            )
        self.request = dataclasses.replace(self.request, **{name: value})

    def update_storage_parameter(self, name: str, value: Any) -> None:
        """Change what the worker computes its stored data with (:data:`STORAGE_PARAMETERS`).

        ``gamma``: reward normalisation's discount (no effect without normalisation).
        """
        if name not in STORAGE_PARAMETERS:
            raise ValueError(
                f"collection worker {self.index}: unknown storage parameter {name!r} "
                f"(known: {', '.join(STORAGE_PARAMETERS)})"
            )
        if self.normalizer is not None:
            changes: dict[str, Any] = {name: float(value)}
            self.normalizer.settings = dataclasses.replace(self.normalizer.settings, **changes)

    def replace_agent_component(self, name: str, config: Mapping[str, Any]) -> None:
        """Replace the worker's ``policy`` or ``environments`` (:data:`AGENT_COMPONENTS`).

        ``policy``: ``config`` is a model config; the new policy collects once the learner sends
        weights that fit it. ``environments``: a task config; the environments are rebuilt with
        the same seeds (fresh episodes, the policy's state anew).
        """
        if name not in AGENT_COMPONENTS:
            raise ValueError(
                f"collection worker {self.index}: unknown agent component {name!r} "
                f"(known: {', '.join(AGENT_COMPONENTS)})"
            )
        if name == "policy":
            self.spec = dataclasses.replace(self.spec, model=dict(config))
            self.model = build_policy(
                self.spec.model, *self.spec.task_spaces(), groups=self.spec.groups
            )
            self.collector.replace_policy(self.model)
            return
        self.spec = self.spec.with_task(config)
        sampler = self._sampler(self.spec.task)
        self.collector.close()
        self.collector = self._collector(sampler)

    def stop_collecting(self, rollout_index: int) -> None:
        """End rollout ``rollout_index`` early (ignored once it is over).

        Rollouts are counted from 0 over the worker's life, resumes included. Both backends
        serve this call while a rollout is being collected.
        """
        if self.stop_request is not None:
            self.stop_request.request(rollout_index)

    def new_episodes(self) -> None:
        """Every environment starts a new episode before the next rollout."""
        self.collector.new_episodes()

    def collect_data(self) -> ShippedRollout:
        """Collect one rollout with the current weights and settings, as shipped."""
        t0 = time.perf_counter()
        if self.stop_request is not None:
            self.stop_request.begin(self.rollouts)
        rollout = self.collector.collect(self.request)
        seconds = time.perf_counter() - t0
        data = dataclasses.replace(
            ship(rollout, compress=self.compress, shared=self.shared),
            worker=self.index,
            rollout_index=self.rollouts,
            actor_version=self.actor_version,
            fps=rollout.num_steps * self.collector.num_envs / max(seconds, 1e-9),
            normalizer_moments=self.collector.take_normalizer_moments(),
        )
        self.rollouts += 1
        return data

    def evaluate(
        self,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None = None,
    ) -> list[dict[str, Any]]:
        """Per-episode records of the current policy on ``episode_seeds`` (of ``split``)."""
        result = evaluate_policy(
            model=self.model,
            task=with_split(self.spec.task, split),
            episode_seeds=episode_seeds,
            num_envs=num_envs,
            deterministic=deterministic,
            action_seed=action_seed,
            device=WORKER_DEVICE,
            normalizer=self.normalizer,
            sampler=EvalSampler.of_run(self.spec.sampler),
        )
        return result.episodes

    def state_dict(self) -> dict[str, Any]:
        """Episodes in flight, carried state, generators and version (``weights_only``-safe).

        Not the collection settings: the learner sends them before every rollout.
        """
        return {
            **self.collector.state_dict(),
            "rng": rng_state(),
            "actor_version": self.actor_version,
            "rollouts": self.rollouts,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (instead of resetting the environments)."""
        version, rollouts = as_count(state.get("actor_version")), as_count(state.get("rollouts"))
        if version is None or rollouts is None:
            raise ValueError("checkpoint entries actor_version, rollouts: expected ints >= 0")
        self.collector.load_state_dict(state)
        self.actor_version, self.rollouts = version, rollouts
        set_rng_state(state["rng"])  # last: the replay above must not draw from them

    def close(self) -> None:
        """Close the environments; unlink the shared rollout storage."""
        self.collector.close()
        if self.shared is not None:
            self.shared.close()
