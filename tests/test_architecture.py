"""The import contracts of pyproject.toml hold, and they catch a planted back-import.

The contracts (``[tool.importlinter]``) declare ``rl``'s layers and forbid cycles between the
modules of any package; ``lint-imports`` checks them (also ``make lint``). The second test
copies ``rl/`` to a temporary folder, plants an import from a low layer into the run wiring,
and checks that the same command then fails and names the planted import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``rl`` package found in ``project`` with its pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(project / "pyproject.toml")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_a_planted_back_import_breaks_the_contracts(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "rl", tmp_path / "rl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / "rl" / "sampling" / "serial.py"
    planted.write_text(planted.read_text() + "\nfrom rl.engine.run import train  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "rl.sampling.serial -> rl.engine.run" in result.stdout, result.stdout
