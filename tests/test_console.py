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
    assert forced == "step 10 | stage 0 | teacher-forced 85% | success 1.000"
    assert free == "step 20 | stage 1 | success 0.400"


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
