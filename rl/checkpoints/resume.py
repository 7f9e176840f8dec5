"""How a training run starts: fresh, resumed (``resume=``) or from weights (``init_from=``).

``resume=RUN_DIR`` (or a checkpoint file) continues a run in its own folder with its saved
config plus the safe changes typed now (:mod:`.resume_config`); ``init_from=CHECKPOINT`` takes
the weights only.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from rl.checkpoints.config_tree import config_sources, run_choices
from rl.checkpoints.files import (
    CHECKPOINT_DIR,
    CheckpointError,
    UntrustedCheckpointError,
    checked_file_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_stale_temp_files,
)
from rl.checkpoints.lock import RunLock
from rl.checkpoints.resume_config import (
    resume_config,
    typed_override_keys,
    typed_overrides,
    unresolved_config,
)
from rl.checkpoints.saved_config import rebuild_config
from rl.utils.config import ConfigError
from rl.utils.files import NoFollowFileHandler, check_file_target, run_subdir
from rl.utils.saved import checked_weights

if TYPE_CHECKING:  # (importing the models imports tensordict: loading a checkpoint need not)
    from rl.models.policy import Policy

log = logging.getLogger(__name__)


def resume_run_dir(path: str | Path) -> Path:
    """The run folder ``resume=PATH`` continues (a run folder, or ``<run>/checkpoints/<file>``).

    Raises:
        CheckpointError: ``PATH`` is neither.
        UnsafePathError: The run's ``checkpoints`` is a link.
    """
    path = Path(path).expanduser()
    if path.is_file():
        if path.parent.name != CHECKPOINT_DIR:
            raise CheckpointError(
                f"resume={path}: a checkpoint must lie in <run>/{CHECKPOINT_DIR}"
            )
        return checked_file_path(path).parent.parent
    if not path.is_dir():
        raise CheckpointError(f"resume={path}: no such run folder or checkpoint")
    return path.resolve()


def resolve_resume_path(path: str | Path) -> tuple[Path, Path, dict[str, Any]]:
    """``(run_dir, checkpoint, state)`` for ``resume=PATH`` (a run folder or a checkpoint file).

    For a run folder this is the newest checkpoint in step order that loads (unreadable ones
    are skipped with a warning; an untrusted one stops the search). Every file under a
    checkpoint name is complete (atomic writes), so this is also right when a crash fell
    between a checkpoint's rename and the update of ``latest``.
    """
    run_dir = resume_run_dir(path)
    path = Path(path).expanduser()
    if path.is_file():
        path = checked_file_path(path)
        return run_dir, path, load_checkpoint(path)
    candidates = list(reversed(list_checkpoints(run_dir)))
    if not candidates:
        latest_checkpoint(run_dir)  # raises the usual "no checkpoint in ..." error
    for candidate in candidates:
        try:
            state = load_checkpoint(candidate)
        except UntrustedCheckpointError:
            raise  # a crafted config stops the search: never silently resume an older one
        except CheckpointError as e:
            log.warning("skipping unreadable checkpoint: %s", e)
            continue
        return run_dir, candidate, state
    raise CheckpointError(f"resume={run_dir}: no readable checkpoint")


@dataclasses.dataclass
class StartPlan:
    """How a training run starts, worked out by :func:`plan_start`.

    Attributes:
        config: The resolved config to run (for a resume: the saved one plus safe changes).
        choices: The config group choices it was composed with, and ``sources`` where its
            configs came from (both saved in checkpoints; None: not composed by Hydra).
        checkpoint: The path of ``resume_state`` or of ``init_state`` (``init_from``).
        lock: The run folder's lock, held until :meth:`close` (None: a distributed worker,
            running under the lock of the process that planned the start).
    """

    config: dict[str, Any]
    choices: dict[str, str] | None
    resume_state: dict[str, Any] | None = None
    checkpoint: Path | None = None
    init_state: dict[str, Any] | None = None
    lock: RunLock | None = None
    sources: dict[str, Any] | None = None
    _log_handler: logging.Handler | None = None

    @property
    def wandb_run_id(self) -> str | None:
        """The wandb run id saved with the resumed run (None otherwise)."""
        return None if self.resume_state is None else self.resume_state.get("wandb_run_id")

    def init_model(self, model: Policy) -> None:
        """Load the ``init_from`` checkpoint's weights into ``model`` (no-op without one)."""
        if self.init_state is None:
            return
        try:
            model.load_state_dict(checked_weights(self.init_state["model"], model, "model"))
        except (RuntimeError, ValueError) as e:
            raise CheckpointError(
                f"init_from={self.checkpoint}: its weights do not fit this run's model: {e}"
            ) from e
        log.info(
            "init_from: weights of %s; optimizer, schedules and pipeline start fresh (stage 0)",
            self.checkpoint,
        )

    def close(self) -> None:
        """Detach the run folder's log file (resume only) and release the folder's lock."""
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
        if self.lock is not None:
            self.lock.release()


