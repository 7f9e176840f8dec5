"""What ``train.py`` and ``evaluate.py`` share: errors a user can act on, and Hydra's record.

Hydra creates a command's folder before the command's own code runs, so a refused config would
leave an empty run folder behind and its message under a traceback; this module removes both.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from rl.checkpoints.files import CheckpointError
from rl.checkpoints.lock import LOCK_NAME, RunFolderLockedError, RunLock
from rl.engine.sweeps import in_multirun
from rl.utils.config import ConfigError
from rl.utils.files import is_run_folder_write_error, write_atomic


def hydra_record(cfg: DictConfig | dict[str, Any]) -> dict[str, str] | None:
    """The files Hydra's ``run_job`` would write to ``<run>/.hydra/`` for this invocation.

    conf/hydra/default.yaml turns Hydra's own writing off (``hydra.output_subdir: null``): Hydra
    writes before the run takes its folder's lock, so a second run given the same
    ``hydra.run.dir`` would rewrite a live run's record. The trainer writes these once it holds
    the lock (:func:`write_hydra_record`). None when not composed by Hydra, or when Hydra writes
    them itself (``hydra.output_subdir`` set).
    """
    from hydra.core.hydra_config import HydraConfig

    if not isinstance(cfg, DictConfig) or not HydraConfig.initialized():
        return None
    hydra = cast(DictConfig, HydraConfig.instance().cfg)  # (annotated HydraConf)
    if OmegaConf.select(hydra, "hydra.output_subdir", default=None) is not None:
        return None
    task = cfg
    if "hydra" in cfg:  # composed with return_hydra_config (the API, tests)
        task = cfg.copy()
        with open_dict(task):
            task.pop("hydra")
    return {
        "config.yaml": OmegaConf.to_yaml(task),
        "hydra.yaml": OmegaConf.to_yaml(hydra),
        "overrides.yaml": OmegaConf.to_yaml(hydra.hydra.overrides.task),
    }


def write_hydra_record(output_dir: Path, record: dict[str, str] | None) -> None:
    """Write Hydra's record of this invocation into a new run's folder (its lock held)."""
    for name, text in (record or {}).items():
        write_atomic(output_dir / ".hydra" / name, text)


# What a command's folder holds before its run writes anything (the lock released by then).
_BOOKKEEPING_FILES = frozenset({".hydra", "train.log", "evaluate.log", LOCK_NAME})


def _only_bookkeeping(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) holding only Hydra's files and a lock."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(p.name in _BOOKKEEPING_FILES for p in folder.iterdir())


def discard_hydra_folder() -> bool:
    """Remove this command's Hydra folder if it holds only Hydra's own files; whether it did.

    The run lock is held while removing: a folder another process holds (a run sharing
    ``hydra.run.dir``, still building its task) is never removed. An emptied parent
    (``outputs/<exp_name>``) goes too.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    folder = Path(HydraConfig.get().runtime.output_dir)
    if not _only_bookkeeping(folder):
        return False
    lock = RunLock(folder, purpose="removing the folder of a refused run")
    try:
        lock.acquire()
    except (RunFolderLockedError, OSError):
        return False  # another process works there: not ours to remove
    try:
        if not _only_bookkeeping(folder):  # judged again under the lock
            return False
        root = logging.getLogger()
        for handler in list(root.handlers):
            if (
                isinstance(handler, logging.FileHandler)
                and Path(handler.baseFilename).parent == folder
            ):
                root.removeHandler(handler)
                handler.close()
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        lock.release()
    with contextlib.suppress(OSError):  # not empty, or not ours to remove
        folder.parent.rmdir()
    return True


@contextlib.contextmanager
def config_errors_reported() -> Iterator[None]:
    """A refused config or checkpoint, a full disk or a file denied to a single run: exit 1.

    A :class:`~rl.utils.config.ConfigError` or :class:`~rl.checkpoints.files.CheckpointError`
    also removes the run's folder if it holds only Hydra's files; a full disk or a link where
    the run writes keeps it (``train.log`` holds the traceback). In a multirun the error
    propagates: Hydra records the job as failed and the sweep goes on.
    """
    try:
        yield
    except (ConfigError, CheckpointError) as e:
        if in_multirun():
            raise
        discard_hydra_folder()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if in_multirun() or not is_run_folder_write_error(e):
            raise
        message = e.strerror or str(e)
        if e.filename is not None and str(e.filename) not in message:  # (which file)
            message += f": {e.filename}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
