"""``bench/gpu_box.py``: what it decides before running a row (skips, flags, budgets), and a
run without CUDA (every row skipped with the reason, a table all the same, exit 1).

The whole CPU dry run end to end is ``tests/test_bench.py``'s ``gpu_box`` run (``--smoke``, the
dry run in a temporary folder): it checks every row of the table as read back from
``table.md`` and the folder's files (each row's log and run folder, ``results.json``). The GPU
box's own run (``bash bench/gpu_kit/run.sh`` in a device call) cannot run here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_box.py"
_spec = importlib.util.spec_from_file_location("gpu_box", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_box = importlib.util.module_from_spec(_spec)
sys.modules["gpu_box"] = gpu_box  # its dataclasses look their module up there
_spec.loader.exec_module(gpu_box)


def test_cuda_rows_are_skipped_with_the_reason_without_cuda() -> None:
    assert gpu_box.cuda_skip(dry=True, cuda=False) is None
    assert gpu_box.cuda_skip(dry=False, cuda=True) is None
    reason = gpu_box.cuda_skip(dry=False, cuda=False)
    assert reason.startswith("skipped: no CUDA device") and "--cpu-dry-run" in reason


def test_nav3d_rows_name_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_box.nav3d_missing() is None  # miniworld and pyglet are installed here
    monkeypatch.setattr(gpu_box, "NAV3D_PACKAGES", ("pyglet", "no_such_package_here"))
    assert gpu_box.nav3d_missing() == "skipped: no package no_such_package_here here"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nav-override", "sampler.num_envs"], "--nav-override: expected KEY=VALUE"),
        (["--nav3d-override", "=3"], "--nav3d-override: expected KEY=VALUE"),
        (["--raw-seconds", "0"], "--raw-seconds: must be positive"),
        (["--envs-per-worker", "-1"], "--envs-per-worker: must be positive"),
    ],
)
def test_bad_flags_are_errors_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpu_box.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_budgets_flags_override_the_mode() -> None:
    args = gpu_box.parse_args(["--nav-seconds", "12", "--envs-per-worker", "3"])
    box = gpu_box.budget_of(args, dry=False)
    assert (box.nav_seconds, box.envs_per_worker) == (12, 3)
    assert box.nav3d_seconds == gpu_box.GPU_BOX.nav3d_seconds == 120
    dry = gpu_box.budget_of(gpu_box.parse_args([]), dry=True)
    assert dry == gpu_box.CPU_DRY_RUN and dry.tts == ("--smoke",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA this is the real benchmark")
def test_without_cuda_every_row_is_skipped_and_the_run_fails(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # nothing measured
    table = (tmp_path / "table.md").read_text()
    rows = [
        ln.split(" | ") for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln
    ]
    assert len(rows) == 7  # the header, five skipped rows, the whole benchmark's
    assert all(r[2] == "skipped" and r[4].startswith("skipped: ") for r in rows[1:6]), table
    assert rows[6][4] == "nothing measured"
    assert json.loads((tmp_path / "results.json").read_text())["dry_run"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "table.md"]
