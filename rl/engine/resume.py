"""Resuming runs, weights-only starts, and stopping cleanly on signals.

``resume=RUN_DIR`` (or a checkpoint file) continues a run in its own folder from its newest
loadable checkpoint with the config saved in it. Settings typed on the command line that differ
from the saved ones are listed and applied only where that is safe (budgets and the schedule
horizons derived from them, logging, evaluation, thread count, tags, save and log intervals);
anything else is a :class:`~rl.utils.config.ConfigError` naming the keys. The saved config keeps
its interpolations (``${total_env_steps}``), so a new budget re-resolves every stage budget and
schedule horizon that derives from it.

Signals: SIGTERM and SIGUSR1 ask the trainer to save a checkpoint at the end of the current
rollout and stop; ``train`` then raises :class:`TrainingStopped` whose ``exit_code`` is
:data:`EXIT_SIGTERM` (143) or :data:`EXIT_REQUEUE` (3, for requeueing schedulers). A first
Ctrl-C does the same with :data:`EXIT_SIGINT` (130); a second one aborts at once (the last
checkpoint on disk stays valid: checkpoints are written atomically).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fnmatch
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl.engine.checkpoint import (
    CHECKPOINT_DIR,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_stale_temp_files,
)
from rl.models.actor_critic import ActorCritic
from rl.utils.config import ConfigError

log = logging.getLogger(__name__)

# Exit codes of train.py after a signal-triggered stop (a checkpoint has been saved).
EXIT_SIGTERM = 143  # 128 + SIGTERM, what a killed process reports: "stopped, not finished"
EXIT_REQUEUE = 3  # SIGUSR1: "checkpointed, requeue me" for a scheduler's requeue rule
EXIT_SIGINT = 130  # 128 + SIGINT (Ctrl-C)
_EXIT_CODES = {"SIGTERM": EXIT_SIGTERM, "SIGUSR1": EXIT_REQUEUE, "SIGINT": EXIT_SIGINT}

# Config keys that a resume may change (dotted paths, fnmatch patterns; a pattern also covers
# everything below it). Everything else must match the saved run.
SAFE_RESUME_KEYS = (
    "total_env_steps",
    "pipeline.stages.*.max_stage_steps",
    "pipeline.lr_scheduler.lr_lambda.steps",
    "pipeline.named_losses.*.clip_decay.steps",
    "pipeline.stages.*.teacher_forcing.steps",
    "pipeline.save_interval",
    "pipeline.metric_accumulate_interval",
    "pipeline.stages.*.save_interval",
    "pipeline.stages.*.metric_accumulate_interval",
    "logger",
    "eval",
    "torch_threads",
    "tags",
    "optimized_metric",
    "valid",
    "video_interval",
)
# Keys that describe the invocation, not the run: never compared.
_INVOCATION_KEYS = ("output_dir", "resume", "init_from")


class TrainingStopped(Exception):
    """Training stopped early on a signal, after saving a checkpoint.

    Attributes:
        reason: The signal's name (``SIGTERM``, ``SIGUSR1``, ``SIGINT``).
        exit_code: What ``train.py`` exits with (see the module docstring).
        checkpoint: The checkpoint saved at the stop.
    """

    def __init__(self, reason: str, checkpoint: Path | None) -> None:
        self.reason = reason
        self.exit_code = _EXIT_CODES.get(reason, 1)
        self.checkpoint = checkpoint
        super().__init__(
            f"training stopped by {reason}; checkpoint {checkpoint} (resume with "
            f"resume={checkpoint.parent.parent if checkpoint else '<run dir>'})"
        )


# ------------------------------------------------------------------------ signals
@contextlib.contextmanager
def stop_on_signals(trainer: Any) -> Iterator[None]:
    """Within the block, SIGTERM / SIGUSR1 / SIGINT call ``trainer.request_stop(name)``.

    A second SIGINT raises ``KeyboardInterrupt`` (abort without saving). Handlers are only
    installed in the main thread of the main interpreter and the previous ones are restored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and trainer.stop_reason is not None:
            raise KeyboardInterrupt
        if trainer.stop_reason is None:
            hint = " (Ctrl-C again to abort without saving)" if name == "SIGINT" else ""
            # os.write is safe in a signal handler (logging and print may not be).
            os.write(
                2,
                f"\n{name}: saving a checkpoint after this rollout, then exiting{hint}\n".encode(),
            )
        trainer.request_stop(name)

    names = ["SIGTERM", "SIGINT", "SIGUSR1"]
    previous = {}
    try:
        for name in names:
            if hasattr(signal, name):
                sig = getattr(signal, name)
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ------------------------------------------------------------------- checkpoints
def resolve_resume_path(path: str | Path) -> tuple[Path, Path, dict[str, Any]]:
    """``(run_dir, checkpoint, state)`` for ``resume=PATH`` (a run folder or a checkpoint file).

    For a run folder this is the newest checkpoint in step order that loads (unreadable ones
    are skipped with a warning). Every file under a checkpoint name is complete (atomic
    writes), so this is also right when a crash fell between a checkpoint's rename and the
    update of ``latest``.
    """
    path = Path(path).expanduser().resolve()
    if path.is_file():
        if path.parent.name != CHECKPOINT_DIR:
            raise CheckpointError(
                f"resume={path}: a checkpoint must lie in <run>/{CHECKPOINT_DIR}"
            )
        return path.parent.parent, path, load_checkpoint(path)
    if not path.is_dir():
        raise CheckpointError(f"resume={path}: no such run folder or checkpoint")
    candidates = list(reversed(list_checkpoints(path)))
    if not candidates:
        latest_checkpoint(path)  # raises the usual "no checkpoint in ..." error
    for candidate in candidates:
        try:
            state = load_checkpoint(candidate)
        except CheckpointError as e:
            log.warning("skipping unreadable checkpoint: %s", e)
            continue
        return path, candidate, state
    raise CheckpointError(f"resume={path}: no readable checkpoint")


