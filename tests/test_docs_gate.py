"""The docs gate fails: ``make docs``'s own command on a copy of the site with one broken anchor.

mkdocs stops counting warnings under ``--quiet``, so ``strict`` never triggered while the
Makefile passed it (a real broken anchor built with exit 0). The command is read from the
Makefile's ``docs`` recipe, so this checks what CI runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def docs_command() -> list[str]:
    """The ``mkdocs build ...`` arguments of the Makefile's ``docs`` target, after ``mkdocs``."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("docs:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    build = next(line for line in recipe if "mkdocs build" in line)
    words = shlex.split(build)
    return words[[w.endswith("mkdocs") for w in words].index(True) + 1 :]


def build(site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *docs_command()],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_docs_gate_fails_on_a_broken_anchor(tmp_path: Path) -> None:
    assert docs_command()[0] == "build" and "--strict" in docs_command()
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "rl").symlink_to(ROOT / "rl")  # the API reference's source (paths: [.])
    page = tmp_path / "docs" / "concepts" / "multi-agent.md"
    page.write_text(
        page.read_text(encoding="utf-8")
        + "\nSee [the fields](../howto/add-a-task.md#no-such-heading-here).\n",
        encoding="utf-8",
    )
    done = build(tmp_path)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "no-such-heading-here" in done.stdout + done.stderr
