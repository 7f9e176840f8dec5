"""episodes.csv: one row per finished training episode, its header kept across a resume."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rl.loggers import EpisodeCsvSink
from rl.loggers.base import RunContext
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
