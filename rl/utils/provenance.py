"""Where a run's code came from: the framework checkout's git commit, and uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """``{"git_sha": ..., "git_dirty": ...}`` of the code's repository (empty outside one).

    ``git_dirty``: tracked files differ from the commit (untracked files are not counted).
    """
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if sha.returncode != 0 or status.returncode != 0:
        return {}
    return {"git_sha": sha.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
