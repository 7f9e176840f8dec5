"""``metrics.jsonl`` in the run folder: one JSON record per log point."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping

from rl.loggers.base import MetricsSink, RunContext, RunFile


class JsonlSink(MetricsSink):
    """Append ``{"env_step", "wall_time", ...metrics}`` records to a JSON-lines file.

    Args:
        context: The run (filled in by the engine).
        filename: File name inside the run folder (relative; a ConfigError otherwise).
    """

    def __init__(self, *, context: RunContext, filename: str = "metrics.jsonl") -> None:
        self.file = RunFile(context, filename, "metrics file")
        self.path = self.file.path
        self._t0 = time.time()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one record (NaN becomes null) and flush."""
        record: dict[str, object] = {"env_step": step, "wall_time": time.time() - self._t0}
        for k, v in metrics.items():
            record[k] = None if isinstance(v, float) and math.isnan(v) else v
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Close the file."""
        self.file.close()
