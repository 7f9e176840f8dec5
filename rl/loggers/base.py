"""The logger the engine talks to, fanning out to sinks built from ``conf/logger``."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.utils.config import ConfigError


@dataclasses.dataclass
class RunContext:
    """What every sink may need to know about the run.

    Attributes:
        output_dir: The run folder.
        config: The resolved config as a plain dict.
        total_steps: Env-step budget of the whole pipeline.
        run_name: ``{task_id}__{exp_name}__{seed}__{unix_time}``.
        resume_id: Id of the dashboard run a resumed run continues (None: a new run).
    """

    output_dir: Path
    config: dict[str, Any]
    exp_name: str
    task_id: str
    seed: int
    total_steps: int
    run_name: str
    resume_id: str | None = None

    def path(self, relative: str | Path, what: str) -> Path:
        """Where a sink writes ``relative``, a name from its config (``what``: its option).

        Raises:
            ConfigError: ``relative`` is empty, absolute, or leads out of the run folder: a
                config (one saved in a checkpoint that ``resume=`` reads, say) never makes a
                sink write outside it.
        """
        rel = Path(relative)
        if not str(relative).strip() or rel.is_absolute() or ".." in rel.parts:
            raise ConfigError(
                f"{what}: {str(relative)!r} is not a path inside the run folder (give a "
                "relative name, without '..')"
            )
        path = Path(self.output_dir) / rel
        if not path.resolve().is_relative_to(Path(self.output_dir).resolve()):
            raise ConfigError(
                f"{what}: {path} leads out of the run folder through a symbolic link (a copied "
                "run folder?); a run writes inside its folder only"
            )
        return path


class MetricsSink(abc.ABC):
    """One destination of metrics."""

    @abc.abstractmethod
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at global env step ``step``."""

    def progress(self, step: int, status: Mapping[str, Any]) -> None:  # noqa: B027
        """Cheap per-rollout progress update (most sinks ignore it)."""

    def log_episodes(self, step: int, episodes: Sequence[Mapping[str, float]]) -> None:  # noqa: B027
        """Record the finished training episodes (metrics by logged name) reported at ``step``."""

    def log_video(self, step: int, path: Path) -> None:  # noqa: B027
        """Record the video file ``path`` at env step ``step`` (only sinks that show videos)."""

    def log_checkpoint(self, step: int, path: Path) -> None:  # noqa: B027
        """Keep the checkpoint file ``path`` (env step ``step``), e.g. as an artifact."""

    @property
    def run_id(self) -> str | None:
        """Id of the dashboard run this sink writes to (None: it has none)."""
        return None

    def close(self) -> None:  # noqa: B027
        """Flush and release resources."""


class MetricsLogger:
    """Fans every call out to the sinks; closes them all even if one fails."""

    def __init__(self, sinks: Sequence[MetricsSink]) -> None:
        self.sinks = list(sinks)

    @property
    def run_id(self) -> str | None:
        """Id of the dashboard run (e.g. wandb's) among the sinks, None without one."""
        return next((s.run_id for s in self.sinks if s.run_id is not None), None)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """:meth:`MetricsSink.log` of every sink."""
        for sink in self.sinks:
            sink.log(step, metrics)

    def progress(self, step: int, status: Mapping[str, Any]) -> None:
        """:meth:`MetricsSink.progress` of every sink."""
        for sink in self.sinks:
            sink.progress(step, status)

    def log_episodes(self, step: int, episodes: Sequence[Mapping[str, float]]) -> None:
        """:meth:`MetricsSink.log_episodes` of every sink."""
        for sink in self.sinks:
            sink.log_episodes(step, episodes)

    def log_video(self, step: int, path: Path) -> None:
        """:meth:`MetricsSink.log_video` of every sink."""
        for sink in self.sinks:
            sink.log_video(step, path)

    def log_checkpoint(self, step: int, path: Path) -> None:
        """:meth:`MetricsSink.log_checkpoint` of every sink."""
        for sink in self.sinks:
            sink.log_checkpoint(step, path)

    def close(self) -> None:
        """Close every sink; re-raise the first error after trying all."""
        error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except BaseException as e:  # noqa: BLE001
                error = error or e
        if error is not None:
            raise error
