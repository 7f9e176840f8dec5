"""Collection's actor: the learner's policy in the step runner, each step recorded.

:class:`RolloutRecorder` is the actor of :func:`~rl.sampling.runner.run_steps` that
collects: it acts (observation normalisation, the policy's action, teacher forcing where the
request asks for it) and, after the sampler's step, records everything in the
:class:`~rl.storage.RolloutStorage`: the policy's outputs and extras, the task's step fields
(:mod:`rl.tasks.fields`) beside the action taken on the observation they came with, the step's
rewards (scaled by reward normalisation) and flags, the value of a truncated episode's final
observation (bootstrapped), the next observation and the recurrent state before it. What one
rollout hands the next is a :class:`Carry`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.acting import actions_for
from rl.collection.base import Preemption, RolloutRequest
from rl.collection.normalization import Normalizer
from rl.collection.teacher_forcing import check_field_names, teacher_force
from rl.models.policy import Policy
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EpisodeRecord, finished_episodes
from rl.storage.rollout import RolloutStorage

__all__ = ["Carry", "RolloutRecorder", "obs_on"]


@dataclasses.dataclass
class Carry:
    """What one rollout hands the next."""

    step: TensorDict  # the sampler's last step: the observations (not normalised) and fields
    episode_starts: torch.Tensor
    state: TensorDict  # the policy's recurrent state, batch [N]
    returns: torch.Tensor | None = None  # [N] float64 discounted returns (reward scaling)


def _on(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    return value if device.type == "cpu" else value.to(device)


def obs_on(step: TensorDict, device: torch.device, key: str = "obs") -> dict[str, torch.Tensor]:
    """A step's observations (``obs`` or ``final_obs``) by key, on ``device``."""
    obs = step.get(key)
    if device.type == "cpu":
        return dict(obs.items())
    return {k: v.to(device, non_blocking=True) for k, v in obs.items()}


