"""``bench/gpu_box.py``: its CPU dry run writes the table, the results and every row's log.

The GPU box's own run (``bash bench/gpu_kit/run.sh`` in a device call) cannot run here; its
``--cpu-dry-run`` goes through the same rows, commands and files with tiny budgets on the CPU,
so a broken row (a renamed config key, a changed bench helper) fails here first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_box.py"
_spec = importlib.util.spec_from_file_location("gpu_box", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_box = importlib.util.module_from_spec(_spec)
sys.modules["gpu_box"] = gpu_box  # its dataclasses look their module up there
_spec.loader.exec_module(gpu_box)

NUM = r"[\d,]+(?:\.\d+)?"
# (row label starts with, measure starts with, value pattern): every row of the dry run's table.
ROWS = [
    ("ppo_nav, batched task and learner on CUDA", "training steps/s", NUM),
    ("ppo_nav, batched task and learner on CUDA", "held-out success at", rf"{NUM} \(SPL {NUM}\)"),
    ("ppo_nav, batched task and learner on CPU", "training steps/s", NUM),
    ("CUDA learner / CPU learner", "training steps/s ratio", rf"{NUM}x"),
    ("nav3d raw limit: ", "env steps/s", NUM),
    ("dagger_ppo_nav3d_depth nav3d_small, collector.num_workers=auto", "training steps/s", NUM),
    (
        "dagger_ppo_nav3d_depth nav3d_small, collector.num_workers=auto",
        "share of the raw",
        "\\d+%",
    ),
    (
        "dagger_ppo_nav3d_depth nav3d_small, collector.num_workers=auto",
        "held-out success at",
        rf"{NUM} \(SPL {NUM}\)",
    ),
    ("whole benchmark", "wall time", rf"{NUM} s"),
]


@pytest.mark.slow
@pytest.mark.timeout(600)  # about a minute alone on two cores; minutes when they are busy
def test_cpu_dry_run_writes_table_results_and_logs(tmp_path: Path) -> None:
    out = tmp_path / "gpu_box"
    env = {**os.environ, "WANDB_MODE": "disabled", "RAY_ADDRESS": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr}"
    table = (out / "table.md").read_text()
    assert table in done.stdout, "the printed table is not the file's"
    assert re.search(r"^# GPU box benchmark: CPU dry run", table, re.MULTILINE)
    assert re.search(r"^device: no CUDA device; CPU ", table, re.MULTILINE)
    assert re.search(r"^cores: \d+ \(\d+ this process may use\)", table, re.MULTILINE)
    assert re.search(r"^torch \S+ \(CUDA \S+\), Python 3\.", table, re.MULTILINE)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert len(cells) == len(ROWS), table
    for (label, measure, value), row in zip(ROWS, cells, strict=True):
        assert row[0].startswith(label) and row[1].startswith(measure), table
        assert re.fullmatch(value, row[2]), f"{row[0]} / {row[1]}: value {row[2]!r}\n{table}"
        assert row[4] in ("dry run", ""), f"{row[0]}: verdict {row[4]!r} in a dry run\n{table}"

    results = json.loads((out / "results.json").read_text())
    assert results["dry_run"] is True
    assert [r["value"] for r in results["rows"]] == [row[2] for row in cells]
    for key in ("ppo_nav_cuda", "ppo_nav_cpu", "nav3d"):
        run = results[key]
        assert "error" not in run, run
        assert run["exit_code"] in (0, 143) and run["fps"]["records"] >= 2, run
        assert (out / key / "seed1" / "metrics.jsonl").is_file()
        assert "--override=device=cpu" in run["command"]  # the learner; the task too for ppo_nav
    assert results["nav3d_raw"]["steps_per_s"] > 0
    logs = {p.name for p in out.glob("*.log")}
    assert logs == {"ppo_nav_cuda.log", "ppo_nav_cpu.log", "nav3d_raw.log", "nav3d.log"}


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
