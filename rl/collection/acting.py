"""The learner's policy as the step runner's actor: collecting, evaluating, serving.

:class:`RolloutRecorder` collects: the policy writes its outputs into the step and
:meth:`~RolloutRecorder.next_step` records them in the storage. On CUDA what it reads of a
sampler's step arrives in one copy and the actions go back in one
(:class:`~rl.utils.staging.PinnedTransfers`). :class:`PolicyActor` acts for fixed episode lists
and probe videos, dropping environments that are done; :func:`policy_step` is the same step for
:class:`~rl.evaluation.InferenceAgent`. So a policy acts the same wherever it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.collection.base import Preemption, RolloutRequest
from rl.collection.normalization import Normalizer
from rl.models.policy import (
    ACTIONS,
    EPISODE_STARTS,
    FORCED_ACTIONS,
    LOGPROBS,
    NEXT_STATE,
    OBS,
    STATE,
    VALUES,
    Policy,
    policy_input,
)
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EPISODES, decode_episodes
from rl.sampling.runner import ExpertActor, NoExpertError
from rl.storage.rollout import RolloutStorage
from rl.tasks.fields import EXPERT_ACTIONS
from rl.utils.staging import PinnedTransfers

__all__ = [
    "RAW_OBS",
    "RETURNS",
    "ExpertActor",
    "NoExpertError",
    "PolicyActor",
    "RolloutRecorder",
    "actions_for",
    "carried_step",
    "check_field_names",
    "check_forced",
    "forced_actions",
    "obs_on",
    "policy_step",
    "raw_obs",
    "steps_device",
]


@torch.no_grad()
def policy_step(
    model: Policy,
    obs: Mapping[str, torch.Tensor],
    starts: torch.Tensor,
    state: TensorDict,
    *,
    deterministic: bool,
    generator: torch.Generator | None = None,
    normalizer: Normalizer | None = None,
) -> tuple[torch.Tensor, TensorDict]:
    """The one policy step: ``(actions [N, ...], the state after)`` for ``[N, ...]`` inputs.

    ``normalizer``: the run's, applied frozen.
    """
    if normalizer is not None:
        obs = normalizer.observations(obs)
    step = model.act(
        policy_input(obs, starts, state), deterministic=deterministic, generator=generator
    )
    return step.get(ACTIONS), step.get(NEXT_STATE)


def steps_device(step: Mapping[str, Any]) -> torch.device:
    """Where a sampler's ``step`` lives (its observations'; NumPy: the CPU)."""
    first = next(iter(step["obs"].values()), None)
    return first.device if isinstance(first, torch.Tensor) else torch.device("cpu")


def actions_for(
    actions: torch.Tensor,
    steps_on: torch.device,
    to_host: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray | torch.Tensor:
    """``actions`` as a sampler whose steps live ``steps_on`` takes them.

    A sampler on the actions' accelerator takes the tensor where it is; any other takes NumPy
    (a view of a CPU tensor). ``to_host`` brings accelerator actions to the host (None:
    ``Tensor.cpu``).
    """
    if actions.device.type != "cpu":
        if steps_on == actions.device:
            return actions
        actions = actions.cpu() if to_host is None else to_host(actions)
    return actions.numpy()


class PolicyActor:
    """A policy acting for ``num_envs`` environments; its state and episode starts in the step.

    :meth:`next_step` drops the environments not kept (their state too).

    Args:
        model: The policy (the caller puts it in eval mode).
        generator: Generator of sampled actions (None: the global one).
        normalizer: The run's observation normalisation, applied frozen.
    """

    def __init__(
        self,
        model: Policy,
        num_envs: int,
        *,
        device: torch.device | str,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        normalizer: Normalizer | None = None,
    ) -> None:
        self.model, self.num_envs, self.device = model, num_envs, torch.device(device)
        self.deterministic, self.generator, self.normalizer = deterministic, generator, normalizer
        self.steps_on = torch.device("cpu")  # where the sampler's steps live (set by start)

    def _obs(self, step: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        obs = {k: torch.as_tensor(v).to(self.device) for k, v in step["obs"].items()}
        return obs if self.normalizer is None else dict(self.normalizer.observations(obs))

    def start(self, first: Mapping[str, Any]) -> TensorDict:
        """The first step, of a sampler's reset ``first`` (``[N, ...]`` arrays or tensors)."""
        starts = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.steps_on = steps_device(first)
        state = self.model.initial_state(self.num_envs, self.device)
        return policy_input(self._obs(first), starts, state)

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """Actions ``[N, ...]`` for ``step``, as the sampler takes them (:func:`actions_for`)."""
        with torch.no_grad():
            self.model.act(step, deterministic=self.deterministic, generator=self.generator)
        return actions_for(step.get(ACTIONS), self.steps_on)

    def next_step(
        self, step: TensorDict, result: Mapping[str, Any], keep: torch.Tensor | None = None
    ) -> TensorDict:
        """Episode starts where ``result`` ended one, the state after; ``keep`` stays."""
        done = torch.as_tensor(result["terminated"]) | torch.as_tensor(result["truncated"])
        obs, done, state = self._obs(result), done.to(self.device), step.get(NEXT_STATE)
        if keep is not None:
            mask = keep.to(self.device)
            obs, done, state = {k: v[mask] for k, v in obs.items()}, done[mask], state[mask]
        return policy_input(obs, done, state)


