"""What watches a training run besides the logger: validation and probe videos.

:class:`RunMonitors` bundles the optional ``valid`` setting (each checkpoint validated in a
separate process, :mod:`rl.engine.validation`) and ``video_interval`` (probe videos,
:mod:`rl.engine.video`) behind the trainer's two extension points: ``callbacks`` and the
``on_checkpoint`` hook. ``run.train`` builds it next to the other callbacks, calls
:meth:`RunMonitors.finish` at the end of training (before the loggers close) and
:meth:`RunMonitors.close` in its ``finally``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl.engine.validation import VALID_DEFAULTS, BackgroundValidation
from rl.engine.video import ProbeVideo, build_probe_video
from rl.loggers.base import MetricsLogger


class RunMonitors:
    """Validation during training and probe videos of one run, built from its config.

    Nothing starts at construction: the validation process starts with the first checkpoint.

    Args:
        cfg: The resolved training config (``valid``, ``video_interval``, ``task``, ``model``,
            ``sampler``, ``seed``).
        logger: The run's logger (``valid/*`` metrics, videos).
        output_dir: The run folder.
        device: Torch device of the run.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        *,
        logger: MetricsLogger,
        output_dir: Path,
        device: torch.device | str = "cpu",
    ) -> None:
        self.logger = logger
        self.device = device
        valid = {**VALID_DEFAULTS, **(cfg.get("valid") or {})}
        self._valid_settings = valid if valid.pop("enabled") else None
        self._task, self._model = dict(cfg["task"]), dict(cfg["model"])
        self.validation: BackgroundValidation | None = None
        self.video: ProbeVideo | None = build_probe_video(
            cfg, output_dir=output_dir, device=device
        )

    @property
    def callbacks(self) -> list[Any]:
        """Trainer callbacks (``on_rollout_end``) of the enabled monitors."""
        return [self, *([self.video] if self.video is not None else [])]

    def on_checkpoint(self, path: Path) -> None:
        """The trainer's ``on_checkpoint`` hook: queue the checkpoint for validation."""
        if self._valid_settings is None:
            return
        if self.validation is None:
            self.validation = BackgroundValidation(
                task=self._task,
                model=self._model,
                logger=self.logger,
                device=self.device,
                **self._valid_settings,
            )
        self.validation.on_checkpoint(path)

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        """Log validations that finished since the last rollout."""
        if self.validation is not None:
            self.validation.poll()

    def finish(self) -> dict[str, float]:
        """Wait for pending validations and log them; return the newest ``valid/*`` metrics."""
        if self.validation is None:
            return {}
        self.validation.finish()
        return dict(self.validation.last_metrics)

    def close(self) -> None:
        """Stop the validation process (if still running) and the video environment."""
        try:
            if self.validation is not None:
                self.validation.close()
        finally:
            if self.video is not None:
                self.video.close()
