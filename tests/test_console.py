"""The console summary line: what a researcher reads while a run trains."""

from __future__ import annotations

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