class RolloutRecorder:
    """The policy acting for collection, recording each step (a runner's actor).

    Args:
        model: The policy.
        storage: The rollout storage, reset for this rollout.
        request: The rollout's settings (teacher forcing).
        carry: Where the last rollout left off.
        field_names: The task's step fields (the sampler's ``step_fields``) that come with an
            observation: recorded beside the action taken on it.
        transition_names: Its transition fields (``StepField.transition``): recorded with the
            step that reported them, beside its reward.
        device: Where the model and the storage live.
        normalizer: Observation and reward normalisation (None: none).
        preemption: A rule that may end the rollout early (None: none).
    """

    def __init__(
        self,
        *,
        model: Policy,
        storage: RolloutStorage,
        request: RolloutRequest,
        carry: Carry,
        field_names: list[str],
        device: torch.device,
        transition_names: list[str] | None = None,
        normalizer: Normalizer | None = None,
        preemption: Preemption | None = None,
    ) -> None:
        self.model, self.storage, self.request = model, storage, request
        self.field_names, self.device = field_names, device
        self.transition_names = list(transition_names or [])
        self.normalizer, self.preemption = normalizer, preemption
        self.state, self.starts, self.returns = carry.state, carry.episode_starts, carry.returns
        self.obs = obs_on(carry.step, device)
        self.policy_obs = self._policy_obs(self.obs)
        self.task_fields = self._fields(carry.step)
        storage.set_first(self.policy_obs, self.starts, self.state)
        self.stats = ScalarMeanTracker()
        self.episodes: list[EpisodeRecord] = []
        self.teacher_forced, self.env_seconds, self.inference_seconds = 0, 0.0, 0.0
        self._recording: dict[str, torch.Tensor] = {}
        self._acted = 0.0  # when the last action was handed to the sampler

    def _fields(self, step: TensorDict) -> dict[str, torch.Tensor]:
        """The task's step fields of a sampler's step, on the device."""
        if self.device.type == "cpu":
            return {k: step.get(k) for k in self.field_names}
        return {k: step.get(k).to(self.device) for k in self.field_names}

    def _policy_obs(self, obs: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """What the policy sees of ``obs``: normalised when the normalizer says so."""
        return obs if self.normalizer is None else self.normalizer.observations(obs)

    # ----------------------------------------------------------------- acting
    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """The policy's actions for the observations of the last step (teacher-forced maybe)."""
        t0 = time.perf_counter()
        if self.normalizer is not None:
            self.normalizer.record_observations(self.obs)
        out, self.state = self.model.act(self.policy_obs, self.starts, self.state)
        actions, logprobs = out.actions, out.logprobs
        if self.request.teacher_forcing is not None:
            prob = self.request.teacher_forcing_probability(self.storage.step)
            actions, logprobs, count = teacher_force(prob, out, self.task_fields, self.device)
            self.teacher_forced += count
            n = len(actions)
            self.stats.add_scalars(
                {"pipeline/teacher_ratio": count / n, "pipeline/teacher_forcing_prob": prob}
            )
        if self.storage.step == 0:
            check_field_names(self.task_fields, out.extras)
        self._recording = {
            "actions": actions,
            "logprobs": logprobs,
            "values": out.values,
            **self.task_fields,  # what the task reported with the observation acted on
            **out.extras,  # fields the policy declares for its own losses
        }
        self._acted = time.perf_counter()
        self.inference_seconds += self._acted - t0
        return actions_for(step, actions)

    def advance(self, result: TensorDict, keep: torch.Tensor | None) -> None:
        """Nothing: :meth:`record` carried everything on (training environments never pause)."""

    # -------------------------------------------------------------- recording
    def record(self, t: int, step: TensorDict, result: TensorDict) -> bool:
        """Record step ``t``; True when the preemption rule ends the rollout here."""
        t2 = time.perf_counter()
        self.env_seconds += t2 - self._acted
        fields = self._recording
        next_obs = obs_on(result, self.device)
        next_policy_obs = self._policy_obs(next_obs)
        fields["truncation_values"] = self._truncation_values(result)
        terminated = _on(result.get("terminated"), self.device)
        truncated = _on(result.get("truncated"), self.device)
        rewards = _on(result.get("rewards"), self.device)
        starts = terminated | truncated
        if self.returns is not None and self.normalizer is not None:  # ALGO: VecNormalize's
            rewards, self.returns = self.normalizer.rewards(rewards, self.returns, starts)
        fields.update(rewards=rewards, terminated=terminated, truncated=truncated)
        for key in self.transition_names:  # a value of this step, like its reward
            fields[key] = _on(result.get(key), self.device)
        # The state after the step is the one before the next observation: truncated-BPTT
        # chunks start from it.
        self.storage.insert(fields, next_policy_obs, self.state)
        self.obs, self.policy_obs, self.starts = next_obs, next_policy_obs, starts
        self.task_fields = self._fields(result)
        self.episodes.extend(finished_episodes(result))
        self.inference_seconds += time.perf_counter() - t2
        # HARNESS: enough workers are done: a straggler ends its rollout here
        return self.preemption is not None and self.preemption.should_stop(
            t + 1, self.request.num_steps
        )

    def _truncation_values(self, result: TensorDict) -> torch.Tensor:
        """ALGO: values of the final observations of truncated episodes (bootstrapped)."""
        values = torch.zeros(result.batch_size[0], device=self.device)
        if "final_obs" not in result.keys():
            return values
        idx = result.get("truncated").nonzero().squeeze(1).to(self.device)
        final = obs_on(result, self.device, "final_obs")
        final = self._policy_obs({k: v[idx] for k, v in final.items()})
        out, _ = self.model(
            {k: v.unsqueeze(0) for k, v in final.items()},
            torch.zeros(1, len(idx), dtype=torch.bool, device=self.device),
            self.state[idx],
        )
        values[idx] = out.values[0]
        return values

    def bootstrap_value(self) -> torch.Tensor:
        """ALGO: the value the returns bootstrap from, by the policy that collected."""
        obs = {k: v.unsqueeze(0) for k, v in self.policy_obs.items()}
        out, _ = self.model(obs, self.starts.unsqueeze(0), self.state)
        return out.values[0]  # type: ignore[no-any-return]

    def carry(self, step: TensorDict) -> Carry:
        """What the next rollout starts from (``step``: the sampler's last)."""
        return Carry(step, self.starts, self.state, self.returns)

    def summary(self) -> dict[str, Any]:
        """The statistics and timings of the rollout, for :class:`~rl.collection.Rollout`."""
        return {
            "episodes": self.episodes,
            "stats": self.stats.state_dict(),
            "teacher_forced": self.teacher_forced,
            "env_seconds": self.env_seconds,
            "inference_seconds": self.inference_seconds,
        }
