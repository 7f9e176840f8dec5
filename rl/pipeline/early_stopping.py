"""Criteria that end a pipeline stage before its step budget (AllenAct's semantics)."""

from __future__ import annotations

import abc
from collections.abc import Mapping


class EarlyStoppingCriterion(abc.ABC):
    """Decide, after each rollout's update, whether the current stage should end now."""

    @abc.abstractmethod
    def __call__(
        self, *, stage_steps: int, total_steps: int, training_metrics: Mapping[str, float]
    ) -> bool:
        """Return True to end the stage.

        ``training_metrics`` holds the mean of each metric logged since the previous check
        (``charts/success``, ``eval/success``, ...): every logged value is judged once.
        """


class NeverEarlyStoppingCriterion(EarlyStoppingCriterion):
    """Never stop early: the stage runs its full budget."""

    def __call__(
        self, *, stage_steps: int, total_steps: int, training_metrics: Mapping[str, float]
    ) -> bool:
        """Always False."""
        return False


class MetricThresholdCriterion(EarlyStoppingCriterion):
    """Stop once a tracked training metric reaches a threshold.

    Args:
        metric: Metric key, e.g. ``charts/success``.
        threshold: Value to reach.
        mode: ``max`` stops when ``metric >= threshold``, ``min`` when ``metric <= threshold``.
        min_stage_steps: Never stop before this many env steps in the stage.
    """

    def __init__(
        self, *, metric: str, threshold: float, mode: str = "max", min_stage_steps: int = 0
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.metric = metric
        self.threshold = float(threshold)
        self.mode = mode
        self.min_stage_steps = int(min_stage_steps)

    def __call__(
        self, *, stage_steps: int, total_steps: int, training_metrics: Mapping[str, float]
    ) -> bool:
        """True once the metric has crossed the threshold."""
        if stage_steps < self.min_stage_steps or self.metric not in training_metrics:
            return False
        value = training_metrics[self.metric]
        return value >= self.threshold if self.mode == "max" else value <= self.threshold
