"""The run's logger built from the ``logger`` config group (one sink per entry of ``sinks``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hydra.utils

from rl.loggers.base import MetricsLogger, RunContext


def build_logger(config: Mapping[str, Any], context: RunContext) -> MetricsLogger:
    """A :class:`MetricsLogger` over the sinks of ``config["sinks"]`` (``null`` entries skipped).

    Args:
        config: The plain ``logger`` section: ``{"sinks": {name: partial sink config}}``.
        context: What every sink is told about the run.
    """
    sinks = [
        hydra.utils.instantiate(sink)(context=context)
        for sink in (config.get("sinks") or {}).values()
        if sink
    ]
    return MetricsLogger(sinks)
