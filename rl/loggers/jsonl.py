"""``metrics.jsonl`` in the run folder: one JSON record per log point."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

from rl.loggers.base import MetricsSink, RunContext
from rl.utils.files import describe_write_error, open_append, run_subdir


class JsonlSink(MetricsSink):
    """Append ``{"env_step", "wall_time", ...metrics}`` records to a JSON-lines file.

    Args:
        context: The run (filled in by the engine).
        filename: File name inside the run folder (relative; a ConfigError otherwise).
    """

    def __init__(self, *, context: RunContext, filename: str = "metrics.jsonl") -> None:
        path = context.path(filename, "JsonlSink filename")
        # (its folder's components checked: a link there is refused, never written through)
        self.path = run_subdir(context.output_dir, *Path(filename).parent.parts) / path.name
        self._file = open_append(self.path)  # (a link, a folder, a FIFO under the name: refused)
        self._t0 = time.time()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one record (NaN becomes null) and flush."""
        record: dict[str, object] = {"env_step": step, "wall_time": time.time() - self._t0}
        for k, v in metrics.items():
            record[k] = None if isinstance(v, float) and math.isnan(v) else v
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as e:  # a full disk: said as such, as for checkpoints
            raise OSError(e.errno, describe_write_error(self.path, e, "metrics file")) from None

    def close(self) -> None:
        """Close the file (a write that cannot be flushed any more is dropped, not raised)."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass
