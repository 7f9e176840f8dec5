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
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
from rl.utils.seeding import rng_state

# cleanrl-compatible names for the sampler's generic episode metrics.
_EPISODE_KEY = {"return": "charts/episodic_return", "length": "charts/episodic_length"}


def episode_metric_key(name: str) -> str:
    """Logged key of an episode metric (``return`` -> ``charts/episodic_return``)."""
    return _EPISODE_KEY.get(name, f"charts/{name}")


def obs_to_torch(obs: Mapping[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """NumPy observation batch -> tensors on ``device`` (zero-copy on CPU)."""
    return {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in obs.items()}


@dataclasses.dataclass
class RolloutInfo:
    """What one iteration (rollout + updates) did, for callbacks.

    Attributes:
        stage_index: The stage the rollout belonged to.
        num_steps: Rollout length per environment (shortened at a stage's end).
        env_steps: Env steps of the rollout (``num_steps * num_envs``).
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
        device: Torch device of the model and the rollout storage.
        seed: Seed of the minibatch shuffling generator.
        on_checkpoint: Called with each saved checkpoint's path.
        callbacks: Objects with optional ``on_rollout_end(trainer, info)`` /
            ``on_stage_end(trainer, stage_index)`` methods.
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
        device: torch.device | str = "cpu",
        seed: int = 0,
        on_checkpoint: Callable[[Path], None] | None = None,
        callbacks: Sequence[Any] = (),
    ) -> None:
        self.model = model
        self.pipeline = pipeline
        self.sampler = sampler
        self.logger = logger
        self.output_dir = Path(output_dir)
        self.config = dict(config)
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

    # ------------------------------------------------------------------ API
    def train(self) -> dict[str, float]:
        """Run every remaining stage of the pipeline; return the last logged metrics."""
        pipe = self.pipeline
        n = self.sampler.num_envs
        obs_np, expert_np = self.sampler.reset()
        obs = obs_to_torch(obs_np, self.device)
        expert = torch.from_numpy(expert_np)
        episode_starts = torch.ones(n, dtype=torch.bool, device=self.device)
        hidden = self.model.initial_hidden(n, self.device)
        if self.lr_scheduler is not None:
            step_lr_scheduler_to(self.lr_scheduler, pipe.total_steps)
        self._interval_start = (time.perf_counter(), pipe.total_steps)
        while not pipe.finished:
            settings = pipe.current_settings
            num_steps = min(settings.num_steps, math.ceil(pipe.stage_remaining_steps / n))
            obs, expert, episode_starts, hidden = self._collect(
                num_steps, obs, expert, episode_starts, hidden
            )
            stage_index, settings = pipe.current_stage_index, pipe.current_settings
            if pipe.current_stage.loss_names:
                self._update(obs, episode_starts, hidden)
            offpolicy = self._offpolicy_update()
            steps_before = pipe.total_steps
            pipe.add_steps(num_steps * n)
            if self.lr_scheduler is not None:
                step_lr_scheduler_to(self.lr_scheduler, pipe.total_steps)
            info = RolloutInfo(
                stage_index=stage_index,
                num_steps=num_steps,
                env_steps=num_steps * n,
                total_steps=pipe.total_steps,
                settings=settings,
                teacher_forced=self._teacher_forced,
                offpolicy_updates=offpolicy,
            )
            for cb in self.callbacks:
                if hasattr(cb, "on_rollout_end"):
                    cb.on_rollout_end(self, info)
            self._after_rollout(steps_before)
        self._log()
        return dict(self.last_metrics)

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
        zeros = torch.zeros(n, device=self.device)
        for t in range(num_steps):
            t0 = time.perf_counter()
            actions, logprobs, values, logits, hidden = model.act(obs, episode_starts, hidden)
            if teacher_forcing:
                # ALGO: take the expert's action with the schedule's probability at this step;
                # the storage records the taken action and its log-probability.
                prob = pipe.teacher_forcing_probability(extra_steps=t * n)
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
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # type: ignore[arg-type]
            self.optimizer.step()
            self.train_tracker.add_scalars(logged)
            self.offpolicy_update_count += 1
        self.train_tracker.add_scalars({"pipeline/offpolicy_updates": component.updates})
        self._timers["update"] += time.perf_counter() - t0
        return component.updates

    # --------------------------------------------------------- bookkeeping
    def _after_rollout(self, steps_before: int) -> None:
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
        if save_interval and steps // save_interval > steps_before // save_interval:
            self.save()
        if pipe.should_advance(self.last_metrics):
            self._log()
            self.save()
            finished = pipe.current_stage_index
            pipe.advance()
            for cb in self.callbacks:
                if hasattr(cb, "on_stage_end"):
                    cb.on_stage_end(self, finished)
            if not pipe.finished:
                self.logger.log(steps, {"pipeline/stage": float(pipe.current_stage_index)})

    def _log(self) -> None:
        pipe = self.pipeline
        steps = pipe.total_steps
        if steps == self._last_log_step:
            return
        self._last_log_step = steps
        now = time.perf_counter()
        elapsed = max(now - self._interval_start[0], 1e-9)
        metrics: dict[str, float] = {}
        metrics.update(self.episode_tracker.pop_and_reset())
        metrics.update(self.train_tracker.pop_and_reset())
        metrics["charts/SPS"] = (steps - self._interval_start[1]) / elapsed
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        stage_index = min(pipe.current_stage_index, len(pipe.stages) - 1)
        metrics["pipeline/stage"] = float(stage_index)
        metrics["pipeline/stage_steps"] = float(pipe.stage_steps)
        for name, seconds in self._timers.items():
            metrics[f"time/{name}_fraction"] = seconds / elapsed
            self._timers[name] = 0.0
        self.logger.log(steps, metrics)
        self.last_metrics.update(metrics)  # the latest value of every metric
        self._interval_start = (now, steps)

    # ---------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training (safe for ``weights_only`` loading)."""
        return {
            "format_version": 1,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "pipeline": self.pipeline.state_dict(),
            "config": self.config,
            "rng": rng_state(),
        }

    def save(self) -> Path:
        """Write a checkpoint at the current stage and env step (once per step)."""
        pipe = self.pipeline
        steps = pipe.total_steps
        if steps == self._last_saved_step and self.last_checkpoint is not None:
            return self.last_checkpoint
        stage = min(pipe.current_stage_index, len(pipe.stages) - 1)
        path = save_checkpoint(self.output_dir, self.state_dict(), stage, steps)
        self._last_saved_step = steps
        self.last_checkpoint = path
        if self.on_checkpoint is not None:
            self.on_checkpoint(path)
        return path
