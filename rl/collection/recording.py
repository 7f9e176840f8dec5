"""Collection's actor: the learner's policy in the step runner, each step recorded.

:class:`RolloutRecorder` is the actor of :func:`~rl.sampling.runner.run_steps` that
collects: it acts (observation normalisation, the policy's action, teacher forcing where the
request asks for it) and, after the sampler's step, records everything in the
:class:`~rl.storage.RolloutStorage`: the policy's outputs and extras, the task's step fields
(:mod:`rl.tasks.fields`) beside the action taken on the observation they came with, the step's
rewards (scaled by reward normalisation) and flags, the value of a truncated episode's final
observation (bootstrapped), the next observation and the recurrent state before it. What one
rollout hands the next is a :class:`Carry`.

What it reads of a sampler's step reaches the device in one copy a step, and the actions come
back in one (:class:`~rl.utils.staging.PinnedTransfers`, given for a CUDA device); on the CPU
the step's tensors are used as they are.
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
from rl.collection.teacher_forcing import check_field_names, check_forced, forced_actions
from rl.models.policy import (
    ACTIONS,
    EPISODE_STARTS,
    FORCED_ACTIONS,
    NEXT_STATE,
    OBS,
    STATE,
    Policy,
    policy_input,
)
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EpisodeRecord, finished_episodes
from rl.storage.rollout import RolloutStorage
from rl.utils.staging import PinnedTransfers

__all__ = ["Carry", "RolloutRecorder", "obs_on"]


@dataclasses.dataclass
class Carry:
    """What one rollout hands the next."""

    step: TensorDict  # the sampler's last step: the observations (not normalised) and fields
    episode_starts: torch.Tensor
    state: TensorDict  # the policy's recurrent state, batch [N]
    returns: torch.Tensor | None = None  # [N] float64 discounted returns (reward scaling)


# The key of the truncated positions among the tensors moved with a step (beside its str keys
# and the ("obs" | "final_obs", key) pairs).
_TRUNCATED_AT = ("truncated_at",)
# What the policy reads of a step (and the state it writes after it): not recorded with it.
_INPUTS = frozenset({OBS, EPISODE_STARTS, STATE, NEXT_STATE, FORCED_ACTIONS})


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
        transfers: The host <-> device staging of a CUDA ``device`` (None: each tensor moved
            by itself, or, on the CPU, not at all).
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
        transfers: PinnedTransfers | None = None,
    ) -> None:
        self.model, self.storage, self.request = model, storage, request
        self.field_names, self.device = field_names, device
        self.transition_names = list(transition_names or [])
        self.normalizer, self.preemption = normalizer, preemption
        self.transfers = transfers
        self.state, self.starts, self.returns = carry.state, carry.episode_starts, carry.returns
        first_obs = carry.step.get("obs")
        self.obs_keys = list(first_obs.keys())
        # (a sampler's steps stay where they are: a batched environment's may be on a GPU)
        self._host_steps = first_obs.get(self.obs_keys[0]).device.type == "cpu"
        moved = self._arrived(carry.step, after_step=False)
        self.obs = {k: moved["obs", k] for k in self.obs_keys}
        self.policy_obs = self._policy_obs(self.obs)
        self.task_fields = {k: moved[k] for k in self.field_names}
        storage.set_first(self.policy_obs, self.starts, self.state)
        self.stats = ScalarMeanTracker()
        self.episodes: list[EpisodeRecord] = []
        self.teacher_forced, self.env_seconds, self.inference_seconds = 0, 0.0, 0.0
        self._recording: dict[str, torch.Tensor] = {}
        self._acted = 0.0  # when the last action was handed to the sampler

    def _arrived(self, step: TensorDict, *, after_step: bool) -> dict[Any, torch.Tensor]:
        """What the recorder reads of a sampler's ``step``, on the device.

        ``("obs", key)`` for each observation entry and the task's step fields; ``after_step``,
        also ``rewards``, ``terminated``, ``truncated`` and the transition fields and, where
        episodes were truncated, their positions (``_TRUNCATED_AT``) and final observations
        (``("final_obs", key)``, those rows only). One copy on CUDA (``transfers``); on the CPU
        the step's own tensors (no copy).
        """
        tensors: dict[Any, torch.Tensor] = {("obs", k): v for k, v in step.get("obs").items()}
        tensors.update((k, step.get(k)) for k in self.field_names)
        if after_step:
            for key in ("rewards", "terminated", "truncated", *self.transition_names):
                tensors[key] = step.get(key)
            if "final_obs" in step.keys():
                at = step.get("truncated").nonzero().squeeze(1)
                tensors[_TRUNCATED_AT] = at
                tensors.update((("final_obs", k), v[at]) for k, v in step.get("final_obs").items())
        if self.device.type == "cpu":
            if self._host_steps:
                return tensors
            return {k: v.cpu() for k, v in tensors.items()}  # (steps on an accelerator)
        if self.transfers is not None:
            return self.transfers.to_device(tensors)
        return {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}

    def _policy_obs(self, obs: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """What the policy sees of ``obs``: normalised when the normalizer says so."""
        return obs if self.normalizer is None else self.normalizer.observations(obs)

    # ----------------------------------------------------------------- acting
    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """The policy's actions for the observations of the last step (teacher-forced maybe).

        The policy reads the step (observations, episode starts, state, the task's step fields)
        and writes its actions, log-probabilities, values, the state after and its extras into
        it; every entry but its inputs is recorded.
        """
        t0 = time.perf_counter()
        if self.normalizer is not None:
            self.normalizer.record_observations(self.obs)
        policy_step = policy_input(self.policy_obs, self.starts, self.state)
        for key, value in self.task_fields.items():  # what the task reported with the obs
            policy_step.set(key, value)
        forced = None
        if self.request.teacher_forcing is not None:
            prob = self.request.teacher_forcing_probability(self.storage.step)
            forced = forced_actions(prob, self.task_fields, self.device)
            policy_step.set(FORCED_ACTIONS, forced)
        self.model.act(policy_step)
        actions, self.state = policy_step.get(ACTIONS), policy_step.get(NEXT_STATE)
        if forced is not None:
            count = check_forced(forced, actions, self.model)
            self.teacher_forced += count
            self.stats.add_scalars(
                {
                    "pipeline/teacher_ratio": count / len(actions),
                    "pipeline/teacher_forcing_prob": prob,
                }
            )
        if self.storage.step == 0:
            check_field_names(self.task_fields, policy_step)
        self._recording = {
            str(k): policy_step.get(k) for k in policy_step.keys() if k not in _INPUTS
        }
        host = actions_for(
            step, actions, to_host=None if self.transfers is None else self.transfers.to_host
        )
        self._acted = time.perf_counter()
        self.inference_seconds += self._acted - t0
        return host

    def advance(self, result: TensorDict, keep: torch.Tensor | None) -> None:
        """Nothing: :meth:`record` carried everything on (training environments never pause)."""

    # -------------------------------------------------------------- recording
    def record(self, t: int, step: TensorDict, result: TensorDict) -> bool:
        """Record step ``t``; True when the preemption rule ends the rollout here."""
        t2 = time.perf_counter()
        self.env_seconds += t2 - self._acted
        fields = self._recording
        moved = self._arrived(result, after_step=True)
        next_obs = {k: moved["obs", k] for k in self.obs_keys}
        next_policy_obs = self._policy_obs(next_obs)
        fields["truncation_values"] = self._truncation_values(moved, result.batch_size[0])
        terminated, truncated = moved["terminated"], moved["truncated"]
        rewards = moved["rewards"]
        starts = terminated | truncated
        if self.returns is not None and self.normalizer is not None:  # ALGO: VecNormalize's
            rewards, self.returns = self.normalizer.rewards(
                rewards, self.returns, starts, self.request.gamma
            )
        fields.update(rewards=rewards, terminated=terminated, truncated=truncated)
        for key in self.transition_names:  # a value of this step, like its reward
            fields[key] = moved[key]
        # The state after the step is the one before the next observation: truncated-BPTT
        # chunks start from it.
        self.storage.insert(fields, next_policy_obs, self.state)
        self.obs, self.policy_obs, self.starts = next_obs, next_policy_obs, starts
        self.task_fields = {k: moved[k] for k in self.field_names}
        self.episodes.extend(finished_episodes(result))
        self.inference_seconds += time.perf_counter() - t2
        # HARNESS: enough workers are done: a straggler ends its rollout here
        return self.preemption is not None and self.preemption.should_stop(
            t + 1, self.request.num_steps
        )

    def _truncation_values(self, moved: Mapping[Any, torch.Tensor], n: int) -> torch.Tensor:
        """ALGO: values of the final observations of truncated episodes (bootstrapped).

        ``moved``: the step as :meth:`_arrived` gives it; ``n``: its environments.
        """
        values = torch.zeros(n, device=self.device)
        idx = moved.get(_TRUNCATED_AT)
        if idx is None:
            return values
        final = self._policy_obs(
            {k[1]: v for k, v in moved.items() if isinstance(k, tuple) and k[0] == "final_obs"}
        )
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
        return out.values[0]

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
