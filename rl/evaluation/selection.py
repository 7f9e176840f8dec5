"""Which checkpoints an evaluation runs on: a file, a run's ``latest``, a glob or a whole run.

:func:`find_checkpoints` chooses them up front, each with its stage and env step
(:class:`CheckpointRef`), grouped by run in step order; :func:`thin_by_steps` keeps them at
least some env steps apart (always the last). Used by ``evaluate.py``
(:mod:`rl.evaluation.runs`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl.checkpoints.files import (
    BEST,
    CHECKPOINT_DIR,
    LATEST,
    CheckpointError,
    checked_file_path,
    checkpoint_file,
    list_checkpoints,
    load_checkpoint,
    parse_checkpoint_name,
)
from rl.utils.config import ConfigError

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")
_GLOB_CHARS = frozenset("*?[")


def is_glob(value: Any) -> bool:
    """Whether ``value`` (a ``ckpt=`` value) is a glob of files rather than one file.

    A path that exists is taken literally, glob characters and all (``run[1]/ckpt.pt``): it
    never matches other files.
    """
    if not value or not _GLOB_CHARS & set(str(value)):
        return False
    return not os.path.lexists(os.path.expanduser(str(value)))


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file and its position in training.

    Attributes:
        path: The file.
        stage: Pipeline stage index it was saved in.
        step: Global env steps when it was saved.
    """

    path: Path
    stage: int
    step: int

    @property
    def run_dir(self) -> Path:
        """The run folder: the parent of ``checkpoints/``, else the file's folder."""
        parent = self.path.parent
        return parent.parent if parent.name == CHECKPOINT_DIR else parent


def checkpoint_ref(path: str | Path) -> CheckpointRef:
    """Stage and env step of a checkpoint: from its name, else from its contents.

    Args:
        path: The checkpoint file.

    Raises:
        CheckpointError: If the file cannot be read (the message names it).
    """
    path = Path(path)
    parsed = parse_checkpoint_name(path)
    if parsed is not None:
        return CheckpointRef(path, parsed[0], parsed[1])
    pipe = load_checkpoint(path).get("pipeline") or {}
    if not isinstance(pipe, dict):
        raise CheckpointError(f"{path}: its pipeline position is not a mapping")
    return CheckpointRef(
        path, int(pipe.get("current_stage_index", 0)), int(pipe.get("total_steps", 0))
    )


def find_checkpoints(
    *, ckpt: str | None = None, run_dir: str | None = None
) -> list[CheckpointRef]:
    """The checkpoints named by ``ckpt`` (a file or a glob) or ``run_dir`` (all of a run).

    Args:
        ckpt: A checkpoint file, a run's ``checkpoints/latest`` pointer (its newest
            checkpoint) or ``checkpoints/best`` (its best by ``pipeline.best_metric``), or a
            glob of files (``**`` allowed), e.g. ``outputs/x/*/checkpoints/ckpt_*.pt``.
        run_dir: A run folder: every checkpoint in its ``checkpoints/``.

    Returns:
        The checkpoints grouped by run folder, each run in step order (stage breaks ties);
        their paths lie below the resolved run folders, whose ``checkpoints`` were checked
        (:func:`~rl.checkpoints.files.checked_file_path`).

    Raises:
        ConfigError: If neither or both are given.
        CheckpointError: If nothing matches, or a file needed for ordering is unreadable.
        UnsafePathError: A run's ``checkpoints`` is a link (another run's files: never
            evaluated in its place) or not a folder.
    """
    if bool(ckpt) == bool(run_dir):
        raise ConfigError(
            "evaluate: set exactly one of ckpt=FILE_OR_GLOB (checkpoint files) or "
            f"run_dir=RUN_FOLDER (every checkpoint of a run); got ckpt={ckpt!r}, "
            f"run_dir={run_dir!r}"
        )
    if run_dir:
        paths = list_checkpoints(run_dir)
        if not paths:
            raise CheckpointError(f"no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}")
    elif is_glob(ckpt):
        paths = [
            checked_file_path(p)
            for p in glob.glob(str(ckpt), recursive=True)
            if Path(p).is_file() and Path(p).suffix in CHECKPOINT_SUFFIXES
        ]
        if not paths:
            raise CheckpointError(
                f"no checkpoint file ({'/'.join(CHECKPOINT_SUFFIXES)}) matches ckpt={ckpt!r}"
            )
    else:
        path = Path(str(ckpt)).expanduser()
        in_run = path.parent.name == CHECKPOINT_DIR
        pointer = path.name in (LATEST, BEST) and in_run  # (any kind: ignored)
        if path.is_dir() and not pointer:
            raise ConfigError(
                f"ckpt={ckpt!r} is a folder; for every checkpoint of a run use run_dir="
            )
        path = checkpoint_file(path)  # (the run's latest / best pointer: what it names)
        if not path.is_file():  # (a FIFO is never opened: it could block)
            problem = "is not a regular file" if os.path.lexists(path) else "does not exist"
            raise CheckpointError(f"checkpoint {path} {problem}")
        paths = [path]
    refs = [checkpoint_ref(p) for p in paths]
    return sorted(refs, key=lambda r: (str(r.run_dir), r.step, r.stage, r.path.name))


def thin_by_steps(refs: Sequence[CheckpointRef], every_steps: int) -> list[CheckpointRef]:
    """Keep checkpoints at least ``every_steps`` env steps apart, always keeping the last.

    Works per run folder on step-ordered ``refs`` (as :func:`find_checkpoints` returns them):
    the first checkpoint is kept, then each one at least ``every_steps`` after the last kept,
    and the run's last checkpoint is always kept.

    Args:
        refs: Checkpoints in run, then step order.
        every_steps: Minimum env-step distance (0 keeps everything).

    Returns:
        The kept checkpoints, in the same order.
    """
    if every_steps < 0:
        raise ConfigError(f"every_steps: must be >= 0, got {every_steps}")
    if every_steps == 0:
        return list(refs)
    kept: list[CheckpointRef] = []
    for i, ref in enumerate(refs):
        last_of_run = i + 1 == len(refs) or refs[i + 1].run_dir != ref.run_dir
        first_of_run = not kept or kept[-1].run_dir != ref.run_dir
        if first_of_run or last_of_run or ref.step - kept[-1].step >= every_steps:
            kept.append(ref)
    return kept


__all__ = [
    "CHECKPOINT_SUFFIXES",
    "CheckpointRef",
    "checkpoint_ref",
    "find_checkpoints",
    "is_glob",
    "thin_by_steps",
]
