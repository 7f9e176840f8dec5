"""The run's logger built from the ``logger`` config group (one sink per entry of ``sinks``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hydra.utils

from rl.loggers.base import MetricsLogger, MetricsSink, RunContext
from rl.utils.config import ConfigError


def build_logger(config: Mapping[str, Any], context: RunContext) -> MetricsLogger:
    """A :class:`MetricsLogger` over the sinks of the ``logger`` section (``null`` ones skipped).

    ``config`` is ``{"sinks": {name: partial sink config}}``; each sink is built with ``context``.

    Raises:
        ConfigError: A sink refused its options (named ``logger.sinks.<name>``); the sinks
            built before it are closed.
    """
    sinks: list[MetricsSink] = []
    try:
        for name, sink in (config.get("sinks") or {}).items():
            if not sink:
                continue
            try:
                sinks.append(hydra.utils.instantiate(sink)(context=context))
            except ConfigError as e:
                raise ConfigError(f"logger.sinks.{name}: {e}") from None
    except BaseException:
        for built in sinks:  # the ones opened before the refusal
            built.close()
        raise
    return MetricsLogger(sinks)
