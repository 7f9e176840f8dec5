"""episodes.csv: one row per finished training episode, its header kept across a resume."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rl.loggers import EpisodeCsvSink
from rl.loggers.base import RunContext
from rl.utils.config import ConfigError
from rl.utils.files import UnsafePathError


def context(folder: Path) -> RunContext:
    return RunContext(output_dir=folder, config={}, exp_name="x", task_id="t", seed=0,
                      total_steps=100, run_name="r")  # fmt: skip


def test_rows_per_episode_and_a_resumed_run_keeps_the_header(tmp_path: Path) -> None:
    sink = EpisodeCsvSink(context=context(tmp_path))
    sink.log_episodes(64, [{"charts/success": 1.0, "charts/episodic_return": 2.5,
                            "charts/episodic_length": 7.0}])  # fmt: skip
    sink.log_episodes(128, [])
    sink.close()
    resumed = EpisodeCsvSink(context=context(tmp_path))  # the file exists: its header is kept
    resumed.log_episodes(192, [{"charts/episodic_return": -1.0, "charts/episodic_length": 3.0,
                                "charts/success": 0.0, "charts/new_metric": 5.0}])  # fmt: skip
    resumed.close()
    with (tmp_path / "episodes.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["env_step", "episodic_return", "episodic_length", "success"],
        ["64", "2.5", "7.0", "1.0"],
        ["192", "-1.0", "3.0", "0.0"],  # (a metric that came later has no column)
    ]


def test_a_link_planted_as_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / "episodes.csv").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePathError):
        EpisodeCsvSink(context=context(tmp_path))
    assert (tmp_path / "target").read_text() == ""


@pytest.mark.parametrize(
    ("header", "problem"),
    [(["env_step", *(f"c{i}" for i in range(32_000))], r"[\d,]+ columns, more than 1,024"),
     (["env_step", "return", "return"], "a column twice")],
)  # fmt: skip
def test_a_crafted_header_is_refused_by_name(
    tmp_path: Path, header: list[str], problem: str
) -> None:
    """A resumed run writes each row as wide as the header: 32,000 columns, which fit in the
    64 KiB read, made every episode's row 640 times longer."""
    (tmp_path / "episodes.csv").write_text(",".join(header) + "\n")
    with pytest.raises(ConfigError, match=f"episodes.csv: its header has {problem}"):
        EpisodeCsvSink(context=context(tmp_path))
