"""Crafting checkpoints and run folders as an attacker would, for the trust tests.

A crafted file starts from a real run and is re-signed with the project's digest, so it passes
the archive, digest and ``weights_only`` checks as an attacker's would; the entry points are
the four ways a shared file is used (evaluate a file, evaluate a run, resume, InferenceAgent).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl.checkpoints import latest_checkpoint, save_checkpoint
from rl.checkpoints.files import parse_checkpoint_name
from rl.engine import run
from rl.evaluation import InferenceAgent

SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0"]
# Modules no test imports: a config that gets one imported has run code it chose.
MARKERS = ("this", "antigravity", "smtpd", "xmlrpc.server")


def copy_run(run_dir: Path, tmp_path: Path, name: str = "crafted") -> Path:
    """A copy of the run folder ``run_dir`` under ``tmp_path``."""
    folder = tmp_path / name
    shutil.copytree(run_dir, folder)
    return folder


def resign(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` over the checkpoint ``path``, signed with the project's digest."""
    stage, step = parse_checkpoint_name(path)  # type: ignore[misc]
    save_checkpoint(path.parent.parent, state, stage, step)


def crafted(run_dir: Path, tmp_path: Path, name: str = "crafted") -> tuple[Path, Path, dict]:
    """A copy of the run: ``(folder, its newest checkpoint, that checkpoint's state)``."""
    folder = copy_run(run_dir, tmp_path, name)
    path = latest_checkpoint(folder)
    return folder, path, torch.load(path, weights_only=True)


def file_hashes(folder: Path) -> dict[str, str]:
    """Every entry of ``folder`` (links not followed): a file's SHA-256, a link's target, or
    what else it is (a folder, a FIFO)."""
    found = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            found[key] = f"-> {os.readlink(p)}"
        elif p.is_file():
            found[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            found[key] = "folder" if p.is_dir() else "other"
    return found


VICTIMS = ("victim.txt", "victim.csv", "victim.png", "victim.log", "victim.jsonl")


def make_sentinel(tmp_path: Path, names: tuple[str, ...] = VICTIMS) -> Path:
    """A folder of precious files outside every run: it must never change."""
    folder = tmp_path / "sentinel"
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"precious {name}\n")
    return folder


def entries(
    folder: Path, compose_cfg: Any, out: Path, resume: tuple[str, ...] = ()
) -> list[tuple[str, Callable[[], Any]]]:
    """The ways in: evaluate (a file and a run), resume (with ``resume`` typed), InferenceAgent."""
    ckpt = latest_checkpoint(folder)
    evaluate = ["num_episodes=1", "num_envs=1", "plot=false", "progress_bar=false"]
    return [
        (
            "evaluate ckpt",
            lambda: run.evaluate(
                compose_cfg([f"ckpt={ckpt}", *evaluate, f"output_dir={out}"], "evaluate")
            ),
        ),  # fmt: skip
        (
            "evaluate run_dir",
            lambda: run.evaluate(
                compose_cfg([f"run_dir={folder}", *evaluate, f"output_dir={out}"], "evaluate")
            ),
        ),  # fmt: skip
        ("resume", lambda: run.train(compose_cfg([*SMOKE, f"resume={folder}", *resume]))),
        ("InferenceAgent", lambda: InferenceAgent.from_checkpoint(ckpt)),
    ]
