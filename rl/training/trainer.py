"""The on-policy training loop: collect -> advantages -> update -> after the rollout.

A stage's last rollout is cut so the stage ends at its budget. After each rollout: callbacks, a
log point every ``metric_accumulate_interval`` env steps, the stage's end, and a checkpoint every
``save_interval`` env steps and at every stage's end. :meth:`OnPolicyTrainer.request_stop` ends
training at the next rollout boundary, with a checkpoint.

Distributed, each rank collects its own rollout and the ranks meet after it in one all-reduce
(global env steps and stop requests). Budgets and step counts are global env steps; advantages
are normalised over every rank's rollout; only rank 0 writes checkpoints.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rl.checkpoints.files import save_checkpoint
from rl.checkpoints.retention import CheckpointRetention
from rl.collection.base import Collector, RolloutRequest
from rl.distributed.reduce import broadcast_object
from rl.distributed.setup import DistContext
from rl.loggers.base import MetricsLogger
from rl.models.policy import Policy
from rl.pipeline.stages import TrainingPipeline
from rl.training.callbacks import Callback, RolloutInfo
from rl.training.learner import Learner
from rl.training.metrics import TrainingMetrics
from rl.training.state import RunRecord, TrainerState
from rl.training.stopping import StopAgreement

log = logging.getLogger(__name__)


class OnPolicyTrainer:
    """Train ``model`` with ``pipeline`` on rollouts from ``collector``.

    Args:
        model: The actor-critic (the collector acts with the same module).
        output_dir: The run folder (checkpoints go to ``output_dir/checkpoints``).
        run: The run's config and wandb id, stored in every checkpoint.
        seed: Seed of the minibatch shuffling generator.
        callbacks: Called in order.
        dist: This process's place among the ranks (None: one process). Every rank needs the
            same pipeline, model and number of environments.
        stop: Where stop requests land (signal handlers may hold it before the trainer exists);
            None: a new one.
    """

    def __init__(
        self,
        *,
        model: Policy,
        pipeline: TrainingPipeline,
        collector: Collector,
        logger: MetricsLogger,
        output_dir: Path,
        run: RunRecord | None = None,
        device: torch.device | str,
        seed: int = 0,
        callbacks: Sequence[Callback] = (),
        dist: DistContext | None = None,
        stop: StopAgreement | None = None,
    ) -> None:
        self.dist = dist if dist is not None else DistContext(device=torch.device(device))
        self.model = model
        self.pipeline = pipeline
        self.collector = collector
        self.logger = logger
        self.output_dir = Path(output_dir)
        self.device = torch.device(device)
        self.callbacks = list(callbacks)
        self.learner = Learner(
            model=model, pipeline=pipeline, device=device, seed=seed, dist=self.dist
        )
        self.metrics = TrainingMetrics(logger, self.dist)
        self.stop = stop if stop is not None else StopAgreement(self.dist)
        self.state = TrainerState(
            model=model,
            pipeline=pipeline,
            learner=self.learner,
            metrics=self.metrics,
            collector=collector,
            run=run or RunRecord(),
            dist=self.dist,
        )
        self.last_checkpoint: Path | None = None
        self._last_saved_step = -1
        self.retention = CheckpointRetention(  # best and keep-last-N; rank 0 acts on it
            self.output_dir,
            keep_last=pipeline.keep_last,
            best_metric=pipeline.best_metric,
            best_mode=pipeline.best_mode,
        )
        # HARNESS: a collector that collects ahead (asynchronous workers) asks what the coming
        # updates collect, so that nothing is collected past a stage's or the run's budget.
        set_request_plan = getattr(collector, "set_request_plan", None)
        if set_request_plan is not None:
            set_request_plan(self._request_ahead)

    # ---------------------------------------------------------------- views
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The learner's optimizer."""
        return self.learner.optimizer

    @property
    def last_metrics(self) -> dict[str, float]:
        """The latest logged value of every metric."""
        return self.metrics.last

    @property
    def stop_reason(self) -> str | None:
        """Why training stops early (a signal's name), None while it does not."""
        return self.stop.stop_reason

    def request_stop(self, reason: str) -> None:
        """Stop at the next rollout boundary, after saving a checkpoint (signal-safe)."""
        self.stop.request_stop(reason)

    # ----------------------------------------------------------------- loop
    def train(self) -> dict[str, float]:
        """Run every remaining stage; return the last logged metrics.

        After :meth:`request_stop` this returns early with a checkpoint saved
        (:attr:`stop_reason` says why) and without calling ``on_train_end``.
        """
        pipe = self.pipeline
        self.learner.step_schedules(pipe.total_steps)
        self.metrics.start_interval(pipe.total_steps)
        if self.dist.is_main:
            self.retention.start()  # a resumed run's best so far (reads best.json only)
        for cb in self.callbacks:
            cb.on_train_start(self)
        while not pipe.finished and not self.stop.stopping:
            stage_index = pipe.current_stage_index
            stage, settings = pipe.current_stage, pipe.current_settings
            # 1. Collect a rollout; every rank learns the rollout's global env steps.
            t0 = time.perf_counter()
            rollout = self.collector.collect(self._rollout_request())
            self.metrics.add_rollout(rollout, time.perf_counter() - t0)
            env_steps = self.stop.sync(rollout.num_steps * rollout.storage.num_envs, self.device)
            # 2-3. Advantages and the stage's on-policy update, then its off-policy updates.
            if stage.loss_names:
                self.metrics.add_update(
                    *self.learner.update(rollout, stage, settings, pipe.total_steps)
                )
            component = stage.offpolicy_component
            if component is not None:
                self.metrics.add_update(
                    *self.learner.update_off_policy(component, settings, pipe.total_steps)
                )
            # 4. Count the rollout, step the schedules, then callbacks, log, stage end, save.
            steps_before = pipe.total_steps
            pipe.add_steps(env_steps)
            self.learner.step_schedules(pipe.total_steps)
            period = settings.advance_scene_rollout_period
            if period and pipe.rollout_count % period == 0:
                self.collector.new_episodes()  # HARNESS: AllenAct's forced scene advance
            info = RolloutInfo(
                stage_index=stage_index,
                num_steps=rollout.num_steps,
                env_steps=env_steps,
                total_steps=pipe.total_steps,
                settings=settings,
                teacher_forced=rollout.teacher_forced,
                offpolicy_updates=0 if component is None else component.updates,
                rollout=rollout,
            )
            for cb in self.callbacks:
                cb.on_rollout_end(self, info)
            self._after_rollout(steps_before, stage_index)
        return self._finish()

    def _rollout_request(self) -> RolloutRequest:
        """The current stage's next rollout, cut so that the stage ends at its budget."""
        pipe = self.pipeline
        return self._request_at(pipe.current_stage_index, pipe.stage_steps)

    def _request_ahead(self, updates: int) -> RolloutRequest | None:
        """The request of the update ``updates`` after the current one (0: the current one).

        None past the last budget or once a stop was requested. A stage ended early by its
        criterion is not foreseen: the collector drops what it collected past it.
        """
        pipe = self.pipeline
        if updates and (self.stop.stopping or pipe.finished):
            return None
        request = self._rollout_request()
        for _ in range(updates):
            index = request.stage
            stage_steps = request.stage_steps + request.num_steps * request.steps_per_step
            if stage_steps >= pipe.stages[index].max_stage_steps:
                index, stage_steps = index + 1, 0
            if index >= len(pipe.stages):
                return None
            request = self._request_at(index, stage_steps)
        return request

    def _request_at(self, stage_index: int, stage_steps: int) -> RolloutRequest:
        """Stage ``stage_index``'s rollout after ``stage_steps`` env steps, cut to its budget."""
        pipe = self.pipeline
        stage = pipe.stages[stage_index]
        steps_per_step = self.collector.num_envs * self.dist.world_size
        settings = pipe.settings_for(stage_index)
        remaining = stage.max_stage_steps - stage_steps
        return RolloutRequest(
            num_steps=min(settings.num_steps, math.ceil(remaining / steps_per_step)),
            teacher_forcing=stage.teacher_forcing,
            stage_steps=stage_steps,
            steps_per_step=steps_per_step,
            stage=stage_index,
            gamma=settings.gamma,
        )

    def _after_rollout(self, steps_before: int, stage_index: int) -> None:
        # HARNESS: log, advance the stage if it is done, then save once. Saving after the
        # advance means a resumed run never finishes a half-done stage switch; a stage-end
        # checkpoint is named after the stage that ended.
        pipe = self.pipeline
        settings, steps = pipe.current_settings, pipe.total_steps
        self.metrics.progress(steps, pipe.current_stage_index)
        interval = settings.metric_accumulate_interval or 0
        if interval and steps // interval > steps_before // interval:
            self._log()
        save_interval = settings.save_interval or 0
        due = bool(save_interval) and steps // save_interval > steps_before // save_interval
        if self._stage_done():
            self._log()
            pipe.advance()
            if not pipe.finished:
                self.logger.log(steps, {"pipeline/stage": float(pipe.current_stage_index)})
            self.save(stage=stage_index)
            for cb in self.callbacks:
                cb.on_stage_end(self, stage_index)
        elif due:
            self.save(stage=stage_index)

    def _stage_done(self) -> bool:
        """Whether the stage ends now: its budget is spent or its criterion fires.

        Distributed, rank 0's decision holds for every rank (only rank 0 sees ``eval/*``).
        """
        done = self.pipeline.should_advance(self.metrics.since_last_check())
        if self.dist.enabled:
            done = bool(broadcast_object(done))
        return done

    def _finish(self) -> dict[str, float]:
        """A checkpoint at a stop; else the last log, the final checkpoint and ``on_train_end``."""
        reason = self.stop.settle()
        if reason is not None:
            # HARNESS: preempted; no log: the trackers stay in the checkpoint (no double count).
            path = self.save()
            log.warning(
                "stopped (%s) at env step %d; checkpoint %s",
                reason,
                self.pipeline.total_steps,
                path,
            )
            return dict(self.metrics.last)
        self._log()
        final = self.save()
        for cb in self.callbacks:
            cb.on_train_end(self, final)
        return dict(self.metrics.last)

    def _log(self) -> None:
        pipe = self.pipeline
        stage_index = min(pipe.current_stage_index, len(pipe.stages) - 1)
        self.metrics.log(
            pipe.total_steps,
            {
                "charts/learning_rate": self.learner.learning_rate,
                "pipeline/stage": float(stage_index),
                "pipeline/stage_steps": float(pipe.stage_steps),
            },
        )

    # ---------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The trainer's checkpoint (see :mod:`rl.training.state`; a collective under DDP)."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint written by :meth:`state_dict` (call before :meth:`train`)."""
        self.state.load_state_dict(state)
        self._last_saved_step = self.pipeline.total_steps

    def save(self, stage: int | None = None) -> Path:
        """Write a checkpoint at the current env step (once per step); return its path.

        Args:
            stage: Stage index in the file name (default: the current stage).
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
            self.retention.saved(path, self.metrics.last)
        if self.dist.enabled:
            path = Path(broadcast_object(None if path is None else str(path)))
        assert path is not None
        self._last_saved_step = steps
        self.last_checkpoint = path
        if self.dist.is_main:
            for cb in self.callbacks:
                cb.on_checkpoint(self, path)
        return path