# -------------------------------------------------------------------- configs
def unresolved_config(cfg: DictConfig | Mapping[str, Any], plain: Mapping[str, Any]) -> dict:
    """``cfg`` as plain containers with its interpolations kept (stored in checkpoints).

    Interpolations that only resolve inside a Hydra app (``${hydra:...}``, ``${now:...}``) are
    replaced by their resolved values from ``plain``, so the result resolves anywhere.
    """
    if not isinstance(cfg, DictConfig):
        return copy.deepcopy(dict(plain))
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)

    def fix(node: Any, resolved: Any) -> Any:
        if isinstance(node, dict) and isinstance(resolved, dict):
            return {k: fix(v, resolved.get(k)) for k, v in node.items()}
        if isinstance(node, list) and isinstance(resolved, list) and len(node) == len(resolved):
            return [fix(v, r) for v, r in zip(node, resolved, strict=True)]
        if isinstance(node, str) and ("${hydra:" in node or "${now:" in node):
            return resolved
        return node

    return fix(raw, dict(plain))  # type: ignore[no-any-return]


def typed_override_keys(cfg: DictConfig | Mapping[str, Any]) -> list[str] | None:
    """Config keys named by the overrides typed on the command line (None if unknown)."""
    overrides: list[str] | None = None
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        overrides = list(cfg.hydra.overrides.task)
    else:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            overrides = list(HydraConfig.get().overrides.task)
    if overrides is None:
        return None
    keys = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("~+").split("@", 1)[0]
        if key and not key.startswith("hydra"):
            keys.append(key)
    return keys


_MISSING = object()


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested config by dotted path (lists by index; empty containers are leaves)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(node, list) and node and any(isinstance(v, (dict, list)) for v in node):
        out = {}
        for i, v in enumerate(node):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: node}


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted_path: (old, new)}`` for every leaf that differs (absent: ``<missing>``)."""
    a = {k: v for k, v in _flatten(dict(old)).items() if k.split(".")[0] not in _INVOCATION_KEYS}
    b = {k: v for k, v in _flatten(dict(new)).items() if k.split(".")[0] not in _INVOCATION_KEYS}
    out = {}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va is _MISSING or vb is _MISSING or va != vb or type(va) is not type(vb):
            out[key] = (va, vb)
    return out


def is_safe_resume_key(path: str) -> bool:
    """True if ``path`` (or a parent of it) matches :data:`SAFE_RESUME_KEYS`."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, pat) for p in prefixes for pat in SAFE_RESUME_KEYS)