# The carried step's own entries: raw observations (where the policy reads normalised ones) and
# reward scaling's running returns.
RAW_OBS, RETURNS = "raw_obs", "returns"
# Key of the truncated rows among a step's moved tensors (beside str keys and ("obs", k) pairs).
_TRUNCATED_AT = ("truncated_at",)
# Step entries not recorded as fields: the storage keeps observations and state by row.
_NOT_RECORDED = frozenset(
    {OBS, EPISODE_STARTS, STATE, NEXT_STATE, FORCED_ACTIONS, RAW_OBS, RETURNS}
)


def obs_on(step: TensorDict, device: torch.device) -> dict[str, torch.Tensor]:
    """A step's observations by key, on ``device``."""
    obs = step.get("obs")
    if device.type == "cpu":
        return dict(obs.items())
    return {k: v.to(device, non_blocking=True) for k, v in obs.items()}


def raw_obs(step: TensorDict) -> TensorDict:
    """A carried step's observations as the environments gave them."""
    return step.get(RAW_OBS) if RAW_OBS in step.keys() else step.get(OBS)


def carried_step(
    first: TensorDict,
    *,
    field_names: list[str],
    device: torch.device,
    state: TensorDict,
    episode_starts: torch.Tensor,
    returns: torch.Tensor | None = None,
) -> TensorDict:
    """The step a rollout starts from, of a sampler's ``first`` (a reset's): on ``device``."""
    step = policy_input(obs_on(first, device), episode_starts, state)
    for key in field_names:
        step.set(key, first.get(key).to(device, non_blocking=True))
    if returns is not None:
        step.set(RETURNS, returns)
    return step


