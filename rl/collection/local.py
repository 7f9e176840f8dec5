"""Collection in the trainer's process: a sampler stepped with the learner's own policy.

:class:`InProcessCollector` runs :class:`RolloutRecorder` against its sampler
(:func:`~rl.sampling.base.run_steps`): the policy writes its outputs into the step, and
:meth:`RolloutRecorder.next_step` records them in the storage and makes the next step. On CUDA
what it reads of a sampler's step arrives in one copy and the actions go back in one
(:class:`~rl.utils.staging.PinnedTransfers`).

What one rollout hands the next is saved with the sampler's episodes in flight, so a resumed
run continues exactly. Where ``inference_device`` is not the learner's device (a CPU copy beside
a CUDA learner), the acting copy takes the learner's weights before every rollout (on-policy)
and the rollout is handed over on the learner's device.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.collection.base import CollectionSpec, Preemption, Rollout, RolloutRequest
from rl.collection.episodes import EvalResult, EvalSampler, evaluate_policy
from rl.collection.normalization import Normalizer
from rl.distributed.preemption import RolloutPreemption
from rl.distributed.setup import DistContext
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
from rl.sampling.base import (
    EPISODES,
    Sampler,
    actions_for,
    decode_episodes,
    run_steps,
    steps_device,
)
from rl.sampling.factory import build_sampler
from rl.storage.rollout import RolloutStorage
from rl.tasks.factory import with_split
from rl.tasks.fields import EXPERT_ACTIONS
from rl.utils.config import ConfigError
from rl.utils.saved import saved_like
from rl.utils.staging import PinnedTransfers, pinned_transfers

log = logging.getLogger(__name__)


class InProcessCollector:
    """Collect rollouts from ``sampler`` with ``model`` in this process.

    Args:
        model: The learner's own module (always the current weights).
        device: Where the model lives and the rollouts are handed to the learner.
        inference_device: Where the policy acts and the rollout is recorded (None:
            ``device``); elsewhere a copy of ``model`` acts, synced before every rollout.
        acting_model: That copy, given (None: made here where needed).
        dist: This process's place among the ranks; with ``dist.sync_frac`` a straggler ends
            its rollout early once enough ranks are done.
        preemption: Another rule that may end a rollout early (a collection worker's
            :class:`~rl.collection.worker.StopRequest`); it wins over ``dist``'s.
        task: The task config, which :meth:`evaluate` needs.
        update_normalizer: Merge each rollout's moments into the statistics after it (summed
            over DDP ranks first); False for a collection worker, whose learner merges them.
        allocate: The storage's allocator (shared memory for a process collection worker).
        eval_sampler: How :meth:`evaluate` steps its environments (None: serially).
    """

    supports_distributed: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model: Policy,
        sampler: Sampler,
        device: torch.device | str,
        dist: DistContext | None = None,
        preemption: Preemption | None = None,
        task: Mapping[str, Any] | None = None,
        normalizer: Normalizer | None = None,
        update_normalizer: bool = True,
        allocate: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
        eval_sampler: EvalSampler | None = None,
        inference_device: torch.device | str | None = None,
        acting_model: Policy | None = None,
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
        self.inference_device = (
            self.device if inference_device is None else torch.device(inference_device)
        )
        self.acting_model = self._acting_copy(model) if acting_model is None else acting_model
        copied = self.acting_model is not model
        if copied and allocate is None and self.inference_device.type == "cpu":
            self.allocate = _pinned_zeros if self.device.type == "cuda" else None
        self.transfers = pinned_transfers(self.inference_device)
        self.storage: RolloutStorage | None = None
        self._handed: RolloutStorage | None = None  # (the rollout, on the learner's device)
        self._carry: TensorDict | None = None  # the step the next rollout starts from
        self._steps_on = torch.device("cpu")  # where the sampler's steps live
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
        device: torch.device | str,
        dist: DistContext | None = None,
        inference_device: str = "auto",
    ) -> InProcessCollector:
        """The collector of ``conf/collector/local.yaml``, its sampler built from ``spec``.

        ``inference_device``: see :func:`resolve_inference_device`.
        """
        acting = resolve_inference_device(inference_device, torch.device(device))
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
            inference_device=acting,
        )

    def _acting_copy(self, model: Policy) -> Policy:
        """``model`` where the inference device is the learner's, else a copy of it there."""
        if self.inference_device == self.device:
            return model
        return copy.deepcopy(model).to(self.inference_device).requires_grad_(False)

    @property
    def num_envs(self) -> int:
        """The sampler's environments."""
        return self.sampler.num_envs

    def _storage_for(self, num_steps: int) -> RolloutStorage:
        """The storage, (re)allocated when a rollout is longer than its capacity."""
        if self.storage is None or self.storage.capacity < num_steps:
            self.storage = RolloutStorage(
                num_steps=num_steps,
                num_envs=self.num_envs,
                device=self.inference_device,
                allocate=self.allocate,
            )
        return self.storage

    def _fresh_carry(self, first: TensorDict, state: TensorDict | None = None) -> TensorDict:
        """The step of the sampler's reset ``first``: every environment starts an episode."""
        n, device = self.num_envs, self.inference_device
        self._steps_on = steps_device(first)
        return carried_step(
            first,
            field_names=self._field_names(),
            device=device,
            state=self.acting_model.initial_state(n, device) if state is None else state,
            episode_starts=torch.ones(n, dtype=torch.bool, device=device),
            returns=self._fresh_returns(),
        )

    def _field_names(self, transition: bool = False) -> list[str]:
        """The task's step fields that come with an observation (or, ``transition``, a step)."""
        return [k for k, f in self.sampler.step_fields.items() if f.transition == transition]

    def _fresh_returns(self) -> torch.Tensor | None:
        if self.normalizer is None or not self.normalizer.settings.rewards:
            return None
        return torch.zeros(self.num_envs, dtype=torch.float64)

    def collect(self, request: RolloutRequest) -> Rollout:
        """Fill the storage with ``request.num_steps`` steps of every environment."""
        self._sync_acting_model()
        return self._collect(request)

    @torch.no_grad()
    def _sync_acting_model(self) -> None:
        """ALGO (on-policy): an acting copy takes the learner's current weights and buffers."""
        if self.acting_model is self.model:
            return
        source = self.model.state_dict()
        for key, value in self.acting_model.state_dict().items():
            value.copy_(source[key])

    # Inference mode, not just no_grad: no version counters or view tracking on collection's
    # many small tensors (5-7% of an MLP rollout). The inference tensors it makes (storage,
    # carried state) are used only under it or no_grad.
    @torch.inference_mode()
    def _collect(self, request: RolloutRequest) -> Rollout:
        if self._carry is None:
            self._carry = self._fresh_carry(self.sampler.reset())
        storage = self._storage_for(request.num_steps)
        self.acting_model.eval()
        storage.reset(request.num_steps)
        if self.preemption is not None:
            self.preemption.start(self._rollout_index)
        self._rollout_index += 1
        recorder = RolloutRecorder(
            model=self.acting_model,
            storage=storage,
            request=request,
            field_names=self._field_names(),
            transition_names=self._field_names(transition=True),
            device=self.inference_device,
            steps_on=self._steps_on,
            normalizer=self.normalizer,
            preemption=self.preemption,
            transfers=self.transfers,
        )
        first = recorder.start(self._carry)
        last = run_steps(
            self.sampler, recorder, first, lambda t, *_: recorder.preempted(t), request.num_steps
        )
        if self.preemption is not None:
            if storage.step == request.num_steps:
                self.preemption.finished()
            recorder.stats.add_scalars({self.preemption.metric: storage.step / request.num_steps})
        self._carry = last
        next_value = recorder.bootstrap_value(last).to(self.device)
        if self.normalizer is not None and self.update_normalizer:
            self.normalizer.commit(distributed=self._distributed)  # the next rollout's statistics
        storage = self._hand_over(storage)
        return Rollout(storage=storage, next_value=next_value, **recorder.summary())

    def _hand_over(self, storage: RolloutStorage) -> RolloutStorage:
        """``storage`` on the learner's device (one copy an entry, or none)."""
        if self.acting_model is self.model:
            return storage
        handed = self._handed
        if handed is None or handed.capacity != storage.capacity:
            handed = self._handed = RolloutStorage(
                num_steps=storage.capacity, num_envs=self.num_envs, device=self.device
            )
        handed.reset(storage.num_steps)
        handed.write_envs(slice(0, self.num_envs), storage.rows())
        handed.step, handed.states_recorded = storage.step, storage.states_recorded
        return handed

    def replace_policy(self, model: Policy) -> None:
        """Collect with ``model`` from now on; its recurrent state starts anew (as at a reset)."""
        self.model = model
        self.acting_model = self._acting_copy(model)
        self.storage = self._handed = None  # its fields may differ (the recurrent state's)
        if self._carry is not None:
            fresh = self.acting_model.initial_state(self.num_envs, self.inference_device)
            self._carry.set(STATE, fresh)
            self._carry.set(EPISODE_STARTS, torch.ones_like(self._carry.get(EPISODE_STARTS)))

    def new_episodes(self) -> None:
        """AllenAct's forced scene advance: every environment starts a new episode now.

        The interrupted episodes were bootstrapped as cut-off rollouts already; the recurrent
        state is kept (it is reset at the new episode starts).
        """
        if self._carry is None:
            return
        self._carry = self._fresh_carry(self.sampler.new_episodes(), self._carry.get(STATE))

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

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": episodes in flight, "rollout": carried state, "normalizer"}``.

        Each may be None. Before the first rollout (SIGTERM during start-up) nothing is in
        flight, and a resume starts where this run would have.
        """
        sampler_state: dict[str, Any] | None = None
        rollout: dict[str, Any] | None = None
        if self._carry is not None:
            try:
                sampler_state = self.sampler.state_dict()
            except NotImplementedError:
                pass
            rollout = {
                "episode_starts": self._carry.get(EPISODE_STARTS),
                "state": self._carry.get(STATE).to_dict(),
                "obs": dict(raw_obs(self._carry).items()),
                "returns": self._carry.get(RETURNS, None),
            }
        normalizer = None if self.normalizer is None else self.normalizer.state_dict()
        return {"sampler": sampler_state, "rollout": rollout, "normalizer": normalizer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replay the sampler's episodes in flight and restore the carried state.

        Without saved episodes (or a sampler that cannot restore them) fresh ones start, with a
        warning: the only case where a resumed run differs from an uninterrupted one.
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
        fresh = self.acting_model.initial_state(self.num_envs, self.inference_device)
        returns = self._fresh_returns()  # (None: rewards are not normalised)
        _check_rollout(rollout, fresh, returns)
        try:
            first = self.sampler.load_state_dict(sampler_state)
        except NotImplementedError as e:
            log.warning("%s: starting fresh episodes instead", e)
            return
        obs = obs_on(first, self.inference_device)
        saved = rollout["obs"]
        if set(saved) != set(obs) or not all(
            torch.equal(obs[k], saved[k].to(self.inference_device)) for k in obs
        ):
            log.warning(
                "the restored environments' observations differ from the saved ones (is the "
                "environment deterministic given its seed?); continuing from the restored ones"
            )
        self._steps_on = steps_device(first)
        self._carry = carried_step(
            first,
            field_names=self._field_names(),
            device=self.inference_device,
            state=self._saved_state(rollout, fresh),
            episode_starts=rollout["episode_starts"].to(self.inference_device),
            returns=None if returns is None else rollout.get("returns", returns),
        )

    def _saved_state(self, rollout: Mapping[str, Any], fresh: TensorDict) -> TensorDict:
        """The carried recurrent state of a checkpoint's ``rollout`` entry (``fresh``: its form).

        Format 2 saved a GRU's state as ``hidden`` ``[L, N, H]`` (a dummy ``[1, N, 1]`` for
        memoryless policies); format 3 saves the policy's state as a dict.
        """
        if "state" in rollout:
            saved = TensorDict(rollout["state"], batch_size=fresh.batch_size)
            return saved.to(self.inference_device)
        hidden = rollout["hidden"].to(self.inference_device)
        if set(fresh.keys()) == {"h"}:
            return TensorDict({"h": hidden.transpose(0, 1)}, batch_size=fresh.batch_size)
        return fresh  # a memoryless policy's dummy state

    def close(self) -> None:
        """Close the sampler."""
        self.sampler.close()


# ------------------------------------------- the recorder: the policy acting for collection
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


def _pinned_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed page-locked CPU tensor: a CPU acting copy's rollout, copied to a CUDA learner."""
    return torch.zeros(shape, dtype=dtype).pin_memory()