def _covered(path: str, keys: list[str]) -> bool:
    return any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in keys)


def _show(value: Any) -> str:
    return "<missing>" if value is _MISSING else repr(value)


def _set_path(node: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        key: Any = int(part) if isinstance(node, list) else part
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last: Any = int(parts[-1]) if isinstance(node, list) else parts[-1]
    if value is _MISSING:
        node.pop(last, None)  # type: ignore[call-overload]
    else:
        node[last] = value


def resume_config(
    state: Mapping[str, Any],
    new_unresolved: Mapping[str, Any],
    typed_keys: list[str] | None,
    run_dir: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config a resumed run uses: the saved one plus the safe changes typed now.

    Args:
        state: The checkpoint resumed from.
        new_unresolved: The config composed by this invocation (interpolations kept).
        typed_keys: Keys typed on the command line (None: every difference counts as typed).
            Differences from the saved config that were not typed (e.g. a default changed in
            ``conf/`` since, or an experiment overlay not repeated) keep the saved value.
        run_dir: The run folder (the new ``output_dir``).

    Returns:
        ``(resolved, unresolved)`` configs of the resumed run.

    Raises:
        ConfigError: A typed change is unsafe (listing every such key with both values).
    """
    saved_resolved = state["config"]
    saved = copy.deepcopy(state.get("config_unresolved") or saved_resolved)
    diff = config_diff(saved, new_unresolved)
    typed = {k: v for k, v in diff.items() if typed_keys is None or _covered(k, typed_keys)}
    untyped = sorted(set(diff) - set(typed))
    unsafe = [k for k in typed if not is_safe_resume_key(k)]
    if unsafe:
        raise ConfigError(
            "resume: these settings differ from the saved run and cannot change when resuming "
            "(start a new run, or init_from=CHECKPOINT for its weights only):\n  "
            + "\n  ".join(f"{k}: {_show(typed[k][0])} -> {_show(typed[k][1])}" for k in unsafe)
        )
    merged = copy.deepcopy(saved)
    for key, (_, value) in typed.items():
        _set_path(merged, key, value)
    merged["output_dir"] = str(run_dir)
    merged["resume"] = new_unresolved.get("resume")
    merged["init_from"] = None
    resolved = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    assert isinstance(resolved, dict)
    derived = {k: v for k, v in config_diff(saved_resolved, resolved).items() if k not in typed}
    bad = [k for k in derived if not is_safe_resume_key(k)]
    if bad:
        raise ConfigError(
            "resume: the changes typed now also change settings that cannot change when "
            "resuming:\n  "
            + "\n  ".join(f"{k}: {_show(derived[k][0])} -> {_show(derived[k][1])}" for k in bad)
        )
    if typed or derived:
        log.warning(
            "resume: settings changed from the saved run:\n  %s",
            "\n  ".join(
                f"{k}: {_show(a)} -> {_show(b)}{'' if k in typed else '  (derived)'}"
                for k, (a, b) in {**typed, **derived}.items()
            ),
        )
    if untyped:
        log.info(
            "resume: %d setting(s) differ from what this command composes but were not typed "
            "on the command line; the saved run's values are kept: %s",
            len(untyped),
            ", ".join(untyped),
        )
    return resolved, merged


# ------------------------------------------------------------------- start plan
@dataclasses.dataclass
class StartPlan:
    """How a training run starts: fresh, resumed (``resume=``) or from weights (``init_from=``).

    Attributes:
        config: The resolved config to run (for a resume: the saved one plus safe changes).
        config_unresolved: The same with interpolations kept (stored in checkpoints).
        resume_state: The checkpoint resumed from (None unless resuming).
        checkpoint: Its path (or the ``init_from`` checkpoint's).
        init_state: The ``init_from`` checkpoint (None unless given).
    """

    config: dict[str, Any]
    config_unresolved: dict[str, Any]
    resume_state: dict[str, Any] | None = None
    checkpoint: Path | None = None
    init_state: dict[str, Any] | None = None
    _log_handler: logging.Handler | None = None

    @property
    def wandb_run_id(self) -> str | None:
        """The wandb run id saved with the resumed run (None otherwise)."""
        return None if self.resume_state is None else self.resume_state.get("wandb_run_id")

    def init_model(self, model: ActorCritic) -> None:
        """Load the ``init_from`` checkpoint's weights into ``model`` (no-op without one)."""
        if self.init_state is None:
            return
        try:
            model.load_state_dict(self.init_state["model"])
        except RuntimeError as e:
            raise CheckpointError(
                f"init_from={self.checkpoint}: its weights do not fit this run's model: {e}"
            ) from e
        log.info(
            "init_from: weights of %s; optimizer, schedules and pipeline start fresh (stage 0)",
            self.checkpoint,
        )

    def close(self) -> None:
        """Detach the run folder's log file (resume only)."""
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None


def plan_start(cfg: DictConfig | Mapping[str, Any], plain: dict[str, Any]) -> StartPlan:
    """Work out how the run starts from its composed config (``resume`` / ``init_from``).

    Args:
        cfg: The composed config (a ``DictConfig`` keeps interpolations and typed overrides).
        plain: ``cfg`` resolved.

    Raises:
        ConfigError: Both ``resume`` and ``init_from``, or unsafe changes on resume.
        CheckpointError: The checkpoint is missing or unreadable.
    """
    unresolved = unresolved_config(cfg, plain)
    if plain.get("resume") and plain.get("init_from"):
        raise ConfigError(
            "resume and init_from exclude each other: resume=RUN continues a run exactly; "
            "init_from=CHECKPOINT starts a new run from its weights"
        )
    if plain.get("init_from"):
        path = Path(plain["init_from"]).expanduser()
        if path.is_dir():
            path = resolve_resume_path(path)[1]
        return StartPlan(plain, unresolved, checkpoint=path, init_state=load_checkpoint(path))
    if not plain.get("resume"):
        return StartPlan(plain, unresolved)
    run_dir, path, state = resolve_resume_path(plain["resume"])
    # The run's own train.log gets this invocation's log too (Hydra's goes to a new folder).
    handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        config, merged = resume_config(state, unresolved, typed_override_keys(cfg), run_dir)
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
    newer = [p for p in list_checkpoints(run_dir) if p.name > path.name]
    if newer:
        # Resuming from an older checkpoint branches the run: move the later checkpoints aside so
        # that step order stays the run's history (and resume=RUN_DIR finds the right one).
        aside = run_dir / CHECKPOINT_DIR / f"superseded_{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(exist_ok=True)
        for p in newer:
            for f in (p, p.with_suffix(".eval.json")):
                if f.exists():
                    f.rename(aside / f.name)
        log.warning(
            "resuming from an older checkpoint: %d later checkpoint(s) moved to %s",
            len(newer),
            aside,
        )
    wandb_id = state.get("wandb_run_id")
    sinks = (config.get("logger") or {}).get("sinks") or {}
    for sink in sinks.values():
        if sink and str(sink.get("_target_", "")).endswith("WandbSink") and wandb_id:
            if sink.get("id") is None:
                sink["id"] = wandb_id
                log.info("resume: continuing wandb run %s", wandb_id)
    return StartPlan(config, merged, state, path, _log_handler=handler)


def wandb_run_id(sinks: list[Any]) -> str | None:
    """Id of the wandb run among logger sinks (None without one)."""
    for sink in sinks:
        run = getattr(sink, "run", None)
        run_id = getattr(run, "id", None)
        if isinstance(run_id, str) and run_id:
            return run_id
    return None
