"""The run folder's own log files: ``metrics.jsonl`` and ``episodes.csv``."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl.loggers.base import MetricsSink, RunContext
from rl.utils.config import ConfigError
from rl.utils.files import describe_write_error, open_append, read_regular_file, run_subdir

FIRST = ("episodic_return", "episodic_length")  # episodes.csv's leading columns, where present
MAX_HEADER_BYTES = 64 * 2**10  # a resumed run's episodes.csv header: read up to this much
MAX_COLUMNS = 1_024  # of episodes.csv (an episode's metrics: a few per agent)


class RunFile:
    """A file in the run folder that a sink appends to (``what`` names it in messages).

    ``filename`` is checked by :meth:`RunContext.path`; a link in a folder on the way is refused.

    Raises:
        UnsafePathError: A link, a folder or a FIFO under the file's name.
    """

    def __init__(self, context: RunContext, filename: str, what: str) -> None:
        path = context.path(filename, f"{what} ({filename})")
        self.path = run_subdir(context.output_dir, *Path(filename).parent.parts) / path.name
        self.what = what
        self._file = open_append(self.path)

    def write(self, text: str) -> None:
        """Append ``text`` and flush (a full disk is said as such)."""
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as e:
            raise OSError(e.errno, describe_write_error(self.path, e, self.what)) from None

    def close(self) -> None:
        """Close the file (a write that cannot be flushed any more is dropped, not raised)."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass


class JsonlSink(MetricsSink):
    """Append ``{"env_step", "wall_time", ...metrics}`` records (NaN: null) to a JSON-lines file.

    Args:
        context: The run (filled in by the engine).
        filename: File name inside the run folder.
    """

    def __init__(self, *, context: RunContext, filename: str = "metrics.jsonl") -> None:
        self.file = RunFile(context, filename, "metrics file")
        self.path = self.file.path
        self._t0 = time.time()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one record and flush."""
        record: dict[str, object] = {"env_step": step, "wall_time": time.time() - self._t0}
        for k, v in metrics.items():
            record[k] = None if isinstance(v, float) and math.isnan(v) else v
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Close the file."""
        self.file.close()


class EpisodeCsvSink(MetricsSink):
    """A CSV row per finished training episode (SB3's monitor.csv), every DDP rank's on rank 0.

    Columns: ``env_step`` (of the log point that reported the episode), then the episode's
    metrics without ``charts/``. They are fixed by the first episodes written (a resumed run's
    by its file's header): a metric that appears later is left out.

    Args:
        context: The run (filled in by the engine).
        filename: File name inside the run folder.
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
    """The columns of an existing file (its first line), None for a missing or empty one.

    Raises:
        ConfigError: The header has more than :data:`MAX_COLUMNS` columns or one twice (a
            crafted header would make every row a resumed run writes that wide).
    """
    raw = read_regular_file(path, MAX_HEADER_BYTES)
    if not raw:
        return None
    first = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
    columns = next(csv.reader([first]), [])
    if columns[:1] != ["env_step"]:
        return None
    if len(columns) > MAX_COLUMNS or len(set(columns)) < len(columns):
        problem = (
            f"{len(columns):,} columns, more than {MAX_COLUMNS:,}"
            if len(columns) > MAX_COLUMNS
            else "a column twice"
        )
        raise ConfigError(
            f"{path}: its header has {problem}, which this run never writes; move the file "
            "away to start a new one"
        )
    return columns
