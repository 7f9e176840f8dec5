"""The console summary line: what a researcher reads while a run trains."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from rl.loggers.base import RunContext
from rl.loggers.console import ConsoleSink


@pytest.fixture
def sink(tmp_path: Path) -> ConsoleSink:
    context = RunContext(
        output_dir=tmp_path, config={}, exp_name="x", task_id="t", seed=0, total_steps=100,
        run_name="r", resume_id=None,
    )  # fmt: skip
    return ConsoleSink(context=context, progress_bar=False)


def test_teacher_forcing_is_shown_beside_the_success_it_inflates(sink, capsys) -> None:
    sink.log(10, {"pipeline/stage": 0.0, "pipeline/teacher_ratio": 0.85, "charts/success": 1.0})
    sink.log(20, {"pipeline/stage": 1.0, "pipeline/teacher_ratio": 0.0, "charts/success": 0.4})
    forced, free = capsys.readouterr().err.strip().splitlines()
    assert forced.startswith("step 10 | stage 0 | teacher-forced 85% | success 1.000 | elapsed ")
    assert free.startswith("step 20 | stage 1 | success 0.400 | elapsed ")


def test_piped_lines_carry_elapsed_time_and_eta_and_reach_train_log(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """No bar (a piped console): the line ends with the time since the start and the budget
    left at the rate since the first progress; every line is in <run>/train.log too."""
    clock = iter([100.0, 130.0, 190.0])  # the start, the first progress, the summary line
    monkeypatch.setattr("rl.loggers.console.time.monotonic", lambda: next(clock))
    context = RunContext(
        output_dir=tmp_path, config={}, exp_name="x", task_id="t", seed=0, total_steps=1_000,
        run_name="r", resume_id=None,
    )  # fmt: skip
    sink = ConsoleSink(context=context, progress_bar=False)
    sink.progress(100, {})  # a resumed run's first report: 100 steps already done
    sink.progress(200, {})
    sink.log(200, {"charts/success": 0.5})
    sink.close()
    # 100 steps in 60 s since the first report; 800 left: 480 s. Elapsed: 90 s since start.
    line = capsys.readouterr().err.strip()
    assert line == "step 200 | success 0.500 | elapsed 0:01:30 | eta 0:08:00"
    logged = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert logged.rstrip().endswith("[rl.summary][INFO] - step 200 | success 0.500")


def test_train_log_through_a_link_is_refused(tmp_path: Path) -> None:
    """A run folder is untrusted: the sink never appends through a link planted as train.log."""
    from rl.utils.files import UnsafePathError

    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "train.log").symlink_to(tmp_path / "elsewhere")
    context = RunContext(
        output_dir=tmp_path, config={}, exp_name="x", task_id="t", seed=0, total_steps=100,
        run_name="r", resume_id=None,
    )  # fmt: skip
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ConsoleSink(context=context, progress_bar=False)
    assert (tmp_path / "elsewhere").read_text() == ""


@pytest.mark.parametrize(("setting", "shown"), [(None, False), (True, True), (False, False)])
def test_the_bar_shows_on_a_terminal_only_unless_forced(
    tmp_path: Path, monkeypatch, setting, shown
) -> None:
    """A redirected console (a file, not a terminal): the default leaves the bar out."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    context = RunContext(
        output_dir=tmp_path, config={}, exp_name="x", task_id="t", seed=0, total_steps=100,
        run_name="r", resume_id=None,
    )  # fmt: skip
    sink = ConsoleSink(context=context, progress_bar=setting)
    try:
        assert sink._bar.disable is (not shown)
    finally:
        sink.close()
