"""Sweep support for ``train.py``: job folder names, the sweep objective, failing jobs.

A job's folder is ``<sweep dir>/<job number>_<overrides>`` (:func:`job_dir_name`, the
``${job_dir_name:...}`` resolver of ``conf/hydra/default.yaml``), e.g.
``3_pipeline.optimizer.lr:0.003__seed:2``: numbered in launch order, unique, readable as a
TensorBoard run name, and a value that ``resume=`` and ``run_dir=`` take unquoted.

A Hydra multirun (basic, joblib or submitit launcher, or the Optuna sweeper) runs every job of a
batch even when one raises: Hydra keeps the exception in the job's result and raises the first
one only after the batch, so the sweep exits non-zero at the end (the Optuna sweeper records the
trial as failed and goes on while ``hydra.sweeper.max_failure_rate`` allows). Each job's
``finally`` blocks have closed its samplers and finished its wandb run by then. What Hydra does
not do is say *which* job failed and why in that job's folder: :func:`failures_logged` logs the
traceback to the job's ``train.log`` (and the console) as it happens.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import OmegaConf

from rl.training.stopping import TrainingStopped
from rl.utils.config import ConfigError
from rl.utils.logs import log_fatal

log = logging.getLogger(__name__)

# A job folder's name: at most this many bytes (ASCII only), below the 255 of a file name on
# Linux with room for what tools add to a name (rsync's temporary names, archive suffixes), and
# enough for an Optuna trial's four parameters at full precision.
MAX_JOB_DIR_NAME = 200
# Kept in a job folder's name: what a file name, a shell and a Hydra override value
# (``resume=<sweep dir>/<job>`` unquoted) all take as is. Anything else becomes ``_``: ``/``
# (a path in a value would nest folders), ``=`` and ``,`` (Hydra would parse them), spaces,
# brackets, quotes, shell globs, non-ASCII.
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@:-]")
_HASH_CHARS = 8


def job_dir_name(num: int, overrides: str) -> str:
    """A sweep job's folder name: its number, then its overrides made safe for a file name.

    ``overrides`` is Hydra's ``hydra.job.override_dirname`` (``conf/hydra/default.yaml``
    writes ``key:value`` items joined by ``__`` and leaves out the keys that do not set a job
    apart). ``(3, "pipeline.optimizer.lr:0.003__seed:2")`` ->
    ``3_pipeline.optimizer.lr:0.003__seed:2``; no overrides -> ``3``. Characters outside
    ``A-Z a-z 0-9 . _ + @ : -`` become ``_``. A name longer than :data:`MAX_JOB_DIR_NAME`
    keeps its beginning and ends in ``__`` and a hash of all the overrides. The number first
    keeps the names unique and in launch order (by number) whatever the overrides.
    """
    text = str(overrides)
    name = f"{int(num)}_{_UNSAFE.sub('_', text)}" if text else str(int(num))
    if len(name) <= MAX_JOB_DIR_NAME:
        return name
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:_HASH_CHARS]
    return f"{name[: MAX_JOB_DIR_NAME - _HASH_CHARS - 2]}__{digest}"


# (Registered on import: train.py and evaluate.py import this module, so Hydra's launchers
# find it when they resolve ``hydra.sweep.subdir``, in the job's own process too.)
OmegaConf.register_new_resolver("job_dir_name", job_dir_name, replace=True)

# Sections of `optimized_metric` that only exist with a setting on (checked before training).
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
    """Fail before training when ``optimized_metric``'s section cannot be logged.

    Raises:
        ObjectiveError: e.g. ``optimized_metric=eval/success`` with ``eval.num_episodes=0``.
    """
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
        ObjectiveError: The run never logged ``key`` (the message lists what it logged), or
            its value is NaN (e.g. no episode finished), which no sweeper can rank.
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

    In a multirun job also to the console (Hydra then records the job as failed and carries on
    with the sweep); a single run's console gets Hydra's own error report. An error the engine
    already logged is not logged twice. :class:`TrainingStopped` (a signal) is not a failure.
    """
    try:
        yield
    except TrainingStopped:
        raise
    except Exception as e:
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
