"""Collection in the trainer's process: a sampler stepped with the learner's own policy.

:class:`InProcessCollector` is the first :class:`~rl.collection.Collector`. Each step it runs
the policy on the current observations (the recurrent state carried along and reset at episode
starts), replaces sampled actions by the expert's with the request's teacher-forcing
probability, steps the sampler, bootstraps truncated episodes from the value of their final
observation, and records everything in its :class:`~rl.storage.RolloutStorage`. Under DDP with
``distributed.sync_frac`` set, a straggler ends its rollout early once enough workers are done
(:class:`~rl.distributed.RolloutPreemption`). What one rollout hands the next (observations,
expert actions, episode starts, recurrent state) stays here and is saved with the sampler's
episodes in flight, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from rl.collection.base import CollectionSpec, Preemption, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, evaluate_policy
from rl.distributed.preemption import RolloutPreemption
from rl.distributed.setup import DistContext
from rl.models import distributions as D
from rl.models.actor_critic import ActorCritic
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import Sampler
from rl.sampling.convert import obs_to_torch
from rl.sampling.factory import build_sampler
from rl.storage.rollout import RolloutStorage
from rl.tasks.factory import with_split

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Carry:
    """What one rollout hands the next."""

    obs: dict[str, torch.Tensor]
    expert: torch.Tensor  # [N] int64 on the CPU, -1 where the task gives none
    episode_starts: torch.Tensor
    hidden: torch.Tensor


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
    """

    supports_distributed: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model: ActorCritic,
        sampler: Sampler,
        device: torch.device | str = "cpu",
        dist: DistContext | None = None,
        preemption: Preemption | None = None,
        task: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
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
        model: ActorCritic,
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
        return cls(model=model, sampler=sampler, device=device, dist=dist, task=spec.task)

    @property
    def num_envs(self) -> int:
        """Environments of the sampler."""
        return self.sampler.num_envs

    # ------------------------------------------------------------ collection
    def _storage_for(self, num_steps: int) -> RolloutStorage:
        """The storage, (re)allocated when a rollout is longer than its capacity."""
        if self.storage is None or self.storage.capacity < num_steps:
            self.storage = RolloutStorage.for_space(
                num_steps=num_steps,
                num_envs=self.num_envs,
                observation_space=self.sampler.observation_space,
                hidden_shape=self.model.hidden_shape,
                device=self.device,
            )
        return self.storage

    def _fresh_carry(self, obs_np: Mapping[str, np.ndarray], expert_np: np.ndarray) -> _Carry:
        n = self.num_envs
        return _Carry(
            obs=obs_to_torch(obs_np, self.device),
            expert=torch.from_numpy(expert_np),
            episode_starts=torch.ones(n, dtype=torch.bool, device=self.device),
            hidden=self.model.initial_hidden(n, self.device),
        )

    @torch.no_grad()
    def collect(self, request: RolloutRequest) -> Rollout:
        """Fill the storage with ``request.num_steps`` steps of every environment."""
        if self._carry is None:
            self._carry = self._fresh_carry(*self.sampler.reset())
        c = self._carry
        model, n = self.model, self.num_envs
        storage = self._storage_for(request.num_steps)
        model.eval()
        storage.reset(request.num_steps)
        storage.set_first(c.obs, c.episode_starts, c.hidden)
        stats, episodes = ScalarMeanTracker(), []
        forced_steps, env_seconds, inference_seconds = 0, 0.0, 0.0
        if self.preemption is not None:
            self.preemption.start(self._rollout_index)
        self._rollout_index += 1
        zeros = torch.zeros(n, device=self.device)
        obs, expert, starts, hidden = c.obs, c.expert, c.episode_starts, c.hidden
        for t in range(request.num_steps):
            t0 = time.perf_counter()
            hidden_before = hidden  # truncated-BPTT chunks start from the stored state
            actions, logprobs, values, logits, hidden = model.act(obs, starts, hidden)
            if request.teacher_forcing is not None:
                prob = request.teacher_forcing_probability(t)
                actions, logprobs, count = self._teacher_force(
                    prob, actions, logprobs, logits, expert
                )
                forced_steps += count
                stats.add_scalars(
                    {"pipeline/teacher_ratio": count / n, "pipeline/teacher_forcing_prob": prob}
                )
            t1 = time.perf_counter()
            result = self.sampler.step(actions.cpu().numpy())
            t2 = time.perf_counter()
            next_obs = obs_to_torch(result.obs, self.device)
            truncation_values = zeros
            if len(result.final_obs_indices):
                truncation_values = self._truncation_values(result, hidden, zeros)
            terminated = torch.from_numpy(result.terminated).to(self.device)
            truncated = torch.from_numpy(result.truncated).to(self.device)
            storage.insert(
                next_obs=next_obs,
                actions=actions,
                logprobs=logprobs,
                values=values,
                rewards=torch.from_numpy(result.rewards).to(self.device),
                terminated=terminated,
                truncated=truncated,
                truncation_values=truncation_values,
                expert_actions=expert.to(self.device),
                hidden=hidden_before,
            )
            expert = torch.from_numpy(result.expert_actions)
            episodes.extend(result.episodes)
            t3 = time.perf_counter()
            inference_seconds += (t1 - t0) + (t3 - t2)
            env_seconds += t2 - t1
            obs, starts = next_obs, terminated | truncated
            if self.preemption is not None and self.preemption.should_stop(
                t + 1, request.num_steps
            ):
                break  # HARNESS: enough workers are done: this straggler ends its rollout here
        if self.preemption is not None:
            if storage.step == request.num_steps:
                self.preemption.finished()
            stats.add_scalars({self.preemption.metric: storage.step / request.num_steps})
        self._carry = _Carry(obs=obs, expert=expert, episode_starts=starts, hidden=hidden)
        # ALGO: the value the returns bootstrap from, by the policy that collected the rollout.
        out, _ = model({k: v.unsqueeze(0) for k, v in obs.items()}, starts.unsqueeze(0), hidden)
        return Rollout(
            storage=storage,
            next_value=out.values[0],
            episodes=episodes,
            stats=stats.state_dict(),
            teacher_forced=forced_steps,
            env_seconds=env_seconds,
            inference_seconds=inference_seconds,
        )

    def _teacher_force(
        self,
        prob: float,
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        logits: torch.Tensor,
        expert: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """ALGO: take the expert's action with probability ``prob`` where the task gives one.

        Returns:
            ``(actions taken, their log-probabilities under the policy, how many were forced)``:
            the storage records the action taken, so the update sees what the env saw.
        """
        forced = (torch.rand(actions.shape) < prob) & (expert >= 0)
        if forced.any():
            actions = torch.where(forced.to(self.device), expert.to(self.device), actions)
            logprobs = D.log_prob(logits, actions)
        return actions, logprobs, int(forced.sum())

    def _truncation_values(
        self, result: Any, hidden: torch.Tensor, zeros: torch.Tensor
    ) -> torch.Tensor:
        """ALGO: values of the final observations of truncated episodes (bootstrapped)."""
        idx = torch.from_numpy(result.final_obs_indices).to(self.device)
        final = obs_to_torch(result.final_obs, self.device)
        out, _ = self.model(
            {k: v.unsqueeze(0) for k, v in final.items()},
            torch.zeros(1, len(idx), dtype=torch.bool, device=self.device),
            hidden[:, idx],
        )
        values = zeros.clone()
        values[idx] = out.values[0]
        return values

    def new_episodes(self) -> None:
        """AllenAct's forced scene advance: every environment starts a new episode now.

        The interrupted episodes were bootstrapped as cut-off rollouts already; the recurrent
        state is kept (it is reset at the new episode starts).
        """
        if self._carry is None:
            return
        obs_np, expert_np = self.sampler.new_episodes()
        fresh = self._fresh_carry(obs_np, expert_np)
        self._carry = dataclasses.replace(fresh, hidden=self._carry.hidden)

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
        )

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": episodes in flight or None, "rollout": carried state or None}``."""
        try:
            sampler_state: dict[str, Any] | None = self.sampler.state_dict()
        except NotImplementedError:
            sampler_state = None
        rollout = None
        if self._carry is not None:
            rollout = {
                "expert": self._carry.expert,
                "episode_starts": self._carry.episode_starts,
                "hidden": self._carry.hidden,
                "obs": dict(self._carry.obs),
            }
        return {"sampler": sampler_state, "rollout": rollout}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replay the sampler's episodes in flight and restore the carried state.

        A sampler that cannot restore episodes, or a checkpoint without them, gets fresh
        episodes (with a warning): the only case where a resumed run differs from an
        uninterrupted one.
        """
        rollout, sampler_state = state.get("rollout"), state.get("sampler")
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
            obs_np, expert_np = self.sampler.load_state_dict(sampler_state)
        except NotImplementedError as e:
            log.warning("%s: starting fresh episodes instead", e)
            return
        obs = obs_to_torch(obs_np, self.device)
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
            expert=torch.from_numpy(expert_np),
            episode_starts=rollout["episode_starts"].to(self.device),
            hidden=rollout["hidden"].to(self.device),
        )

    def close(self) -> None:
        """Close the sampler."""
        self.sampler.close()