def resolve_inference_device(value: str, device: torch.device) -> torch.device:
    """Where the policy acts for ``collector.inference_device=value``, the learner on ``device``.

    ``auto`` is ``device`` (``cpu`` beside a CUDA learner is the alternative to measure,
    ``bench/device_path.py``); ``cuda`` on a CUDA learner is its GPU.

    Raises:
        ConfigError: Not ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, or CUDA where there is none.
    """
    text = str(value)
    if text == "auto":
        return device
    kind, _, index = text.partition(":")
    if text != "cpu" and not (kind == "cuda" and (not index or index.isdigit())):
        raise ConfigError(
            f"collector.inference_device: expected auto, cpu, cuda or cuda:N, got {value!r}"
        )
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"collector.inference_device: {value!r} requested but CUDA is not available"
        )
    if text == "cuda" and device.type == "cuda":
        return device
    return torch.device(text)


def _check_rollout(
    rollout: Mapping[str, Any], fresh: TensorDict, returns: torch.Tensor | None
) -> None:
    """A ValueError naming the entry of a checkpoint's ``rollout`` of another kind or shape.

    The file may be anyone's: the carried state must be the policy's (``fresh``: its keys,
    shapes and dtypes), the episode starts a flag per environment, the observations tensors
    (compared with the restored ones), the returns those reward normalisation keeps.
    """
    n = fresh.batch_size[0]
    if not isinstance(rollout, Mapping) or not {"episode_starts", "obs"} <= set(rollout):
        raise ValueError("checkpoint entry rollout: expected episode_starts, obs and state")
    saved_like(
        rollout["episode_starts"], torch.zeros(n, dtype=torch.bool), "rollout.episode_starts"
    )
    if "state" in rollout:
        saved_like(rollout["state"], fresh.cpu().to_dict(), "rollout.state")
    elif set(fresh.keys()) == {"h"}:  # format 2: a GRU's hidden state, [L, N, H]
        saved_like(rollout.get("hidden"), fresh["h"].cpu().transpose(0, 1), "rollout.hidden")
    obs = rollout["obs"]
    if not isinstance(obs, Mapping) or not all(isinstance(v, torch.Tensor) for v in obs.values()):
        raise ValueError("checkpoint entry rollout.obs: expected tensors by key")
    if returns is not None and rollout.get("returns") is not None:
        saved_like(rollout["returns"], returns, "rollout.returns")
