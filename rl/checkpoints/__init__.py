"""Checkpoints: the files (sortable names, atomic writes, safe loading) and resuming runs.

``files`` writes and finds checkpoint files; ``resume`` plans how a run starts (fresh,
``resume=`` or ``init_from=``); ``resume_config`` decides which settings a resume may change;
``retention`` marks the best checkpoint and keeps only the last N.
What goes *into* a checkpoint is the trainer's business (:mod:`rl.training.state`). A run's
``checkpoints`` that is a link or not a folder is an :class:`~rl.utils.files.UnsafePathError`.
"""

from rl.checkpoints.files import (
    CHECKPOINT_DIR,
    CheckpointError,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl.checkpoints.resume import StartPlan, plan_start, resolve_resume_path

__all__ = [
    "CHECKPOINT_DIR",
    "CheckpointError",
    "StartPlan",
    "best_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "plan_start",
    "resolve_resume_path",
    "save_checkpoint",
]
