"""``episodes.csv`` in the run folder: one row per finished training episode (SB3's monitor.csv).

Columns: ``env_step`` (the global env step of the log point that reported the episode), then the
episode's metrics by their logged names without ``charts/`` (``episodic_return``,
``episodic_length``, the task's own: ``success``, ``spl``, ...). The columns are fixed by the
first episodes written (a resumed run keeps its file's header, read back from it); a metric
that appears later has no column and is left out. The episodes of every DDP rank are written by
rank 0.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl.loggers.base import MetricsSink, RunContext, RunFile
from rl.utils.files import read_regular_file

__all__ = ["EpisodeCsvSink"]

FIRST = ("episodic_return", "episodic_length")  # the leading columns, where present
MAX_HEADER_BYTES = 64 * 2**10  # a resumed run's header: read up to this much of the file


class EpisodeCsvSink(MetricsSink):
    """Append a row per finished training episode to a CSV file in the run folder.

    Args:
        context: The run (filled in by the engine).
        filename: File name inside the run folder (relative; a ConfigError otherwise).
    """

    def __init__(self, *, context: RunContext, filename: str = "episodes.csv") -> None:
        self.file = RunFile(context, filename, "episodes file")
        self.path = self.file.path
        self.columns = _header(self.path)  # a resumed run's (None: a new file)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Nothing: the log points' means are the other sinks'."""

    def log_episodes(self, step: int, episodes: Sequence[Mapping[str, float]]) -> None:
        """One row per episode, at global env step ``step``; the header first in a new file."""
        if not episodes:
            return
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if self.columns is None:
            names = sorted({k.removeprefix("charts/") for e in episodes for k in e})
            self.columns = ["env_step", *(c for c in FIRST if c in names),
                            *(n for n in names if n not in FIRST)]  # fmt: skip
            writer.writerow(self.columns)
        for episode in episodes:
            values = {k.removeprefix("charts/"): v for k, v in episode.items()}
            writer.writerow([step, *(values.get(c, "") for c in self.columns[1:])])
        self.file.write(out.getvalue())

    def close(self) -> None:
        """Close the file."""
        self.file.close()


def _header(path: Path) -> list[str] | None:
    """The columns of an existing file (its first line), None for a missing or empty one."""
    raw = read_regular_file(path, MAX_HEADER_BYTES)
    if not raw:
        return None
    first = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
    columns = next(csv.reader([first]), [])
    return columns if columns[:1] == ["env_step"] else None
