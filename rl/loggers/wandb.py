"""Weights & Biases sink: online, offline or disabled; env steps as the x-axis.

docs/howto/logging.md describes the run's name, group, config and charts. The config's top-level
``task_id``, ``exp_name``, ``seed``, ``git_sha`` and ``git_dirty`` are cleanrl's and
sample-factory's choices, so openrlbenchmark can filter on them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.loggers.base import MetricsSink, RunContext
from rl.utils.files import run_subdir
from rl.utils.provenance import git_state

log = logging.getLogger(__name__)


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


def sweep_of_current_job() -> tuple[str, int] | None:
    """``(sweep folder name, job number)`` inside a Hydra multirun job, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return None
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return None
        return Path(str(hydra_cfg.sweep.dir)).name, int(hydra_cfg.job.num)
    except Exception:  # noqa: BLE001  (grouping is cosmetic: never fail a run over it)
        return None


class WandbSink(MetricsSink):
    """Log to wandb; every chart's x-axis is ``global_step`` (env steps over all workers).

    Built on rank 0 only under DDP.

    Args:
        context: The run (filled in by the engine).
        entity: wandb entity (None: the logged-in user's default).
        mode: ``online``, ``offline`` (``wandb sync`` later) or ``disabled``.
        group: Run group (None: ``exp_name``, or ``<exp_name>__sweep_<time>`` for sweep jobs).
        tags: Run tags (sweep jobs also get ``sweep``).
        name: Run name (None: ``context.run_name``).
        id: Run id, to continue a run (None: ``context.resume_id``).
        log_checkpoint: Upload the final checkpoint (:meth:`log_checkpoint`).

    Raises:
        UnsafePathError: The run's ``wandb`` is a link or not a folder.
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
        log_checkpoint: bool = False,
    ) -> None:
        import wandb

        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode must be online/offline/disabled, got {mode!r}")
        self.log_checkpoints = log_checkpoint
        run_id = id if id is not None else context.resume_id
        if id is None and run_id is not None:
            log.info("resume: continuing wandb run %s", run_id)
        tags = list(tags or [])
        config = flatten_dict(context.config)
        config.update(task_id=context.task_id, exp_name=context.exp_name, seed=context.seed)
        config.update(git_state())
        sweep = sweep_of_current_job()
        if sweep is not None:
            config.update(sweep=sweep[0], sweep_job=sweep[1])
            if "sweep" not in tags:
                tags.append("sweep")
        if group is None and run_id is None:  # a resumed run keeps the group it has
            group = f"{context.exp_name}__sweep_{sweep[0]}" if sweep else context.exp_name
        # (a link at <run>/wandb/ is refused; a disabled run writes nothing there)
        run_subdir(context.output_dir, "wandb", create=mode != "disabled")
        self.run = wandb.init(
            project=project,
            entity=entity,
            mode=mode,  # type: ignore[arg-type]  # checked above
            group=group,
            tags=tags,
            name=name or context.run_name,
            id=run_id,
            resume="allow" if run_id else None,
            job_type=job_type,
            dir=str(context.output_dir),
            config=config,
            reinit="finish_previous",
            # Always <run>/wandb (checked above): wandb would otherwise write into a <run>/.wandb
            # wherever it exists, a link out of a copied run folder included.
            settings=wandb.Settings(use_dot_wandb=False),
        )
        # `*` covers every key logged later: scalars of all sections, videos and the summary.
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    @property
    def run_id(self) -> str | None:
        """The wandb run's id (stored in checkpoints, so a resume continues this run)."""
        return str(self.run.id) if self.run.id else None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log ``metrics`` with ``global_step=step``."""
        self.run.log({"global_step": step, **metrics})

    def log_video(self, step: int, path: Path) -> None:
        """Log a video file (e.g. a probe episode) as ``videos/probe`` at ``global_step=step``."""
        import wandb

        fmt = Path(path).suffix.lstrip(".") or "mp4"
        video = wandb.Video(str(path), format=fmt)  # type: ignore[arg-type]
        self.run.log({"global_step": step, "videos/probe": video})

    def log_checkpoint(self, step: int, path: Path) -> None:
        """Upload checkpoint ``path`` and its ``.eval.json`` as artifact ``model-<run id>``.

        Only with ``log_checkpoint``; aliases ``latest`` and ``step_<step>``.
        """
        if not self.log_checkpoints:
            return
        import wandb

        path = Path(path)
        artifact = wandb.Artifact(
            name=f"model-{self.run.id}",
            type="model",
            metadata={"env_step": step, "checkpoint": path.name},
        )
        artifact.add_file(str(path))
        if path.with_suffix(".eval.json").is_file():
            artifact.add_file(str(path.with_suffix(".eval.json")))
        self.run.log_artifact(artifact, aliases=["latest", f"step_{step}"])
        log.info("wandb: checkpoint %s logged as artifact model-%s", path.name, self.run.id)

    def close(self) -> None:
        """Finish the run (always, so multirun jobs never share one)."""
        self.run.finish()
