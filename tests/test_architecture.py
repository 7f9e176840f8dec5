"""The import contracts of pyproject.toml hold, and they catch a planted back-import.

The contracts (``[tool.importlinter]``) declare ``rl``'s layers, forbid cycles between the
modules of any package and keep the framework apart from its example environments (``rl`` never
imports ``rl_envs``); ``lint-imports`` checks them (also ``make lint``). The other tests copy
``rl/`` and ``rl_envs/`` to a temporary folder, plant an import that breaks a contract, and
check that the same command then fails and names the planted import.
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
    assert "3 kept, 0 broken" in result.stdout


def planted(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a copy of the packages with ``line`` appended to ``module``'s file."""
    for package in ("rl", "rl_envs"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}  # noqa: E402\n")
    return lint_imports(tmp_path)


def test_a_planted_back_import_breaks_the_contracts(tmp_path: Path) -> None:
    result = planted(tmp_path, "rl.sampling.serial", "from rl.engine.run import train")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "rl.sampling.serial -> rl.engine.run" in result.stdout, result.stdout


def test_the_framework_importing_an_example_environment_breaks_the_contracts(
    tmp_path: Path,
) -> None:
    result = planted(tmp_path, "rl.tasks.factory", "from rl_envs.pointnav import PointNavEnv")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rl.tasks.factory -> rl_envs.pointnav" in result.stdout, result.stdout
