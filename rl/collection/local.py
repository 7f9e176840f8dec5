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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict

from rl.collection.base import CollectionSpec, Preemption, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, evaluate_policy
from rl.collection.normalization import Normalizer
from rl.collection.teacher_forcing import check_field_names, teacher_force
from rl.distributed.preemption import RolloutPreemption
from rl.distributed.setup import DistContext
from rl.models.policy import Policy
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import Sampler, finished_episodes
from rl.sampling.factory import build_sampler
from rl.storage.rollout import RolloutStorage
from rl.tasks.factory import with_split

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Carry:
    """What one rollout hands the next."""

    obs: dict[str, torch.Tensor]  # as the environments returned them (not normalised)
    fields: dict[str, torch.Tensor]  # the task's step fields for those observations
    episode_starts: torch.Tensor
    state: TensorDict  # the policy's recurrent state, batch [N]
    returns: torch.Tensor | None = None  # [N] float64 discounted returns (reward scaling)


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
    ) -> None:
        self.model = model
        self.allocate = allocate
        self.normalizer = normalizer
        self.update_normalizer = update_normalizer
        self._distributed = dist is not None and dist.enabled
        self.task = None if task is None else dict(task)
        self.sampler = sampler
        self.device = torch.device(device)
        self.storage: RolloutStorage | None = None
        self._carry: _Carry | None = None
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

    def _fields(self, step: TensorDict) -> dict[str, torch.Tensor]:
        """The task's step fields of a sampler's step, on the collector's device."""
        return {k: step.get(k).to(self.device) for k in self.sampler.step_fields}

    def _obs(self, step: TensorDict, key: str = "obs") -> dict[str, torch.Tensor]:
        """A step's observations (``obs`` or ``final_obs``) by key, on the collector's device."""
        return {k: v.to(self.device, non_blocking=True) for k, v in step.get(key).items()}

    def _fresh_carry(self, first: TensorDict) -> _Carry:
        n = self.num_envs
        return _Carry(
            obs=self._obs(first),
            fields=self._fields(first),
            episode_starts=torch.ones(n, dtype=torch.bool, device=self.device),
            state=self.model.initial_state(n, self.device),
            returns=self._fresh_returns(),
        )

    def _fresh_returns(self) -> torch.Tensor | None:
        if self.normalizer is None or not self.normalizer.settings.rewards:
            return None
        return torch.zeros(self.num_envs, dtype=torch.float64)

    def _policy_obs(self, obs: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """What the policy sees of ``obs``: normalised when the normalizer says so."""
        return obs if self.normalizer is None else self.normalizer.observations(obs)

    @torch.no_grad()
    def collect(self, request: RolloutRequest) -> Rollout:
        """Fill the storage with ``request.num_steps`` steps of every environment."""
        if self._carry is None:
            self._carry = self._fresh_carry(self.sampler.reset())
        c = self._carry
        model, n = self.model, self.num_envs
        storage = self._storage_for(request.num_steps)
        model.eval()
        storage.reset(request.num_steps)
        norm = self.normalizer
        storage.set_first(self._policy_obs(c.obs), c.episode_starts, c.state)
        stats, episodes = ScalarMeanTracker(), []
        forced_steps, env_seconds, inference_seconds = 0, 0.0, 0.0
        if self.preemption is not None:
            self.preemption.start(self._rollout_index)
        self._rollout_index += 1
        obs, task_fields, starts, state = c.obs, c.fields, c.episode_starts, c.state
        returns = c.returns
        policy_obs = self._policy_obs(obs)
        for t in range(request.num_steps):
            t0 = time.perf_counter()
            if norm is not None:
                norm.record_observations(obs)
            step, state = model.act(policy_obs, starts, state)
            actions, logprobs = step.actions, step.logprobs
            if request.teacher_forcing is not None:
                prob = request.teacher_forcing_probability(t)
                actions, logprobs, count = teacher_force(prob, step, task_fields, self.device)
                forced_steps += count
                stats.add_scalars(
                    {"pipeline/teacher_ratio": count / n, "pipeline/teacher_forcing_prob": prob}
                )
            t1 = time.perf_counter()
            result = self.sampler.step(actions.cpu().numpy())
            t2 = time.perf_counter()
            fields = {
                "actions": actions,
                "logprobs": logprobs,
                "values": step.values,
                **task_fields,  # what the task reported with the observation acted on
                **step.extras,  # fields the policy declares for its own losses
            }
            if t == 0:
                check_field_names(task_fields, step.extras)
            recorded = self._record(storage, fields, result, state, returns)
            obs, policy_obs, starts, returns = recorded
            task_fields = self._fields(result)
            episodes.extend(finished_episodes(result))
            t3 = time.perf_counter()
            inference_seconds += (t1 - t0) + (t3 - t2)
            env_seconds += t2 - t1
            if self.preemption is not None and self.preemption.should_stop(
                t + 1, request.num_steps
            ):
                break  # HARNESS: enough workers are done: this straggler ends its rollout here
        if self.preemption is not None:
            if storage.step == request.num_steps:
                self.preemption.finished()
            stats.add_scalars({self.preemption.metric: storage.step / request.num_steps})
        self._carry = _Carry(
            obs=obs, fields=task_fields, episode_starts=starts, state=state, returns=returns
        )
        # ALGO: the value the returns bootstrap from, by the policy that collected the rollout.
        out, _ = model(
            {k: v.unsqueeze(0) for k, v in policy_obs.items()}, starts.unsqueeze(0), state
        )
        if norm is not None and self.update_normalizer:
            norm.commit(distributed=self._distributed)  # the next rollout's statistics
        return Rollout(
            storage=storage,
            next_value=out.values[0],
            episodes=episodes,
            stats=stats.state_dict(),
            teacher_forced=forced_steps,
            env_seconds=env_seconds,
            inference_seconds=inference_seconds,
        )

    def _record(
        self,
        storage: RolloutStorage,
        fields: dict[str, torch.Tensor],
        result: TensorDict,
        state: TensorDict,
        returns: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], Mapping[str, torch.Tensor], torch.Tensor, Any]:
        """Record a step's ``fields`` and what the environments returned.

        Returns:
            ``(next observations, what the policy sees of them, episode starts, returns)``.
        """
        next_obs = self._obs(result)
        next_policy_obs = self._policy_obs(next_obs)
        fields["truncation_values"] = self._truncation_values(result, state)
        terminated = result.get("terminated").to(self.device)
        truncated = result.get("truncated").to(self.device)
        starts = terminated | truncated
        rewards = result.get("rewards").to(self.device)
        if returns is not None and self.normalizer is not None:  # ALGO: VecNormalize's scaling
            rewards, returns = self.normalizer.rewards(rewards, returns, starts)
        fields.update(rewards=rewards, terminated=terminated, truncated=truncated)
        # The state after the step is the one before the next observation: truncated-BPTT
        # chunks start from it.
        storage.insert(fields, next_policy_obs, state)
        return next_obs, next_policy_obs, starts, returns

    def _truncation_values(self, result: TensorDict, state: TensorDict) -> torch.Tensor:
        """ALGO: values of the final observations of truncated episodes (bootstrapped)."""
        values = torch.zeros(result.batch_size[0], device=self.device)
        if "final_obs" not in result.keys():
            return values
        idx = result.get("truncated").nonzero().squeeze(1).to(self.device)
        final = self._policy_obs({k: v[idx] for k, v in self._obs(result, "final_obs").items()})
        out, _ = self.model(
            {k: v.unsqueeze(0) for k, v in final.items()},
            torch.zeros(1, len(idx), dtype=torch.bool, device=self.device),
            state[idx],
        )
        values[idx] = out.values[0]
        return values

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
                "obs": dict(self._carry.obs),
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
        obs = self._obs(first)
        saved = rollout["obs"]
        if set(saved) != set(obs) or not all(
            torch.equal(obs[k], saved[k].to(self.device)) for k in obs
        ):
            log.warning(
                "the restored environments' observations differ from the saved ones (is the "
                "environment deterministic given its seed?); continuing from the restored ones"
            )
        self._carry = _Carry(
            obs=obs,
            fields=self._fields(first),
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
