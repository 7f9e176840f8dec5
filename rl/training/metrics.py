"""What the trainer logs: episode and training means, throughput, time split, progress.

Means accumulate between log points and are reduced over every rank at one; rank 0's view is
what every rank keeps as :attr:`TrainingMetrics.last`. Early-stopping criteria see every logged
value once (:meth:`TrainingMetrics.since_last_check`, AllenAct's tracker semantics).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

from rl.checkpoints.errors import CheckpointError
from rl.collection.base import Rollout
from rl.distributed.reduce import broadcast_object, gather_lists, reduce_tracker_states
from rl.distributed.setup import DistContext
from rl.loggers.base import MetricsLogger
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.convert import episode_metric_key
from rl.utils.finite import as_count, as_float

# Logged as `time/<name>_fraction` of each interval: `collect` is the learner's wait in
# `Collector.collect`; `env` and `inference` are the collectors' own (in another process they
# overlap the learner's).
TIMERS = ("collect", "env", "inference", "update")
RETURN = episode_metric_key("return")  # charts/episodic_return


def _numbers(value: object, entry: str) -> dict[str, float]:
    """A checkpoint's ``{name: number}`` (it is untrusted); another kind is a CheckpointError."""
    if isinstance(value, Mapping):
        out: dict[str, float] = {}
        for key, number in value.items():
            as_number = as_float(number)
            if not isinstance(key, str) or as_number is None:
                break
            out[key] = as_number
        else:
            return out
    raise CheckpointError(f"checkpoint entry {entry}: expected metric names mapped to numbers")


