"""Weights & Biases sink: online, offline or disabled; env steps as the x-axis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.loggers.base import MetricsSink, RunContext


def flatten_dict(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_dict(v, key + "."))
        else:
            out[key] = v
    return out


class WandbSink(MetricsSink):
    """Log to wandb; every chart's x-axis is ``global_step`` (env steps over all workers).

    Args:
        context: The run (filled in by the engine).
        project: wandb project.
        entity: wandb entity (None: the default of the logged-in user).
        mode: ``online``, ``offline`` (sync later with ``wandb sync``) or ``disabled``.
        group: Run group (default: the experiment name).
        tags: Run tags.
        name: Run name (default: ``{task_id}__{exp_name}__{seed}__{unix_time}``).
        id: Run id, to resume a run.
        job_type: wandb job type.
    """

    def __init__(
        self,
        *,
        context: RunContext,
        project: str = "rl",
        entity: str | None = None,
        mode: str = "online",
        group: str | None = None,
        tags: Sequence[str] | None = None,
        name: str | None = None,
        id: str | None = None,  # noqa: A002  (wandb's own name)
        job_type: str = "train",
    ) -> None:
        import wandb

        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode must be online/offline/disabled, got {mode!r}")
        config = flatten_dict(context.config)
        config.update(task_id=context.task_id, exp_name=context.exp_name, seed=context.seed)
        self.run = wandb.init(
            project=project,
            entity=entity,
            mode=mode,
            group=group or context.exp_name,
            tags=list(tags or []),
            name=name or context.run_name,
            id=id,
            resume="allow" if id else None,
            job_type=job_type,
            dir=str(context.output_dir),
            config=config,
            reinit="finish_previous",
        )
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log ``metrics`` with ``global_step=step``."""
        self.run.log({"global_step": step, **metrics})

    def log_video(self, step: int, path: Path) -> None:
        """Log a video file (e.g. a probe episode) as ``videos/probe`` at ``global_step=step``."""
        import wandb

        fmt = Path(path).suffix.lstrip(".") or "mp4"
        self.run.log({"global_step": step, "videos/probe": wandb.Video(str(path), format=fmt)})

    def close(self) -> None:
        """Finish the run (always, so multirun jobs never share one)."""
        self.run.finish()
