"""Collection in the trainer's process: a sampler stepped with the learner's own policy.

:class:`InProcessCollector` is the first :class:`~rl.collection.Collector`. Each step it runs
the policy on the current observations (the recurrent state carried along and reset at episode
starts), replaces sampled actions by the expert's with the request's teacher-forcing
probability, steps the sampler, bootstraps truncated episodes from the value of their final
observation, and records everything in its :class:`~rl.storage.RolloutStorage`: the policy's
outputs and extras, the step's rewards and flags, and the task's own step fields
(:mod:`rl.tasks.fields`) beside the action taken on the observation they came with. Under DDP with
``distributed.sync_frac`` set, a straggler ends its rollout early once enough workers are done
(:class:`~rl.distributed.RolloutPreemption`). What one rollout hands the next (observations,
the task's fields, episode starts, recurrent state) stays here and is saved with the sampler's
episodes in flight, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict

from rl.collection.base import CollectionSpec, Preemption, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, EvalSampler, evaluate_policy
from rl.collection.normalization import Normalizer
from rl.collection.recording import Carry, RolloutRecorder, obs_on
from rl.distributed.preemption import RolloutPreemption
from rl.distributed.setup import DistContext
from rl.models.policy import Policy
from rl.sampling.base import Sampler
from rl.sampling.factory import build_sampler
from rl.sampling.runner import run_steps
from rl.storage.rollout import RolloutStorage
from rl.tasks.factory import with_split

log = logging.getLogger(__name__)


class InProcessCollector:
    """Collect rollouts from ``sampler`` with ``model`` in this process.

    Args:
        model: The policy (the learner's own module: always the current weights).
        sampler: The training environments.
        device: Where the model and the rollout storage live.
        dist: This worker's place among distributed workers (straggler preemption through the
            process group's store when ``dist.sync_frac`` is set; None: one process).
        preemption: Another rule that may end a rollout early (e.g. a collection worker's
            :class:`~rl.collection.worker.StopRequest`); it wins over ``dist``'s.
        task: The task config, for :meth:`evaluate` (None: evaluation needs it).
        normalizer: Observation and reward normalisation (None: none).
        update_normalizer: Merge each rollout's moments into the normalizer's statistics
            after the rollout (summed over DDP ranks first); False for a collection worker,
            whose learner merges them (:meth:`take_normalizer_moments`).
        allocate: The storage's allocator (:class:`~rl.storage.RolloutStorage`; a process
            collection worker's puts it in shared memory).
        eval_sampler: How :meth:`evaluate` steps its environments (None: serially; the run's
            :meth:`EvalSampler.of_run <rl.collection.episodes.EvalSampler.of_run>`).
    """

    supports_distributed: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model: Policy,
        sampler: Sampler,
        device: torch.device | str = "cpu",
        dist: DistContext | None = None,
        preemption: Preemption | None = None,
        task: Mapping[str, Any] | None = None,
        normalizer: Normalizer | None = None,
        update_normalizer: bool = True,
        allocate: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
        eval_sampler: EvalSampler | None = None,
    ) -> None:
        self.model = model
        self.eval_sampler = eval_sampler
        self.allocate = allocate
        self.normalizer = normalizer
        self.update_normalizer = update_normalizer
        self._distributed = dist is not None and dist.enabled
        self.task = None if task is None else dict(task)
        self.sampler = sampler
        self.device = torch.device(device)
        self.storage: RolloutStorage | None = None
        self._carry: Carry | None = None
        self.preemption = preemption
        if preemption is None and dist is not None and dist.enabled and dist.sync_frac is not None:
            self.preemption = RolloutPreemption(
                sync_frac=dist.sync_frac,
                min_rollout_frac=dist.min_rollout_frac,
                world_size=dist.world_size,
            )
        self._rollout_index = 0

    @classmethod
    def from_spec(
        cls,
        *,
        spec: CollectionSpec,
        model: Policy,
        device: torch.device | str = "cpu",
        dist: DistContext | None = None,
    ) -> InProcessCollector:
        """The collector of ``conf/collector/local.yaml``: its sampler built from ``spec``."""
        sampler = build_sampler(
            spec.sampler,
            task=spec.task,
            seed=spec.seed,
            env_offset=spec.env_offset,
            total_envs=spec.total_envs,
        )
        return cls(
            model=model,
            sampler=sampler,
            device=device,
            dist=dist,
            task=spec.task,
            normalizer=spec.build_normalizer(sampler.observation_space),
            eval_sampler=EvalSampler.of_run(spec.sampler),
        )

    @property
    def num_envs(self) -> int:
        """Environments of the sampler."""
        return self.sampler.num_envs

    # ------------------------------------------------------------ collection
    def _storage_for(self, num_steps: int) -> RolloutStorage:
        """The storage, (re)allocated when a rollout is longer than its capacity."""
        if self.storage is None or self.storage.capacity < num_steps:
            self.storage = RolloutStorage(
                num_steps=num_steps,
                num_envs=self.num_envs,
                device=self.device,
                allocate=self.allocate,
            )
        return self.storage

    def _fresh_carry(self, first: TensorDict) -> Carry:
        n = self.num_envs
        return Carry(
            step=first,
            episode_starts=torch.ones(n, dtype=torch.bool, device=self.device),
            state=self.model.initial_state(n, self.device),
            returns=self._fresh_returns(),
        )

    def _fresh_returns(self) -> torch.Tensor | None:
        if self.normalizer is None or not self.normalizer.settings.rewards:
            return None
        return torch.zeros(self.num_envs, dtype=torch.float64)

    # Inference mode, not just no_grad: no version counters or view tracking on collection's
    # many small tensors (5-7% of an MLP rollout). What it makes are inference tensors; the
    # storage and the carried state are copied into or used only under it or no_grad.
    @torch.inference_mode()
    def collect(self, request: RolloutRequest) -> Rollout:
        """Fill the storage with ``request.num_steps`` steps of every environment."""
        if self._carry is None:
            self._carry = self._fresh_carry(self.sampler.reset())
        storage = self._storage_for(request.num_steps)
        self.model.eval()
        storage.reset(request.num_steps)
        if self.preemption is not None:
            self.preemption.start(self._rollout_index)
        self._rollout_index += 1
        recorder = RolloutRecorder(
            model=self.model,
            storage=storage,
            request=request,
            carry=self._carry,
            field_names=[k for k, f in self.sampler.step_fields.items() if not f.transition],
            transition_names=[k for k, f in self.sampler.step_fields.items() if f.transition],
            device=self.device,
            normalizer=self.normalizer,
            preemption=self.preemption,
        )
        last = run_steps(
            self.sampler, recorder, self._carry.step, recorder.record, request.num_steps
        )
        if self.preemption is not None:
            if storage.step == request.num_steps:
                self.preemption.finished()
            recorder.stats.add_scalars({self.preemption.metric: storage.step / request.num_steps})
        self._carry = recorder.carry(last)
        next_value = recorder.bootstrap_value()
        if self.normalizer is not None and self.update_normalizer:
            self.normalizer.commit(distributed=self._distributed)  # the next rollout's statistics
        return Rollout(storage=storage, next_value=next_value, **recorder.summary())

    def replace_policy(self, model: Policy) -> None:
        """Collect with ``model`` from now on; its recurrent state starts anew (as at a reset)."""
        self.model = model
        self.storage = None  # its fields may differ (the recurrent state's)
        if self._carry is not None:
            self._carry = dataclasses.replace(
                self._carry,
                state=model.initial_state(self.num_envs, self.device),
                episode_starts=torch.ones_like(self._carry.episode_starts),
            )

    def new_episodes(self) -> None:
        """AllenAct's forced scene advance: every environment starts a new episode now.

        The interrupted episodes were bootstrapped as cut-off rollouts already; the recurrent
        state is kept (it is reset at the new episode starts).
        """
        if self._carry is None:
            return
        fresh = self._fresh_carry(self.sampler.new_episodes())
        self._carry = dataclasses.replace(fresh, state=self._carry.state)

    def evaluate(
        self,
        *,
        episode_seeds: Sequence[int],
        num_envs: int,
        deterministic: bool,
        action_seed: int,
        split: str | None = None,
    ) -> EvalResult:
        """Run the current policy on ``episode_seeds`` (of ``split``) here, each episode once."""
        if self.task is None:
            raise RuntimeError("InProcessCollector.evaluate needs the task config (task=...)")
        return evaluate_policy(
            model=self.model,
            task=with_split(self.task, split),
            episode_seeds=episode_seeds,
            num_envs=num_envs,
            deterministic=deterministic,
            action_seed=action_seed,
            device=self.device,
            normalizer=self.normalizer,
            sampler=self.eval_sampler,
        )

    def take_normalizer_moments(self) -> dict[str, Any] | None:
        """The moments recorded since the last call (a worker sends them to its learner)."""
        return None if self.normalizer is None else self.normalizer.moments()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """What the collector carries, as top-level checkpoint entries.

        ``{"sampler": episodes in flight or None, "rollout": carried state or None,
        "normalizer": its statistics or None}``.
        """
        try:
            sampler_state: dict[str, Any] | None = self.sampler.state_dict()
        except NotImplementedError:
            sampler_state = None
        rollout = None
        if self._carry is not None:
            rollout = {
                "episode_starts": self._carry.episode_starts,
                "state": self._carry.state.to_dict(),
                "obs": obs_on(self._carry.step, self.device),
                "returns": self._carry.returns,
            }
        normalizer = None if self.normalizer is None else self.normalizer.state_dict()
        return {"sampler": sampler_state, "rollout": rollout, "normalizer": normalizer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replay the sampler's episodes in flight and restore the carried state.

        A sampler that cannot restore episodes, or a checkpoint without them, gets fresh
        episodes (with a warning): the only case where a resumed run differs from an
        uninterrupted one.
        """
        rollout, sampler_state = state.get("rollout"), state.get("sampler")
        if self.normalizer is not None and state.get("normalizer") is not None:
            self.normalizer.load_state_dict(state["normalizer"])
        self._carry = None
        if rollout is None:
            return
        if sampler_state is None:
            log.warning(
                "the checkpoint holds no sampler state (its sampler could not save episodes in "
                "flight): starting fresh episodes; the run will not match an uninterrupted one"
            )
            return
        try:
            first = self.sampler.load_state_dict(sampler_state)
        except NotImplementedError as e:
            log.warning("%s: starting fresh episodes instead", e)
            return
        obs = obs_on(first, self.device)
        saved = rollout["obs"]
        if set(saved) != set(obs) or not all(
            torch.equal(obs[k], saved[k].to(self.device)) for k in obs
        ):
            log.warning(
                "the restored environments' observations differ from the saved ones (is the "
                "environment deterministic given its seed?); continuing from the restored ones"
            )
        self._carry = Carry(
            step=first,
            episode_starts=rollout["episode_starts"].to(self.device),
            state=self._saved_state(rollout),
            returns=rollout.get("returns", self._fresh_returns()),
        )

    def _saved_state(self, rollout: Mapping[str, Any]) -> TensorDict:
        """The carried recurrent state of a checkpoint's ``rollout`` entry.

        Checkpoint format 2 saved a GRU's state as ``hidden`` ``[L, N, H]`` (a dummy
        ``[1, N, 1]`` for memoryless policies); format 3 saves the policy's state as a dict.
        """
        fresh = self.model.initial_state(self.num_envs, self.device)
        if "state" in rollout:
            saved = TensorDict(rollout["state"], batch_size=fresh.batch_size)
            return saved.to(self.device)
        hidden = rollout["hidden"].to(self.device)
        if set(fresh.keys()) == {"h"}:
            return TensorDict({"h": hidden.transpose(0, 1)}, batch_size=fresh.batch_size)
        return fresh  # a memoryless policy's dummy state

    def close(self) -> None:
        """Close the sampler."""
        self.sampler.close()