def forced_actions(
    prob: float, task_fields: Mapping[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """ALGO: AllenAct's teacher forcing: the expert's action with probability ``prob``, else -1.

    The policy takes them in place of a draw (the step's ``forced_actions``) and records their
    log-probabilities under itself, so the update sees what the environment saw.

    Raises:
        ValueError: The task declares no ``expert_actions`` step field.
    """
    expert = task_fields.get(EXPERT_ACTIONS)
    if expert is None:
        raise ValueError(
            f"teacher forcing takes the task's expert actions (step field {EXPERT_ACTIONS!r}, "
            "info['expert_action']), but the task declares no such field "
            "(rl.tasks.fields: StepField); teacher forcing needs a task with an expert"
        )
    forced = (torch.rand(expert.shape).to(device) < prob) & (expert >= 0)
    return torch.where(forced, expert, torch.full_like(expert, -1))


def check_forced(forced: torch.Tensor, actions: torch.Tensor, policy: object) -> int:
    """How many actions were forced; a ValueError where the policy's cannot be forced."""
    if actions.shape != forced.shape or actions.is_floating_point():
        raise ValueError(
            "teacher forcing takes the task's expert actions (one discrete action per "
            f"environment), but the policy's actions have shape {tuple(actions.shape)} "
            f"and dtype {actions.dtype}: teacher forcing needs a Discrete action space"
        )
    where = forced >= 0
    if not torch.equal(actions[where], forced[where].to(actions.dtype)):
        raise ValueError(
            f"policy {type(policy).__name__} did not take the step's forced_actions (teacher "
            "forcing): its act() must take them where >= 0 (rl.models.policy.write_step does)"
        )
    return int(where.sum())


def check_field_names(task_fields: Mapping[str, torch.Tensor], step: Any) -> None:
    """A ValueError where the policy wrote over a task's step field (both are recorded)."""
    clash = sorted(k for k, v in task_fields.items() if step.get(k) is not v)
    if clash:
        raise ValueError(
            f"the policy's act() wrote the task's step field(s) {clash}: both are recorded in "
            "the rollout; rename the policy's (rl.tasks.fields / the keys act() writes)"
        )


class RolloutRecorder:
    """The policy acting for collection, recording each step (a runner's actor).

    Args:
        storage: The rollout storage, reset for this rollout.
        field_names: The task's step fields that come with an observation: recorded beside the
            action taken on it.
        transition_names: Its transition fields (``StepField.transition``): recorded with the
            step that reported them, beside its reward.
        device: Where the model and the storage live.
        steps_on: Where the sampler's steps live (actions go back there).
        preemption: A rule that may end the rollout early.
        transfers: The pinned staging of a CUDA ``device`` (None: each tensor moved by itself).
    """

    def __init__(
        self,
        *,
        model: Policy,
        storage: RolloutStorage,
        request: RolloutRequest,
        field_names: list[str],
        device: torch.device,
        steps_on: torch.device,
        transition_names: list[str] | None = None,
        normalizer: Normalizer | None = None,
        preemption: Preemption | None = None,
        transfers: PinnedTransfers | None = None,
    ) -> None:
        self.model, self.storage, self.request = model, storage, request
        self.field_names, self.device, self.steps_on = field_names, device, steps_on
        self.transition_names = list(transition_names or [])
        self.normalizer, self.preemption = normalizer, preemption
        self.transfers = transfers
        self.stats = ScalarMeanTracker()
        self._episodes: list[TensorDict] = []
        self.teacher_forced, self.env_seconds, self.inference_seconds = 0, 0.0, 0.0
        self._acted = 0.0  # when the last action was handed to the sampler

    def start(self, carried: TensorDict) -> TensorDict:
        """The rollout's first step, of the carried one, recorded as the rollout's row 0.

        Its observations are normalised afresh (the statistics may have moved since).
        """
        step = carried.select(EPISODE_STARTS, STATE, *self.field_names, strict=False)
        raw = raw_obs(carried)
        self._set_obs(step, {str(k): raw.get(k) for k in raw.keys()})
        if RETURNS in carried.keys():
            step.set(RETURNS, carried.get(RETURNS))
        self.storage.set_first(step.get(OBS), step.get(EPISODE_STARTS), step.get(STATE))
        return step

    def _set_obs(self, step: TensorDict, raw: Mapping[str, torch.Tensor]) -> None:
        """``step``'s observations, and the raw ones beside them where they are normalised."""
        if self.normalizer is None:
            step.set(OBS, _entries(raw, step.batch_size))
            return
        step.set(RAW_OBS, _entries(raw, step.batch_size))
        step.set(OBS, _entries(self.normalizer.observations(raw), step.batch_size))

    def _arrived(self, step: TensorDict) -> dict[Any, torch.Tensor]:
        """What the recorder reads of a sampler's ``step``, on the device (one copy on CUDA).

        Final observations come as ``("final_obs", key)`` of the truncated rows only, their
        positions under ``_TRUNCATED_AT``.
        """
        entries: dict[str, Any] = dict(step.items())  # one pass, not a lookup per key
        tensors: dict[Any, torch.Tensor] = {("obs", k): v for k, v in entries["obs"].items()}
        tensors.update((k, entries[k]) for k in self.field_names)
        for key in ("rewards", "terminated", "truncated", *self.transition_names):
            tensors[key] = entries[key]
        final = entries.get("final_obs")
        if final is not None:
            at = entries["truncated"].nonzero().squeeze(1)
            tensors[_TRUNCATED_AT] = at
            tensors.update((("final_obs", k), v[at]) for k, v in final.items())
        if self.device.type == "cpu":
            if self.steps_on.type == "cpu":
                return tensors
            return {k: v.cpu() for k, v in tensors.items()}  # (steps on an accelerator)
        if self.transfers is not None:
            return self.transfers.to_device(tensors)
        return {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}

    def act(self, step: TensorDict) -> np.ndarray | torch.Tensor:
        """The policy's actions for ``step`` (teacher-forced where asked), written into it."""
        t0 = time.perf_counter()
        if self.normalizer is not None:
            self.normalizer.record_observations(dict(step.get(RAW_OBS).items()))
        forced = None
        if self.request.teacher_forcing is not None:
            prob = self.request.teacher_forcing_probability(self.storage.step)
            forced = forced_actions(prob, {k: step.get(k) for k in self.field_names}, self.device)
            step.set(FORCED_ACTIONS, forced)
        # The task's fields before the policy writes: checked for clashes on the first step.
        fields = {k: step.get(k) for k in self.field_names} if self.storage.step == 0 else None
        self.model.act(step)
        actions = step.get(ACTIONS)
        if forced is not None:
            count = check_forced(forced, actions, self.model)
            self.teacher_forced += count
            self.stats.add_scalars(
                {
                    "pipeline/teacher_ratio": count / len(actions),
                    "pipeline/teacher_forcing_prob": prob,
                }
            )
        if fields is not None:
            check_field_names(fields, step)
        host = actions_for(
            actions, self.steps_on, None if self.transfers is None else self.transfers.to_host
        )
        self._acted = time.perf_counter()
        self.inference_seconds += self._acted - t0
        return host

    def next_step(
        self, step: TensorDict, result: TensorDict, keep: torch.Tensor | None = None
    ) -> TensorDict:
        """Record ``step`` and the sampler's ``result`` of it; the step to act on next.

        ``keep`` is always None: training environments never pause.
        """
        t2 = time.perf_counter()
        self.env_seconds += t2 - self._acted
        entries: dict[str, Any] = dict(step.items())  # one pass, not a lookup per key
        # The policy's entries (actions first), the task's fields, then the policy's extras.
        fields = {k: entries[k] for k in (ACTIONS, LOGPROBS, VALUES)}
        fields.update((str(k), v) for k, v in entries.items() if k not in _NOT_RECORDED)
        moved = self._arrived(result)
        obs = {k[1]: v for k, v in moved.items() if isinstance(k, tuple) and k[0] == "obs"}
        fields["truncation_values"] = self._truncation_values(moved, step)
        terminated, truncated = moved["terminated"], moved["truncated"]
        rewards = moved["rewards"]
        starts = terminated | truncated
        # The state before the next observation: truncated-BPTT chunks start from it.
        state = entries[NEXT_STATE]
        nxt: dict[NestedKey, Any] = {}
        if self.normalizer is not None:
            nxt[RAW_OBS] = _entries(obs, step.batch_size)
            obs = dict(self.normalizer.observations(obs))
        nxt[OBS] = _entries(obs, step.batch_size)
        if RETURNS in entries and self.normalizer is not None:  # ALGO: VecNormalize's
            rewards, nxt[RETURNS] = self.normalizer.rewards(
                rewards, entries[RETURNS], starts, self.request.gamma
            )
        nxt.update({EPISODE_STARTS: starts, STATE: state})
        nxt.update((key, moved[key]) for key in self.field_names)
        fields.update(rewards=rewards, terminated=terminated, truncated=truncated)
        for key in self.transition_names:  # a value of this step, like its reward
            fields[key] = moved[key]
        self.storage.insert(fields, obs, state)
        episodes = result.get(EPISODES, None)
        if episodes is not None:
            self._episodes.append(episodes)
        self.inference_seconds += time.perf_counter() - t2
        return TensorDict._new_unsafe(nxt, batch_size=step.batch_size)

    def preempted(self, t: int) -> bool:
        """HARNESS: whether enough workers are done that a straggler ends its rollout at ``t``."""
        return self.preemption is not None and self.preemption.should_stop(
            t + 1, self.request.num_steps
        )

    def _truncation_values(
        self, moved: Mapping[Any, torch.Tensor], step: TensorDict
    ) -> torch.Tensor:
        """ALGO: values of truncated episodes' final observations, to bootstrap from.

        They follow ``step``'s state after; ``moved`` is :meth:`_arrived`'s.
        """
        values = torch.zeros(step.batch_size[0], device=self.device)
        idx = moved.get(_TRUNCATED_AT)
        if idx is None:
            return values
        final = {k[1]: v for k, v in moved.items() if isinstance(k, tuple) and k[0] == "final_obs"}
        if self.normalizer is not None:
            final = dict(self.normalizer.observations(final))
        out, _ = self.model(
            {k: v.unsqueeze(0) for k, v in final.items()},
            torch.zeros(1, len(idx), dtype=torch.bool, device=self.device),
            step.get(NEXT_STATE)[idx],
        )
        values[idx] = out.values[0]
        return values

    def bootstrap_value(self, step: TensorDict) -> torch.Tensor:
        """ALGO: the value the returns bootstrap from: of ``step``, the one after the last."""
        obs = {k: v.unsqueeze(0) for k, v in step.get(OBS).items()}
        out, _ = self.model(obs, step.get(EPISODE_STARTS).unsqueeze(0), step.get(STATE))
        return out.values[0]

    def summary(self) -> dict[str, Any]:
        """The statistics and timings of the rollout, for :class:`~rl.collection.Rollout`."""
        return {
            "episodes": decode_episodes(self._episodes),
            "stats": self.stats.state_dict(),
            "teacher_forced": self.teacher_forced,
            "env_seconds": self.env_seconds,
            "inference_seconds": self.inference_seconds,
        }


def _entries(obs: Mapping[str, torch.Tensor], batch_size: torch.Size) -> TensorDict:
    """Observations by key as a ``TensorDict`` (no checks: the hot path's)."""
    data: dict[NestedKey, Any] = {k: v for k, v in obs.items()}
    return TensorDict._new_unsafe(data, batch_size=batch_size)
