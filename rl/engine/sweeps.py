"""Sweep support for ``train.py``: the objective a sweeper optimises, and failing jobs.

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
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from rl.training.stopping import TrainingStopped
from rl.utils.config import ConfigError
from rl.utils.logs import log_fatal

log = logging.getLogger(__name__)

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
