"""Checkpoint files (sortable names, atomic writes, safe loading) and how runs start or resume.

What goes *into* a checkpoint is the trainer's business (:mod:`rl.training.state`).
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
