"""Evaluation of the policy while it trains (every ``eval.interval`` env steps) and after."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from rl.collection.episodes import EvalResult, episode_seed_list
from rl.evaluation.report import format_table, write_eval_json
from rl.evaluation.settings import EvalSettings
from rl.training.callbacks import Callback, RolloutInfo
from rl.training.trainer import OnPolicyTrainer

log = logging.getLogger(__name__)


class TrainingEvaluation(Callback):
    """Trainer callback: ``eval/*`` every ``settings.interval`` env steps and at the end.

    The episodes run with their own action generator (training's random streams are untouched);
    the values reach early-stopping criteria and, at the end, ``<final checkpoint>.eval.json``.
    """

    def __init__(self, settings: EvalSettings) -> None:
        self.settings = settings
        self.episode_seeds = episode_seed_list(settings.num_episodes, settings.episode_seed)
        self._last: tuple[int, EvalResult | None] = (-1, None)

    def evaluate(self, trainer: OnPolicyTrainer) -> EvalResult:
        """Run the episode list through the collector; log ``eval/*`` at the current step.

        ``eval/seconds`` is its wall time (benchmarks of time to a success rate take it off).
        """
        s = self.settings
        t0 = time.perf_counter()
        result = trainer.collector.evaluate(
            episode_seeds=self.episode_seeds,
            num_envs=s.num_envs,
            deterministic=s.deterministic,
            action_seed=s.action_seed,
            split=s.split,
        )
        self._last = (trainer.pipeline.total_steps, result)
        logged = {**result.as_logged("eval"), "eval/seconds": time.perf_counter() - t0}
        trainer.metrics.publish(trainer.pipeline.total_steps, logged)
        return result

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        """Evaluate when this rollout crossed a multiple of ``interval``."""
        if (
            self.settings.interval > 0
            and self.episode_seeds
            and info.crossed(self.settings.interval)
        ):
            self.evaluate(trainer)

    def on_train_end(self, trainer: OnPolicyTrainer, checkpoint: Path) -> None:
        """Evaluate the final policy; write ``<checkpoint>.eval.json`` and print a table."""
        if not self.episode_seeds:
            return
        step, result = self._last
        if result is None or step != trainer.pipeline.total_steps:  # not evaluated here yet
            result = self.evaluate(trainer)
        write_eval_json(
            checkpoint.with_suffix(".eval.json"), result, dataclasses.asdict(self.settings)
        )
        logged = result.as_logged("eval")
        log.info("\n%s", format_table(logged, f"final evaluation ({checkpoint.name})"))
