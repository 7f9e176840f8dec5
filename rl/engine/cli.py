"""What ``train.py`` and ``evaluate.py`` share around their work: errors a user can act on.

Hydra creates a command's folder (its ``.hydra/`` files and the log file) before the command's
own code runs, so a config (or checkpoint) that is then refused would leave an empty run folder
behind, and Hydra would print the error under a traceback. :func:`config_errors_reported` turns
a refused config of a single run into its message alone on stderr and exit status 1, and removes
the folder when it holds nothing but Hydra's files. :func:`discard_hydra_folder` does the same
cleaning for a command whose results live elsewhere (``evaluate.py`` writes next to the
checkpoints). Hydra's own record of a run (``.hydra/``) is written by the trainer once it holds
the run folder's lock (:func:`hydra_record`, :func:`write_hydra_record`), not by Hydra before.
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

# Hydra's record of an invocation, in <run>/.hydra/ (what hydra.core.utils.run_job writes).
HYDRA_RECORD_DIR = ".hydra"


def hydra_record(cfg: DictConfig | dict[str, Any]) -> dict[str, str] | None:
    """The files Hydra would write to ``<run>/.hydra/`` for this invocation, by name.

    ``config.yaml`` (the composed config, unresolved), ``hydra.yaml`` (Hydra's node) and
    ``overrides.yaml`` (the overrides typed), with the content Hydra's ``run_job`` writes.
    conf/hydra/default.yaml turns Hydra's own writing off (``hydra.output_subdir: null``):
    Hydra writes them before the run takes its folder's lock, so a second run given the same
    ``hydra.run.dir`` would rewrite a live run's record. The trainer writes them itself once it
    holds the lock (:func:`write_hydra_record`).

    None where there is nothing to write: not composed by Hydra (a plain dict, no Hydra
    config), or Hydra writes them itself (a tree whose ``hydra.output_subdir`` is set).
    """
    from hydra.core.hydra_config import HydraConfig

    if not isinstance(cfg, DictConfig) or not HydraConfig.initialized():
        return None
    # (set: the composed config's root, a DictConfig; Hydra annotates it as its HydraConf)
    hydra = cast(DictConfig, HydraConfig.instance().cfg)
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
        write_atomic(output_dir / HYDRA_RECORD_DIR / name, text)


# What a command's folder holds before its run writes anything: Hydra's own files and the run
# lock's file (released by the time the folder is judged).
_BOOKKEEPING_FILES = frozenset({".hydra", "train.log", "evaluate.log", LOCK_NAME})


def _only_bookkeeping(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) holding only Hydra's files and a lock."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(p.name in _BOOKKEEPING_FILES for p in folder.iterdir())


def discard_hydra_folder() -> bool:
    """Remove this command's Hydra folder if it holds only Hydra's own files; whether it did.

    The folder's run lock is taken first and held while it is removed: a folder another process
    holds (a run sharing ``hydra.run.dir`` that is still building its task) is never removed,
    nor its live lock file, whatever it holds. Its parent (``outputs/<exp_name>``) goes too when
    that leaves it empty. Log handlers writing into the folder are closed first.
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
    """A refused config or checkpoint of a single run, or a full disk: its message, exit 1.

    For :class:`~rl.utils.config.ConfigError` and
    :class:`~rl.checkpoints.files.CheckpointError` (a missing, unreadable or untrusted
    checkpoint): the message goes to stderr without a traceback, and the folder Hydra created
    for the run is removed when nothing but Hydra's files is in it. A full disk or a link
    where the run writes (:mod:`rl.utils.files`) is its message alone too (``train.log`` holds
    the traceback). In a multirun the error
    propagates (Hydra records the job as failed and the sweep goes on).
    """
    try:
        yield
    except (ConfigError, CheckpointError) as e:
        if in_multirun():
            raise
        discard_hydra_folder()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # a full disk, or a link where the run writes: the message alone
        if in_multirun() or not is_run_folder_write_error(e):
            raise
        print(f"error: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)
