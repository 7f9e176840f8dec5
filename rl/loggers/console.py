"""Console output: a tqdm progress bar (env steps, FPS, stage, ETA) and periodic summaries."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from tqdm.auto import tqdm

from rl.loggers.base import MetricsSink, RunContext

# Shown in the summary line, in this order, when present.
_SUMMARY_KEYS = (
    ("charts/success", "success", "{:.3f}"),
    ("charts/spl", "spl", "{:.3f}"),
    ("charts/episodic_return", "return", "{:.2f}"),
    ("charts/episodic_length", "len", "{:.1f}"),
    ("charts/game_return", "game", "{:.1f}"),  # an Atari game's score (task=atari)
    ("charts/SPS", "fps", "{:.0f}"),
    ("charts/learning_rate", "lr", "{:.2e}"),
    ("eval/success", "eval success", "{:.3f}"),
    ("eval/spl", "eval spl", "{:.3f}"),
    ("eval/episodic_return", "eval return", "{:.2f}"),
    ("eval/game_return", "eval game", "{:.1f}"),
)


class ConsoleSink(MetricsSink):
    """Progress bar plus a one-line summary every ``summary_every`` log points.

    During teacher forcing the line says which fraction of the steps the expert took
    (``teacher-forced 85%``): the success beside it is then largely the expert's.

    Args:
        context: The run (filled in by the engine).
        progress_bar: Show the tqdm bar: None (the default) when the console is a terminal
            (a redirected log gets the summary lines, not the bar's updates), True always,
            False never.
        summary_every: Print a summary line every this many log points (0: never).
    """

    def __init__(
        self, *, context: RunContext, progress_bar: bool | None = None, summary_every: int = 1
    ) -> None:
        self.summary_every = summary_every
        self._count = 0
        self._bar = tqdm(
            total=context.total_steps,
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            disable=None if progress_bar is None else not progress_bar,  # None: not on a TTY
            desc=context.exp_name,
            file=sys.stderr,
            smoothing=0.1,
        )

    def progress(self, step: int, status: Mapping[str, Any]) -> None:
        """Advance the bar to ``step`` and show ``status`` (e.g. stage, fps) beside it."""
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix(status, refresh=False)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Print a summary line every ``summary_every`` calls."""
        self._count += 1
        if not self.summary_every or self._count % self.summary_every:
            return
        parts = [f"step {step:,}"]
        if "pipeline/stage" in metrics:
            parts.append(f"stage {int(metrics['pipeline/stage'])}")
        teacher = metrics.get("pipeline/teacher_ratio")
        if teacher:  # teacher forcing: the metrics that follow are partly the expert's
            parts.append(f"teacher-forced {teacher:.0%}")
        for key, label, fmt in _SUMMARY_KEYS:
            value = metrics.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                parts.append(f"{label} {fmt.format(value)}")
        self._bar.write(" | ".join(parts), file=sys.stderr)

    def close(self) -> None:
        """Close the bar."""
        self._bar.close()
