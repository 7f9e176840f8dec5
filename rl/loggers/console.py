"""Console output: a tqdm progress bar (env steps, FPS, stage, ETA) and summary lines."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from tqdm.auto import tqdm

from rl.loggers.base import MetricsSink, RunContext
from rl.utils.files import NoFollowFileHandler, check_file_target

# Summary lines into <run>/train.log only (not propagated: the console gets them from the sink).
_FILE_LOG = logging.getLogger("rl.summary")
_FILE_LOG.propagate = False
_FILE_LOG.setLevel(logging.INFO)
_FILE_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's file format

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
    """Progress bar plus a one-line summary every ``summary_every`` log points (0: never).

    Every line also goes to ``<run>/train.log``, timestamped, so a detached run's folder holds
    its progress. Without the bar (``progress_bar`` None: when the console is not a terminal,
    as under SLURM or ``| tee``) the line ends with the elapsed time and an ETA itself.

    Args:
        context: The run (filled in by the engine).
        progress_bar: Show the tqdm bar: None when the console is a terminal, True, False.
        summary_every: Print a summary line every this many log points.
    """

    def __init__(
        self, *, context: RunContext, progress_bar: bool | None = None, summary_every: int = 1
    ) -> None:
        self.summary_every = summary_every
        self._count = 0
        self._total = context.total_steps
        self._started = time.monotonic()
        self._first: tuple[int, float] | None = None  # (step, time) of the first progress
        log_file = context.output_dir / "train.log"
        check_file_target(log_file)
        self._file = NoFollowFileHandler(log_file, encoding="utf-8", delay=True)
        self._file.setFormatter(logging.Formatter(_FILE_FORMAT))
        _FILE_LOG.addHandler(self._file)
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
        """Advance the bar to ``step`` and show ``status`` beside it."""
        if self._first is None:  # (a resumed run starts past 0)
            self._first = (step, time.monotonic())
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
        if teacher:  # teacher forcing: the success that follows is partly the expert's
            parts.append(f"teacher-forced {teacher:.0%}")
        for key, label, fmt in _SUMMARY_KEYS:
            value = metrics.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                parts.append(f"{label} {fmt.format(value)}")
        line = " | ".join(parts)
        _FILE_LOG.info(line)
        if self._bar.disable:  # (the bar shows both itself)
            line += " | " + self._times(step)
        self._bar.write(line, file=sys.stderr)

    def _times(self, step: int) -> str:
        """``elapsed H:MM:SS | eta H:MM:SS``: the budget left at the rate since the first step."""
        now = time.monotonic()
        elapsed = f"elapsed {_clock(now - self._started)}"
        if self._first is None or step <= self._first[0] or now <= self._first[1]:
            return f"{elapsed} | eta ?"
        rate = (step - self._first[0]) / (now - self._first[1])
        return f"{elapsed} | eta {_clock(max(0, self._total - step) / rate)}"

    def close(self) -> None:
        """Close the bar and the log file."""
        self._bar.close()
        _FILE_LOG.removeHandler(self._file)
        self._file.close()


def _clock(seconds: float) -> str:
    """``H:MM:SS``."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
