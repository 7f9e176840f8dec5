"""The suite's own tools (tests/conftest.py): ``--cpu-per-test`` writes what each test costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SPIN_AND_SLEEP = """
import time

def test_spins():
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass

def test_sleeps():
    time.sleep(0.2)
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on a file of two tests, with this suite's conftest loaded as a plugin."""
    (tmp_path / "test_two.py").write_text(SPIN_AND_SLEEP)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "conftest",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *args, str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cpu_per_test_writes_each_tests_cost(tmp_path: Path) -> None:
    out = tmp_path / "cpu.jsonl"
    done = _pytest(tmp_path, "-n", "0", "--cpu-per-test", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    records = {r["id"].split("::")[-1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"test_spins", "test_sleeps"}
    spins = records["test_spins"]
    assert spins["cpu"] >= 0.3 and spins["wall"] >= 0.35, spins  # its own 0.4 CPU-s counted
    assert records["test_sleeps"]["wall"] >= 0.2, records


def test_cpu_per_test_refuses_several_test_processes(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "-n", "2", "--cpu-per-test", str(tmp_path / "cpu.jsonl"))
    assert done.returncode == 4, done.stdout + done.stderr  # a usage error, before any test
    assert "needs one test process" in done.stderr
    assert not (tmp_path / "cpu.jsonl").exists()
