"""Every shipped experiment runs with ``+debug=smoke`` alone, staged ones included.

Stage budgets are fractions of ``total_env_steps`` (the last stage takes the rest), so the smoke
budget shortens every stage. The experiments run as one Hydra multirun (one process, a job each,
as a sweep over experiments would); the offline one apart, with its generated expert data kept
inside the test's folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl.tasks.factory import task_layout

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
OFFLINE = [e for e in EXPERIMENTS if e.startswith("bc_")]
pytestmark = pytest.mark.slow


def _train(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    return subprocess.run(
        [sys.executable, "train.py", *args, "+debug=smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _check_run(run_dir: Path) -> None:
    """The run ended at the smoke budget in its last stage, having gone through every stage."""
    config = (run_dir / "config.yaml").read_text()
    stages = config.count("_target_: rl.pipeline.PipelineStage")
    names = [p.name for p in sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))]
    assert names and names[-1].startswith(f"ckpt_stage{stages - 1:02d}_"), (run_dir, names)
    steps = int(names[-1].split("_step")[1].split(".")[0])
    # the budget, to a rollout per stage (a step of a multi-agent task: one row per agent)
    agents = task_layout(yaml.safe_load(config)["task"]).agents
    assert 256 <= steps < 256 + 16 * agents * stages * 4, names
    if stages > 1:
        assert '"pipeline/stage": 1.0' in (run_dir / "metrics.jsonl").read_text()


def test_every_experiment_smoke_runs(tmp_path: Path) -> None:
    online = [e for e in EXPERIMENTS if e not in OFFLINE]
    sweep = tmp_path / "multirun"
    proc = _train("-m", f"+experiment={','.join(online)}", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-5000:]
    for job, experiment in enumerate(online):  # jobs are numbered in the sweep's order
        run_dir = sweep / f"{job}_+experiment:{experiment}"  # named by its overrides
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert f"+experiment={experiment}" in overrides, (job, overrides)
        _check_run(run_dir)


@pytest.mark.parametrize("experiment", OFFLINE)
def test_the_offline_experiment_smoke_runs(tmp_path: Path, experiment: str) -> None:
    data = "pipeline.stages.0.offpolicy_component.data_iterator"
    run_dir = tmp_path / "run"
    proc = _train(
        f"+experiment={experiment}",
        f"hydra.run.dir={run_dir}",
        f"{data}.path={tmp_path / 'expert.npz'}",
        f"{data}.generate.num_episodes=50",
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    _check_run(run_dir)
