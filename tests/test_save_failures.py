"""A full disk while saving (issue 19, point 8): a clear error, in train.log too, nothing lost.

The run's ``checkpoints/`` folder is a small tmpfs mounted in a private mount namespace of the
training process (``unshare``), so the disk really fills up: the first checkpoint fits, the
second gets ``ENOSPC``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rl.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent
SMOKE = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "task=nav_small",
    "eval.num_episodes=0",
    "model.cnn_channels=[8]",
    "model.trunk_layers=[16]",
    "model.rnn_hidden_size=8",
]
# A checkpoint of SMOKE is about 104 KiB: one fits in 160 KiB, two do not.
TMPFS_SIZE = "160k"


def _namespace_command() -> list[str] | None:
    """How to get a private mount namespace here (root, or a user namespace), else None."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        probe = [*command, "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt 2>/dev/null"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return command
    return None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_full_disk_names_the_file_and_folder_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    unshare = _namespace_command()
    if unshare is None:
        pytest.skip("no private mount namespace here (unshare needs root or user namespaces)")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    script = (
        f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "$1/checkpoints" || exit 99; '
        '"$2" train.py "${@:3}"; rc=$?; cp -a "$1/checkpoints" "$1/saved"; exit $rc'
    )
    proc = subprocess.run(
        [
            *unshare,
            "bash",
            "-c",
            script,
            "bash",
            str(run_dir),
            sys.executable,
            *SMOKE,
            f"hydra.run.dir={run_dir}",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert proc.returncode == 1, proc.stderr
    first = run_dir / "checkpoints" / "ckpt_stage00_step000000000128.pt"
    expected = (
        f"cannot write checkpoint {run_dir}/checkpoints/ckpt_stage00_step000000000256.pt "
        f"(run folder {run_dir}): No space left on device; the previous checkpoint {first} "
        f"is intact (resume={run_dir} continues from it)"
    )
    assert expected in proc.stderr
    log = (run_dir / "train.log").read_text()
    assert expected in log and "Traceback" in log  # the fatal error in train.log too
    saved = run_dir / "saved"  # the tmpfs's content, copied out of the namespace
    assert sorted(p.name for p in saved.iterdir()) == [first.name, "latest"]  # no temp file
    assert (saved / "latest").read_text() == first.name
    load_checkpoint(saved / first.name)