def plan_start(cfg: DictConfig | Mapping[str, Any], plain: dict[str, Any]) -> StartPlan:
    """Work out how the run starts from its composed config ``cfg`` (``plain``: resolved).

    The run folder is locked before anything in it is touched; the plan holds the lock.

    Raises:
        ConfigError: Both ``resume`` and ``init_from``, or unsafe changes on resume.
        CheckpointError: The checkpoint is missing or unreadable.
        RunFolderLockedError: Another process trains (or evaluates) in the run folder.
    """
    unresolved = unresolved_config(cfg, plain)
    choices, sources = run_choices(cfg), config_sources(cfg)
    if plain.get("resume") and plain.get("init_from"):
        raise ConfigError(
            "resume and init_from exclude each other: resume=RUN continues a run exactly; "
            "init_from=CHECKPOINT starts a new run from its weights"
        )
    trusted = list(plain.get("trusted_targets") or ())
    if plain.get("init_from"):
        path = Path(plain["init_from"]).expanduser()
        if path.is_dir():
            path = resolve_resume_path(path)[1]
        init_state = load_checkpoint(path)  # (its weights only: nothing built from its config)
        lock = RunLock(plain["output_dir"]).acquire()
        return StartPlan(
            plain, choices, checkpoint=path, init_state=init_state, lock=lock, sources=sources
        )
    if not plain.get("resume"):
        lock = RunLock(plain["output_dir"]).acquire()
        return StartPlan(plain, choices, lock=lock, sources=sources)
    lock = RunLock(resume_run_dir(plain["resume"])).acquire()  # before reading its checkpoints
    try:
        run_dir, path, state = resolve_resume_path(plain["resume"])
        plan = _resume_plan(cfg, unresolved, run_dir, path, state, trusted, lock)
        plan.sources = sources  # (this invocation's: the tree the run now continues on)
        return plan
    except BaseException:
        lock.release()
        raise


# Entries a checkpoint needs to be resumed from, and their types.
_TRAINING_STATE = {"model": dict, "optimizer": dict, "pipeline": dict, "rng": dict}


def _check_training_state(state: Mapping[str, Any], path: Path) -> None:
    """A :class:`CheckpointError` naming what a checkpoint to resume from lacks."""
    for key, kind in _TRAINING_STATE.items():
        if not isinstance(state.get(key), kind):
            raise CheckpointError(
                f"{path}: cannot resume from it: its {key!r} entry is missing or not a "
                f"{kind.__name__} (a damaged or crafted checkpoint)"
            )
    steps = state["pipeline"].get("total_steps")
    if type(steps) is not int or steps < 0:
        raise CheckpointError(f"{path}: cannot resume from it: pipeline.total_steps is {steps!r}")
    run_id = state.get("wandb_run_id")  # (a wandb sink continues this run: a folder name)
    if run_id is not None and not (
        isinstance(run_id, str) and re.fullmatch(r"[\w.-]{1,128}", run_id) and ".." not in run_id
    ):
        raise CheckpointError(
            f"{path}: cannot resume from it: wandb_run_id {run_id!r:.60} is not a wandb run id"
        )


def _resume_plan(
    cfg: DictConfig | Mapping[str, Any],
    unresolved: dict[str, Any],
    run_dir: Path,
    path: Path,
    state: dict[str, Any],
    trusted: list[str],
    lock: RunLock,
) -> StartPlan:
    """The plan of ``resume=``, once the run folder is locked."""
    _check_training_state(state, path)
    # The run's own train.log gets this invocation's log too (Hydra's goes to a new folder); a
    # link, folder or FIFO under its name (a copied folder) is refused, never written through.
    check_file_target(run_dir / "train.log")
    handler = NoFollowFileHandler(run_dir / "train.log", encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        saved = rebuild_config(
            state["config"],
            state["choices"],
            str(path),
            trusted_targets=trusted,
            overrides=typed_overrides(cfg),
            sources=state.get("config_sources"),
        )
        config = resume_config(saved, unresolved, typed_override_keys(cfg), run_dir)
    except BaseException:
        logging.getLogger().removeHandler(handler)
        handler.close()
        raise
    stale = remove_stale_temp_files(run_dir)
    log.info(
        "resuming %s from %s (env step %d)%s",
        run_dir,
        path.name,
        state["pipeline"]["total_steps"],
        f"; removed {len(stale)} stale temporary file(s)" if stale else "",
    )
    _move_later_checkpoints_aside(run_dir, path)
    return StartPlan(config, saved.choices, state, path, lock=lock, _log_handler=handler)


def _move_later_checkpoints_aside(run_dir: Path, path: Path) -> None:
    """Move the checkpoints after ``path`` aside: resuming from an older one branches the run.

    Step order then stays the run's history, and ``resume=RUN_DIR`` finds the right one.
    """
    newer = [p for p in list_checkpoints(run_dir) if p.name > path.name]
    if not newer:
        return
    # (a link under the name, planted in a copied run, would move the files out of the run)
    aside = run_subdir(run_dir, CHECKPOINT_DIR, f"superseded_{time.strftime('%Y%m%d-%H%M%S')}")
    for p in newer:
        for f in (p, *p.parent.glob(f"{p.stem}.eval*.json")):  # its evaluations too
            if f.exists():
                f.rename(aside / f.name)
    log.warning(
        "resuming from an older checkpoint: %d later checkpoint(s) moved to %s", len(newer), aside
    )
