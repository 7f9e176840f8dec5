"""What ``train.py`` needs before and around a run: sweep support, and the engine's import.

Job folder names, the sweep objective, and each failed job's error in its own folder (Hydra
raises only the batch's first error, after the batch). Loads no torch: imported before Hydra
composes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import logging
import math
import re
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import OmegaConf

from rl.utils.config import ConfigError
from rl.utils.logs import log_fatal

log = logging.getLogger(__name__)

# A job folder's name: at most this many bytes, below Linux's 255 with room for what tools add
# (rsync's temporary names, archive suffixes), and enough for an Optuna trial's four parameters.
MAX_JOB_DIR_NAME = 200
# Kept in a job folder's name: what a file name, a shell and a Hydra override value
# (``resume=<sweep dir>/<job>`` unquoted) all take as is: not ``/`` (it would nest folders),
# ``=`` or ``,`` (Hydra would parse them), spaces, quotes, globs, non-ASCII.
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@:-]")
_HASH_CHARS = 8


def job_dir_name(num: int, overrides: str) -> str:
    """A sweep job's folder name: its number, then its overrides made safe for a file name.

    ``(3, "pipeline.optimizer.lr:0.003__seed:2")`` -> ``3_pipeline.optimizer.lr:0.003__seed:2``
    (``overrides``: Hydra's ``hydra.job.override_dirname``). A name longer than
    :data:`MAX_JOB_DIR_NAME` is cut and ends in ``__`` and a hash of all the overrides.
    """
    text = str(overrides)
    name = f"{int(num)}_{_UNSAFE.sub('_', text)}" if text else str(int(num))
    if len(name) <= MAX_JOB_DIR_NAME:
        return name
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:_HASH_CHARS]
    return f"{name[: MAX_JOB_DIR_NAME - _HASH_CHARS - 2]}__{digest}"


# Registered on import: train.py and evaluate.py import this module, so Hydra's launchers find
# it for ``hydra.sweep.subdir``, in the job's own process too.
OmegaConf.register_new_resolver("job_dir_name", job_dir_name, replace=True)


def load_engine() -> types.ModuleType:
    """:mod:`rl.engine.run`, imported on first call: ``--help`` and ``--cfg`` load no torch.

    The imports' objects (millions) live as long as the process: frozen once, the garbage
    collector never walks them again, nor does Python's exit (about 1 s). Later calls freeze
    nothing: a sweep's finished jobs must stay collectable.
    """
    if "rl.engine.run" not in sys.modules:
        importlib.import_module("rl.engine.run")
        gc.freeze()
    return sys.modules["rl.engine.run"]


# Prefixes of `optimized_metric` that are only logged with a setting on.
_NEEDS = {
    "eval/": (
        "eval.num_episodes > 0",
        lambda c: int((c.get("eval") or {}).get("num_episodes", 0)),
    ),
    "valid/": ("valid.enabled=true", lambda c: bool((c.get("valid") or {}).get("enabled"))),
}


class ObjectiveError(ConfigError):
    """``optimized_metric`` cannot be produced (not logged, NaN, or its section is off)."""


def in_multirun() -> bool:
    """Whether this process runs a job of a Hydra multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def check_objective(cfg: Mapping[str, Any]) -> None:
    """Fail before training when ``optimized_metric``'s section is off (``eval/`` without eval)."""
    key = cfg.get("optimized_metric")
    for prefix, (setting, enabled) in _NEEDS.items():
        if key and str(key).startswith(prefix) and not enabled(cfg):
            raise ObjectiveError(
                f"optimized_metric={key!r} is only logged with {setting}; "
                f"set it or optimise another metric"
            )


def objective(metrics: Mapping[str, float], key: str | None) -> float | None:
    """The value of ``optimized_metric`` ``key`` among a run's final metrics (None: no key).

    Raises:
        ObjectiveError: The run never logged ``key``, or its value is NaN (no sweeper can rank it).
    """
    if key is None:
        return None
    if key not in metrics:
        logged = "\n  ".join(sorted(metrics))
        raise ObjectiveError(
            f"optimized_metric={key!r} was never logged by this run; "
            f"the metrics it logged are:\n  {logged}"
        )
    value = float(metrics[key])
    if math.isnan(value):
        raise ObjectiveError(f"optimized_metric={key!r} is NaN at the end of the run")
    return value


@contextlib.contextmanager
def failures_logged() -> Iterator[None]:
    """Log an exception with its traceback to the job's ``train.log`` before it propagates.

    A multirun job's also goes to the console (Hydra reports a single run's); a
    :class:`TrainingStopped` (a signal) is not a failure.
    """
    try:
        yield
    except Exception as e:
        from rl.training.stopping import TrainingStopped  # (loaded by the run by now)

        if isinstance(e, TrainingStopped):
            raise
        if in_multirun():
            from hydra.core.hydra_config import HydraConfig

            hydra_cfg = HydraConfig.get()
            message = (
                f"job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}) failed; the "
                "sweep goes on with the other jobs"
            )
            log_fatal(log, e, message, console=True)
        else:
            log_fatal(log, e, "training failed")
        raise
