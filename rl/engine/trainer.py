"""The on-policy training loop: collect a rollout -> advantages -> the stage's losses.

``OnPolicyTrainer`` drives one model, one sampler and one :class:`~rl.pipeline.TrainingPipeline`.
Each iteration collects ``num_steps`` steps from every environment (the last rollout of a stage
is shortened so the stage ends at its budget), computes advantages, runs the current stage's
weighted losses for ``update_repeats`` x ``num_mini_batch`` minibatches, steps the schedules with
the env-step count, logs every ``metric_accumulate_interval`` env steps, saves a checkpoint
every ``save_interval`` env steps and at the end of every stage, and advances the stage when its
budget is spent or its early-stopping criterion fires. A stage's off-policy component adds its
updates after each rollout's on-policy update; teacher forcing replaces the sampled action by the
expert's with the stage schedule's probability at each step.

Extension point: ``callbacks`` objects may define ``on_rollout_end(trainer, info)`` and
``on_stage_end(trainer, stage_index)`` (both optional).

Checkpoints are taken at rollout boundaries, after the stage bookkeeping, so a checkpoint holds
a consistent position: :meth:`OnPolicyTrainer.state_dict` saves the model, optimizer, scheduler,
pipeline position, trackers, every RNG the loop draws from, the sampler's episodes in flight and
the observation / recurrent state carried into the next rollout, and
:meth:`OnPolicyTrainer.load_state_dict` restores all of it, so that a resumed run continues
bitwise like an uninterrupted one (single-process sampler, CPU). :meth:`request_stop` (called by
signal handlers) ends training at the next rollout boundary with a checkpoint.

Distributed (``dist`` with several workers, :mod:`rl.distributed`): every worker collects its
own rollout, and the workers meet after it in one all-reduce (global env steps, stop requests).
Budgets and step counts are in global env steps (each rollout adds the sum over workers).
Advantages are normalised with the statistics of all workers' rollouts (per-rollout, global),
each minibatch's gradients are averaged weighted by every worker's batch size, metrics are
reduced over workers before rank 0 logs, and only rank 0 writes checkpoints (each worker's
sampler, carried rollout state and RNGs are gathered into them, so a resume with the same
number of workers continues every worker's episodes). With ``dist.sync_frac`` set, stragglers
end their rollouts early (:class:`~rl.distributed.preemption.RolloutPreemption`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.distributed.preemption import RolloutPreemption
from rl.distributed.reduce import (
    advantage_stats,
    all_reduce_sum,
    average_gradients,
    broadcast_object,
    gather_objects,
    reduce_tracker_states,
)
from rl.distributed.setup import DistContext
from rl.engine.checkpoint import save_checkpoint
from rl.loggers.base import MetricsLogger
from rl.models import distributions as D
from rl.models.actor_critic import ActorCritic
from rl.pipeline.offpolicy import OffPolicyPipelineComponent
from rl.pipeline.schedules import step_lr_scheduler_to
from rl.pipeline.stages import TrainingPipeline, TrainingSettings
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EpisodeRecord, Sampler
from rl.storage.rollout import RolloutStorage
from rl.utils.seeding import rng_state, set_rng_state

log = logging.getLogger(__name__)

# Version of the checkpoint layout written by OnPolicyTrainer.state_dict.
CHECKPOINT_FORMAT = 2

# Stop requests agreed across workers: the highest code wins.
_STOP_CODES = {"SIGINT": 1, "SIGTERM": 2, "SIGUSR1": 3}
_STOP_NAMES = {v: k for k, v in _STOP_CODES.items()}

# cleanrl-compatible names for the sampler's generic episode metrics.
_EPISODE_KEY = {"return": "charts/episodic_return", "length": "charts/episodic_length"}


def episode_metric_key(name: str) -> str:
    """Logged key of an episode metric (``return`` -> ``charts/episodic_return``)."""
    return _EPISODE_KEY.get(name, f"charts/{name}")


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def obs_to_torch(obs: Mapping[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """NumPy observation batch -> tensors on ``device`` (zero-copy on CPU)."""
    return {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in obs.items()}


@dataclasses.dataclass
class RolloutInfo:
    """What one iteration (rollout + updates) did, for callbacks.

    Attributes:
        stage_index: The stage the rollout belonged to.
        num_steps: Rollout length per environment of this worker (shortened at a stage's end,
            or by straggler preemption).
        env_steps: Env steps of the rollout over all workers (``num_steps * num_envs`` on
            one process).
        total_steps: Global env steps after the rollout.
        settings: The stage's effective training settings.
        teacher_forced: Steps whose action was the expert's by teacher forcing.
        offpolicy_updates: Off-policy optimiser steps after the rollout.
    """

    stage_index: int
    num_steps: int
    env_steps: int
    total_steps: int
    settings: TrainingSettings
    teacher_forced: int
    offpolicy_updates: int


class OnPolicyTrainer:
    """Train ``model`` with ``pipeline`` on the environments of ``sampler``.

    Args:
        model: The actor-critic.
        pipeline: Stages, losses, optimizer and schedules.
        sampler: The training environments.
        logger: Where metrics go.
        output_dir: The run folder (checkpoints go to ``output_dir/checkpoints``).
        config: Resolved run config stored in every checkpoint.
        config_unresolved: The composed config before interpolation (``${total_env_steps}``
            kept), stored too so a resume can re-resolve it with new safe overrides.
        wandb_run_id: Id of the wandb run (stored so a resume continues the same run).
        device: Torch device of the model and the rollout storage.
        seed: Seed of the minibatch shuffling generator.
        on_checkpoint: Called with each saved checkpoint's path.
        callbacks: Objects with optional ``on_rollout_end(trainer, info)`` /
            ``on_stage_end(trainer, stage_index)`` methods.
        dist: This worker's place among distributed workers (None: a single process). Every
            worker needs the same pipeline, model and number of environments.
    """

    def __init__(
        self,
        *,
        model: ActorCritic,
        pipeline: TrainingPipeline,
        sampler: Sampler,
        logger: MetricsLogger,
        output_dir: Path,
        config: Mapping[str, Any],
        config_unresolved: Mapping[str, Any] | None = None,
        wandb_run_id: str | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
        on_checkpoint: Callable[[Path], None] | None = None,
        callbacks: Sequence[Any] = (),
        dist: DistContext | None = None,
    ) -> None:
        self.dist = dist if dist is not None else DistContext(device=torch.device(device))
        self.model = model
        self.pipeline = pipeline
        self.sampler = sampler
        self.logger = logger
        self.output_dir = Path(output_dir)
        self.config = dict(config)
        self.config_unresolved = None if config_unresolved is None else dict(config_unresolved)
        self.wandb_run_id = wandb_run_id
        self.device = torch.device(device)
        self.on_checkpoint = on_checkpoint
        self.callbacks = list(callbacks)
        self.optimizer = pipeline.optimizer_builder(params=model.parameters())
        self.lr_scheduler = (
            pipeline.lr_scheduler_builder(optimizer=self.optimizer)
            if pipeline.lr_scheduler_builder is not None
            else None
        )
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        num_steps = max(pipeline.settings_for(i).num_steps for i in range(len(pipeline.stages)))
        space = sampler.observation_space
        self.storage = RolloutStorage(
            num_steps=num_steps,  # type: ignore[arg-type]
            num_envs=sampler.num_envs,
            obs_shapes={k: s.shape for k, s in space.spaces.items()},
            obs_dtypes={
                k: torch.from_numpy(np.zeros((), dtype=s.dtype)).dtype
                for k, s in space.spaces.items()
            },
            hidden_shape=model.hidden_shape,
            device=self.device,
        )
        self.episode_tracker = ScalarMeanTracker()
        self.train_tracker = ScalarMeanTracker()
        self.last_metrics: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self._last_saved_step = -1
        self._last_log_step = -1
        self.offpolicy_update_count = 0
        self._teacher_forced = 0
        self._timers: dict[str, float] = {"env": 0.0, "inference": 0.0, "update": 0.0}
        self._interval_start = (time.perf_counter(), 0)
        # What one rollout hands the next (obs, expert actions, episode starts, hidden state);
        # None until the environments are reset or restored from a checkpoint.
        self._carry: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        # Distributed: the stop request every worker agreed on, and straggler preemption.
        self._agreed_stop: str | None = None
        self._rollout_index = 0
        self.preemption: RolloutPreemption | None = None
        if self.dist.enabled and self.dist.sync_frac is not None:
            self.preemption = RolloutPreemption(
                sync_frac=self.dist.sync_frac,
                min_rollout_frac=self.dist.min_rollout_frac,
                world_size=self.dist.world_size,
            )

    def request_stop(self, reason: str) -> None:
        """Stop at the next rollout boundary, after saving a checkpoint (signal-safe).

        Args:
            reason: Why (e.g. ``"SIGTERM"``); kept in :attr:`stop_reason`.
        """
        if self.stop_reason is None:
            self.stop_reason = reason

    def _stopping(self) -> bool:
        """Whether the loop ends now: a local request, or (distributed) an agreed one."""
        if self.dist.enabled:
            return self._agreed_stop is not None
        return self.stop_reason is not None

    def _sync_rollout(self, local_steps: int) -> int:
        """Global env steps of the rollout; agree on stop requests (one all-reduce).

        Args:
            local_steps: Env steps this worker collected.
        """
        if not self.dist.enabled:
            return local_steps
        code = _STOP_CODES.get(self.stop_reason, 4) if self.stop_reason else 0
        # [steps, how many workers asked to stop with code 1, 2, 3, 4]; the highest code wins.
        requests = [float(code == c) for c in range(1, 5)]
        steps, *counts = all_reduce_sum([float(local_steps), *requests], self.device)
        asked = [c for c in range(1, 5) if counts[c - 1] > 0]
        if asked and self._agreed_stop is None:
            self._agreed_stop = _STOP_NAMES.get(max(asked), "SIGTERM")
        return int(round(steps))

    # ------------------------------------------------------------------ API
    def train(self) -> dict[str, float]:
        """Run every remaining stage of the pipeline; return the last logged metrics.

        Returns early, with a checkpoint saved, when :meth:`request_stop` was called
        (:attr:`stop_reason` says why).
        """
        pipe = self.pipeline
        n = self.sampler.num_envs
        if self._carry is None:
            obs_np, expert_np = self.sampler.reset()
            self._carry = {
                "obs": obs_to_torch(obs_np, self.device),
                "expert": torch.from_numpy(expert_np),
                "episode_starts": torch.ones(n, dtype=torch.bool, device=self.device),
                "hidden": self.model.initial_hidden(n, self.device),
            }
        carry = self._carry
        obs, expert = carry["obs"], carry["expert"]
        episode_starts, hidden = carry["episode_starts"], carry["hidden"]
        if self.lr_scheduler is not None:
            step_lr_scheduler_to(self.lr_scheduler, pipe.total_steps)
        self._interval_start = (time.perf_counter(), pipe.total_steps)
        world = self.dist.world_size
        while not pipe.finished and not self._stopping():
            settings = pipe.current_settings
            num_steps = min(
                settings.num_steps,  # type: ignore[type-var]
                math.ceil(pipe.stage_remaining_steps / (n * world)),
            )
            obs, expert, episode_starts, hidden = self._collect(
                num_steps, obs, expert, episode_starts, hidden
            )
            num_steps = self.storage.step  # fewer when a straggler was preempted
            env_steps = self._sync_rollout(num_steps * n)
            self._carry = {
                "obs": obs,
                "expert": expert,
                "episode_starts": episode_starts,
                "hidden": hidden,
            }
            stage_index, settings = pipe.current_stage_index, pipe.current_settings
            if pipe.current_stage.loss_names:
                self._update(obs, episode_starts, hidden)
            offpolicy = self._offpolicy_update()
            steps_before = pipe.total_steps
            pipe.add_steps(env_steps)
            if self.lr_scheduler is not None:
                step_lr_scheduler_to(self.lr_scheduler, pipe.total_steps)
            period = settings.advance_scene_rollout_period
            if period and pipe.rollout_count % period == 0:
                # HARNESS: AllenAct's forced scene advance: every env starts a new episode
                # (the interrupted ones were bootstrapped as cut-off rollouts already).
                obs, expert, episode_starts = self._new_episodes()
                self._carry.update(obs=obs, expert=expert, episode_starts=episode_starts)
            info = RolloutInfo(
                stage_index=stage_index,
                num_steps=num_steps,
                env_steps=env_steps,
                total_steps=pipe.total_steps,
                settings=settings,
                teacher_forced=self._teacher_forced,
                offpolicy_updates=offpolicy,
            )
            for cb in self.callbacks:
                if hasattr(cb, "on_rollout_end"):
                    cb.on_rollout_end(self, info)
            self._after_rollout(steps_before, stage_index)
        if self.dist.enabled and self.stop_reason != self._agreed_stop:
            # A request after the last agreement: every worker must take the same path.
            if self.stop_reason is not None:
                log.warning("%s arrived after training finished; ignored", self.stop_reason)
            self.stop_reason = self._agreed_stop
        if self.stop_reason is not None:
            # HARNESS: preempted; the trackers stay in the checkpoint (no log, no double count).
            path = self.save()
            log.warning(
                "stopped (%s) at env step %d; checkpoint %s",
                self.stop_reason,
                pipe.total_steps,
                path,
            )
            return dict(self.last_metrics)
        self._log()
        return dict(self.last_metrics)

    def _new_episodes(self) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        obs_np, expert_np = self.sampler.new_episodes()
        n = self.sampler.num_envs
        starts = torch.ones(n, dtype=torch.bool, device=self.device)
        return obs_to_torch(obs_np, self.device), torch.from_numpy(expert_np), starts

    # ------------------------------------------------------------ collection
    @torch.no_grad()
    def _collect(
        self,
        num_steps: int,
        obs: dict[str, torch.Tensor],
        expert: torch.Tensor,
        episode_starts: torch.Tensor,
        hidden: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        # HARNESS: fill the storage with one rollout of every environment.
        model, storage, pipe = self.model, self.storage, self.pipeline
        model.eval()
        storage.reset(num_steps)
        storage.set_first(obs, episode_starts, hidden)
        n = self.sampler.num_envs
        teacher_forcing = pipe.current_stage.teacher_forcing is not None
        self._teacher_forced = 0
        world = self.dist.world_size
        preemption = self.preemption
        if preemption is not None:
            preemption.start(self._rollout_index)
        self._rollout_index += 1
        zeros = torch.zeros(n, device=self.device)
        for t in range(num_steps):
            t0 = time.perf_counter()
            actions, logprobs, values, logits, hidden = model.act(obs, episode_starts, hidden)
            if teacher_forcing:
                # ALGO: take the expert's action with the schedule's probability at this step;
                # the storage records the taken action and its log-probability.
                prob = pipe.teacher_forcing_probability(extra_steps=t * n * world)
                forced = (torch.rand(actions.shape) < prob) & (expert >= 0)
                if forced.any():
                    actions = torch.where(forced.to(self.device), expert.to(self.device), actions)
                    logprobs = D.log_prob(logits, actions)
                count = int(forced.sum())
                self._teacher_forced += count
                self.train_tracker.add_scalars(
                    {"pipeline/teacher_ratio": count / n, "pipeline/teacher_forcing_prob": prob}
                )
            t1 = time.perf_counter()
            result = self.sampler.step(actions.cpu().numpy())
            t2 = time.perf_counter()
            next_obs = obs_to_torch(result.obs, self.device)
            truncation_values = zeros
            if len(result.final_obs_indices):
                # ALGO: bootstrap truncated episodes from the value of their final observation.
                idx = torch.from_numpy(result.final_obs_indices).to(self.device)
                final = obs_to_torch(result.final_obs, self.device)
                out, _ = model(
                    {k: v.unsqueeze(0) for k, v in final.items()},
                    torch.zeros(1, len(idx), dtype=torch.bool, device=self.device),
                    hidden[:, idx],
                )
                truncation_values = zeros.clone()
                truncation_values[idx] = out.values[0]
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
            )
            expert = torch.from_numpy(result.expert_actions)
            self._record_episodes(result.episodes)
            t3 = time.perf_counter()
            self._timers["inference"] += (t1 - t0) + (t3 - t2)
            self._timers["env"] += t2 - t1
            obs, episode_starts = next_obs, terminated | truncated
            if preemption is not None and preemption.should_stop(t + 1, num_steps):
                # HARNESS: enough workers are done: this straggler ends its rollout here.
                break
        if preemption is not None:
            if storage.step == num_steps:
                preemption.finished()
            self.train_tracker.add_scalars({"distributed/rollout_frac": storage.step / num_steps})
        return obs, expert, episode_starts, hidden

    def _record_episodes(self, episodes: list[EpisodeRecord]) -> None:
        for ep in episodes:
            self.episode_tracker.add_scalars(
                {episode_metric_key(k): v for k, v in ep.metrics.items()}
            )

    # ---------------------------------------------------------------- update
    def _update(
        self, obs: dict[str, torch.Tensor], episode_starts: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        pipe, storage, model = self.pipeline, self.storage, self.model
        settings = pipe.current_settings
        stage = pipe.current_stage
        t0 = time.perf_counter()
        with torch.no_grad():
            out, _ = model(
                {k: v.unsqueeze(0) for k, v in obs.items()}, episode_starts.unsqueeze(0), hidden
            )
        storage.compute_returns(
            next_value=out.values[0],
            gamma=settings.gamma,  # type: ignore[arg-type]
            use_gae=settings.use_gae,  # type: ignore[arg-type]
            gae_lambda=settings.gae_lambda,  # type: ignore[arg-type]
        )
        if self.dist.enabled:
            # ALGO: per-rollout advantage normalisation with every worker's rollout (sum, sum of
            # squares and count all-reduced), independent of how the data is split over ranks.
            mean, std, _ = advantage_stats(storage.advantages[: storage.step])
            storage.advantage_stats = (mean, std)
        # ALGO: update_repeats epochs of num_mini_batch minibatches (split by environment).
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        losses = {name: pipe.named_losses[name] for name in stage.loss_names}
        weights = stage.weighted_losses
        for _ in range(settings.update_repeats):  # type: ignore[arg-type]
            for batch in storage.minibatches(settings.num_mini_batch, self.shuffle_generator):  # type: ignore[arg-type]
                output, _ = model(batch.obs, batch.episode_starts, batch.hidden)
                total = torch.zeros((), device=self.device)
                logged: dict[str, float] = {}
                for name, loss in losses.items():
                    result = loss(batch=batch, output=output, step_count=pipe.total_steps)
                    total = total + weights[name] * result.total
                    for key, value in {**result.terms, **result.diagnostics}.items():
                        logged[f"losses/{name}/{key}"] = value
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
                if self.dist.enabled:
                    # ALGO: gradient of the mean over every worker's minibatch.
                    average_gradients(params, batch.num_samples)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)  # type: ignore[arg-type]
                self.optimizer.step()
                logged["losses/total"] = total.item()
                logged["losses/grad_norm"] = grad_norm.item()
                self.train_tracker.add_scalars(
                    {k: v for k, v in logged.items() if not math.isnan(v)}
                )
        self._timers["update"] += time.perf_counter() - t0

    def _offpolicy_update(self) -> int:
        """The current stage's off-policy updates; returns how many optimiser steps ran."""
        component: OffPolicyPipelineComponent | None = (
            self.pipeline.current_stage.offpolicy_component
        )
        if component is None:
            return 0
        t0 = time.perf_counter()
        model, pipe = self.model, self.pipeline
        max_grad_norm = pipe.current_settings.max_grad_norm
        params = [p for p in model.parameters() if p.requires_grad]
        model.train()
        for _ in range(component.updates):
            # ALGO: e.g. behaviour cloning on stored expert trajectories.
            batch = component.next_batch()
            obs = {k: v.to(self.device) for k, v in batch.obs.items()}
            starts = batch.episode_starts.to(self.device)
            batch_size = starts.shape[1]
            output, _ = model(obs, starts, model.initial_hidden(batch_size, self.device))
            total = torch.zeros((), device=self.device)
            logged: dict[str, float] = {}
            for name, weight in component.weighted_losses.items():
                result = pipe.named_losses[name](
                    batch=batch, output=output, step_count=pipe.total_steps
                )
                total = total + weight * result.total
                for key, value in {**result.terms, **result.diagnostics}.items():
                    logged[f"losses/{name}/{key}"] = value
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
            if self.dist.enabled:
                average_gradients(params, starts.numel())
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # type: ignore[arg-type]
            self.optimizer.step()
            self.train_tracker.add_scalars(logged)
            self.offpolicy_update_count += 1
        self.train_tracker.add_scalars({"pipeline/offpolicy_updates": component.updates})
        self._timers["update"] += time.perf_counter() - t0
        return component.updates

    # --------------------------------------------------------- bookkeeping
    def _after_rollout(self, steps_before: int, stage_index: int) -> None:
        # HARNESS: log, advance the stage if it is done, then save once. Saving after the
        # advance keeps a checkpoint's position consistent (a resumed run never has to finish a
        # half-done stage switch); a stage-end checkpoint is named after the stage that ended.
        pipe = self.pipeline
        settings = pipe.current_settings
        steps = pipe.total_steps
        elapsed = time.perf_counter() - self._interval_start[0]
        fps = (steps - self._interval_start[1]) / max(elapsed, 1e-9)
        self.logger.progress(steps, {"stage": pipe.current_stage_index, "fps": f"{fps:,.0f}"})
        interval = settings.metric_accumulate_interval or 0
        if interval and steps // interval > steps_before // interval:
            self._log()
        save_interval = settings.save_interval or 0
        due = bool(save_interval) and steps // save_interval > steps_before // save_interval
        if pipe.should_advance(self.last_metrics):
            self._log()
            pipe.advance()
            if not pipe.finished:
                self.logger.log(steps, {"pipeline/stage": float(pipe.current_stage_index)})
            self.save(stage=stage_index)
            for cb in self.callbacks:
                if hasattr(cb, "on_stage_end"):
                    cb.on_stage_end(self, stage_index)
        elif due:
            self.save(stage=stage_index)

    def _log(self) -> None:
        pipe = self.pipeline
        steps = pipe.total_steps
        if steps == self._last_log_step:
            return
        self._last_log_step = steps
        now = time.perf_counter()
        elapsed = max(now - self._interval_start[0], 1e-9)
        metrics: dict[str, float] = {}
        metrics.update(self._pop_tracker(self.episode_tracker))
        metrics.update(self._pop_tracker(self.train_tracker))
        metrics["charts/SPS"] = (steps - self._interval_start[1]) / elapsed
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        stage_index = min(pipe.current_stage_index, len(pipe.stages) - 1)
        metrics["pipeline/stage"] = float(stage_index)
        metrics["pipeline/stage_steps"] = float(pipe.stage_steps)
        for name, seconds in self._timers.items():
            metrics[f"time/{name}_fraction"] = seconds / elapsed
            self._timers[name] = 0.0
        if self.dist.enabled:
            # Rank 0's view (its timers and SPS): identical last_metrics on every worker keep
            # metric-based stage advances in step.
            metrics = broadcast_object(metrics)
        self.logger.log(steps, metrics)
        self.last_metrics.update(metrics)  # the latest value of every metric
        self._interval_start = (now, steps)

    def _pop_tracker(self, tracker: ScalarMeanTracker) -> dict[str, float]:
        """The tracker's means (over every worker when distributed), then reset it."""
        if not self.dist.enabled:
            return tracker.pop_and_reset()
        state = reduce_tracker_states(tracker.state_dict())
        tracker.reset()
        sums, counts = state["sums"], state["counts"]
        return {k: sums[k] / counts[k] for k in sums if counts.get(k, 0) > 0}

    # ---------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly (safe for ``weights_only`` loading).

        Keys: ``model``, ``optimizer``, ``lr_scheduler``, ``pipeline`` (stage index, step
        counts), ``trackers`` (metric sums and counts not yet logged), ``trainer`` (last
        metrics, log and save positions), ``rng`` (Python, NumPy, torch global, the shuffle
        generator, off-policy data iterators), ``sampler`` (episodes in flight, or None if the
        sampler cannot save them), ``rollout`` (observations, expert actions, episode starts
        and recurrent state carried into the next rollout), ``config`` (resolved),
        ``config_unresolved`` and ``wandb_run_id``. Distributed, it is a collective and rank 0's
        result also holds ``distributed``: ``world_size`` and every rank's ``sampler``,
        ``rollout`` and ``rng`` (the top-level ones are rank 0's).
        """
        sampler_state: dict[str, Any] | None
        try:
            sampler_state = self.sampler.state_dict()
        except NotImplementedError:
            sampler_state = None
        rollout = None
        if self._carry is not None:
            rollout = {k: v for k, v in self._carry.items() if k != "obs"}
            rollout["obs"] = dict(self._carry["obs"])
        state: dict[str, Any] = {
            "format_version": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "pipeline": self.pipeline.state_dict(),
            "trackers": {
                "episode": self.episode_tracker.state_dict(),
                "train": self.train_tracker.state_dict(),
            },
            "trainer": {
                "last_metrics": dict(self.last_metrics),
                "last_log_step": self._last_log_step,
                "offpolicy_update_count": self.offpolicy_update_count,
            },
            "rng": {
                **rng_state(),
                "shuffle": self.shuffle_generator.get_state(),
                "offpolicy": self._offpolicy_rng_states(),
            },
            "sampler": sampler_state,
            "rollout": rollout,
            "config": self.config,
            "config_unresolved": self.config_unresolved,
            "wandb_run_id": self.wandb_run_id,
        }
        if self.dist.enabled:
            mine = {k: _to_cpu(state[k]) for k in ("sampler", "rollout", "rng")}
            ranks = gather_objects(mine)
            if ranks is not None:
                state["distributed"] = {"world_size": self.dist.world_size, "ranks": ranks}
        return state

    def _offpolicy_rng_states(self) -> dict[str, torch.Tensor]:
        """Generator states of the stages' off-policy data iterators, by stage index."""
        out = {}
        for i, stage in enumerate(self.pipeline.stages):
            component = stage.offpolicy_component
            generator = getattr(getattr(component, "data_iterator", None), "generator", None)
            if isinstance(generator, torch.Generator):
                out[str(i)] = generator.get_state()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint written by :meth:`state_dict` (call before :meth:`train`).

        The episodes in flight are restored through the sampler's ``load_state_dict``; a
        sampler that cannot do that gets fresh episodes (with a warning), which is the only
        case where the continuation differs from an uninterrupted run.

        Args:
            state: A loaded checkpoint (see :func:`rl.engine.checkpoint.load_checkpoint`).
        """
        if self.dist.enabled:
            state = self._rank_view(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            sched = dict(state["lr_scheduler"])
            # The schedule functions come from the config (their horizon may have been
            # extended on resume): keep them, restore only the scheduler's counters.
            if "lr_lambdas" in sched:
                sched["lr_lambdas"] = [None] * len(sched["lr_lambdas"])
            self.lr_scheduler.load_state_dict(sched)
        self.pipeline.load_state_dict(state["pipeline"])
        pipe = self.pipeline
        if pipe.finished and pipe.total_steps < pipe.total_max_steps:
            # A finished run resumed with a larger budget: reopen its last stage.
            last = len(pipe.stages) - 1
            pipe.current_stage_index = last
            pipe.stage_steps = pipe.total_steps - sum(
                st.max_stage_steps for st in pipe.stages[:last]
            )
            log.info(
                "budget extended: stage %d continues at its env step %d", last, pipe.stage_steps
            )
        if self.wandb_run_id is None:
            self.wandb_run_id = state.get("wandb_run_id")
        trackers = state.get("trackers") or {}
        if "episode" in trackers:
            self.episode_tracker.load_state_dict(trackers["episode"])
            self.train_tracker.load_state_dict(trackers["train"])
        trainer = state.get("trainer") or {}
        self.last_metrics = dict(trainer.get("last_metrics", {}))
        self._last_log_step = int(trainer.get("last_log_step", -1))
        self.offpolicy_update_count = int(trainer.get("offpolicy_update_count", 0))
        self._last_saved_step = self.pipeline.total_steps
        self._carry = self._restore_rollout(state)
        rng = state["rng"]
        if "shuffle" in rng:
            self.shuffle_generator.set_state(rng["shuffle"])
        for index, generator_state in (rng.get("offpolicy") or {}).items():
            component = self.pipeline.stages[int(index)].offpolicy_component
            component.data_iterator.generator.set_state(generator_state)  # type: ignore[union-attr]
        set_rng_state(rng)  # last: nothing above may draw from the global generators

    def _rank_view(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with this rank's ``sampler``, ``rollout`` and ``rng`` (distributed)."""
        saved = state.get("distributed") or {}
        ranks = saved.get("ranks")
        if ranks is not None and int(saved.get("world_size", 0)) == self.dist.world_size:
            return {**state, **ranks[self.dist.rank]}
        if self.dist.is_main:
            log.warning(
                "the checkpoint holds no per-worker state for %d workers (saved with %s): "
                "every worker starts fresh episodes",
                self.dist.world_size,
                saved.get("world_size", "one process"),
            )
        return {**state, "sampler": None, "rollout": None}

    def _restore_rollout(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        """The carried rollout state, with the sampler's episodes replayed (None: start fresh)."""
        rollout, sampler_state = state.get("rollout"), state.get("sampler")
        if rollout is None:
            return None
        if sampler_state is None:
            log.warning(
                "the checkpoint holds no sampler state (its sampler could not save episodes in "
                "flight): starting fresh episodes; the run will not match an uninterrupted one"
            )
            return None
        try:
            obs_np, expert_np = self.sampler.load_state_dict(sampler_state)
        except NotImplementedError as e:
            log.warning("%s: starting fresh episodes instead", e)
            return None
        obs = obs_to_torch(obs_np, self.device)
        saved_obs = rollout["obs"]
        if set(saved_obs) != set(obs) or not all(
            torch.equal(obs[k], saved_obs[k].to(self.device)) for k in obs
        ):
            log.warning(
                "the restored environments' observations differ from the saved ones (is the "
                "environment deterministic given its seed?); continuing from the restored ones"
            )
        return {
            "obs": obs,
            "expert": torch.from_numpy(expert_np),
            "episode_starts": rollout["episode_starts"].to(self.device),
            "hidden": rollout["hidden"].to(self.device),
        }

    def save(self, stage: int | None = None) -> Path:
        """Write a checkpoint at the current env step (once per step).

        Args:
            stage: Stage index in the file name (default: the current stage; the trainer
                passes the stage that just ended for stage-end checkpoints).

        Returns:
            The checkpoint's path.
        """
        pipe = self.pipeline
        steps = pipe.total_steps
        if steps == self._last_saved_step and self.last_checkpoint is not None:
            return self.last_checkpoint
        if stage is None:
            stage = min(pipe.current_stage_index, len(pipe.stages) - 1)
        state = self.state_dict()  # a collective when distributed
        path: Path | None = None
        if self.dist.is_main:
            path = save_checkpoint(self.output_dir, state, stage, steps)
        if self.dist.enabled:
            path = Path(broadcast_object(None if path is None else str(path)))
        assert path is not None
        self._last_saved_step = steps
        self.last_checkpoint = path
        if self.on_checkpoint is not None and self.dist.is_main:
            self.on_checkpoint(path)
        return path