class TrainingMetrics:
    """Trackers, timers and the logging interval of one training run.

    Args:
        logger: Where metrics go.
        dist: This process's place among the ranks (None: one process).
    """

    def __init__(self, logger: MetricsLogger, dist: DistContext | None = None) -> None:
        self.logger = logger
        self.distributed = dist is not None and dist.enabled
        self.episodes = ScalarMeanTracker()
        self.train = ScalarMeanTracker()
        self.finished: list[dict[str, float]] = []  # this interval's episodes (logged names)
        self.timers = dict.fromkeys(TIMERS, 0.0)
        self.last: dict[str, float] = {}  # the latest value of every logged metric
        self.unchecked = ScalarMeanTracker()  # values logged since the criteria's last check
        self.last_log_step = -1
        self._interval_time, self._interval_steps = time.perf_counter(), 0

    def start_interval(self, steps: int) -> None:
        """Start measuring throughput at global env step ``steps``."""
        self._interval_time, self._interval_steps = time.perf_counter(), steps

    def add_rollout(self, rollout: Rollout, seconds: float) -> None:
        """Record a rollout's finished episodes, per-step statistics and timing.

        Args:
            rollout: The rollout.
            seconds: The learner's wall time to get it.
        """
        for episode in rollout.episodes:
            row = {episode_metric_key(k): float(v) for k, v in episode.metrics.items()}
            self.episodes.add_scalars(row)
            self.finished.append(row)
        self.train.merge(rollout.stats)
        self.timers["collect"] += seconds
        self.timers["env"] += rollout.env_seconds
        self.timers["inference"] += rollout.inference_seconds

    def add_update(self, tracker: ScalarMeanTracker, seconds: float) -> None:
        """Record an update's loss terms and diagnostics, and its duration."""
        self.train.merge(tracker.state_dict())
        self.timers["update"] += seconds

    def progress(self, steps: int, stage: int) -> None:
        """Per-rollout progress (the console's bar): stage and FPS since the last log point."""
        elapsed = time.perf_counter() - self._interval_time
        fps = (steps - self._interval_steps) / max(elapsed, 1e-9)
        self.logger.progress(steps, {"stage": stage, "fps": f"{fps:,.0f}"})

    def log(self, steps: int, extra: Mapping[str, float]) -> None:
        """Log the interval's means at global env step ``steps`` (once per step).

        Beside the means: the return's spread over every rank's episodes, ``charts/SPS``,
        ``extra`` (values of this moment: learning rate, stage position) and the time split.
        """
        if steps == self.last_log_step:
            return
        self.last_log_step = steps
        now = time.perf_counter()
        elapsed = max(now - self._interval_time, 1e-9)
        metrics: dict[str, float] = {**self._pop(self.episodes), **self._pop(self.train)}
        finished = gather_lists(self.finished)  # every rank's, in rank order
        self.finished = []
        returns = [e[RETURN] for e in finished if RETURN in e]
        if returns:
            metrics[f"{RETURN}_std"] = statistics.pstdev(returns)
            metrics[f"{RETURN}_min"] = min(returns)
            metrics[f"{RETURN}_max"] = max(returns)
        metrics["charts/SPS"] = (steps - self._interval_steps) / elapsed
        metrics.update(extra)
        for name, seconds in self.timers.items():
            metrics[f"time/{name}_fraction"] = seconds / elapsed
            self.timers[name] = 0.0
        if self.distributed:
            # Rank 0's view (its timers and SPS): the same `last` on every rank keeps
            # metric-based stage advances in step.
            metrics = broadcast_object(metrics)
        self.logger.log(steps, metrics)
        self.logger.log_episodes(steps, finished)
        self.observe(metrics)
        self._interval_time, self._interval_steps = now, steps

    def observe(self, values: Mapping[str, float]) -> None:
        """Take logged values (e.g. a callback's ``eval/*``) as the latest and for the criteria."""
        self.last.update(values)
        self.unchecked.add_scalars(values)

    def publish(self, steps: int, values: Mapping[str, float]) -> None:
        """Log ``values`` at env step ``steps`` and :meth:`observe` them."""
        self.logger.log(steps, values)
        self.observe(values)

    def since_last_check(self) -> dict[str, float]:
        """Mean of each value logged (or observed) since the previous call; {} if none."""
        return self.unchecked.pop_and_reset()

    def _pop(self, tracker: ScalarMeanTracker) -> dict[str, float]:
        """The tracker's means (over every rank when distributed), then reset it."""
        if not self.distributed:
            return tracker.pop_and_reset()
        state = reduce_tracker_states(tracker.state_dict())
        tracker.reset()
        sums, counts = state["sums"], state["counts"]
        return {k: sums[k] / counts[k] for k in sums if counts.get(k, 0) > 0}

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """``{"trackers": sums and counts not yet logged, "last_metrics", "last_log_step"}``."""
        return {
            "trackers": {
                "episode": self.episodes.state_dict(),
                "train": self.train.state_dict(),
                "criteria": self.unchecked.state_dict(),
            },
            "last_metrics": dict(self.last),
            "last_log_step": self.last_log_step,
            "finished": [dict(e) for e in self.finished],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        trackers = state.get("trackers")
        trackers = {} if trackers is None else trackers  # (not `or`: a tensor has no truth)
        if not isinstance(trackers, Mapping):
            raise CheckpointError("checkpoint entry trackers: expected a mapping")
        for name, tracker in (
            ("episode", self.episodes), ("train", self.train), ("criteria", self.unchecked)
        ):  # fmt: skip
            if name in trackers:  # (criteria: absent from checkpoints of before its tracker)
                saved = trackers[name]
                where = f"trackers.{name}"
                if not isinstance(saved, Mapping):
                    raise CheckpointError(f"checkpoint entry {where}: expected a mapping")
                tracker.load_state_dict(
                    {
                        "sums": _numbers(saved.get("sums"), f"{where}.sums"),
                        "counts": _numbers(saved.get("counts"), f"{where}.counts"),
                    }
                )
        self.last = _numbers(state.get("last_metrics", {}), "trainer.last_metrics")
        last_log_step = as_count(state.get("last_log_step", -1), low=-1)
        if last_log_step is None:
            raise CheckpointError("checkpoint entry trainer.last_log_step: expected an int >= -1")
        self.last_log_step = last_log_step
        finished = state.get("finished") or []
        if not isinstance(finished, list):
            raise CheckpointError("checkpoint entry finished_episodes: expected a list")
        self.finished = [_numbers(e, f"finished_episodes[{i}]") for i, e in enumerate(finished)]
