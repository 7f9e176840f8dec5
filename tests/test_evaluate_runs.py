"""evaluate.py over runs: every checkpoint once in step order, thinning, globs, expert, errors."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize
from hydra.core.global_hydra import GlobalHydra

import rl.evaluation.runs as eval_runs
from rl.checkpoints import CheckpointError
from rl.engine.run import evaluate, train
from rl.evaluation import NoExpertError
from rl.evaluation.runs import CheckpointRef, thin_by_steps
from rl.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
STEPS = [128, 256, 384, 512]


def _compose(config_name: str, overrides: list[str]) -> Any:
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path="../conf"):
            return compose(config_name=config_name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny PointNav run with checkpoints at env steps 128, 256, 384 and 512."""
    out = tmp_path_factory.mktemp("evalrun") / "run"
    cfg = _compose(
        "train",
        [
            "+experiment=ppo_nav",
            "+debug=smoke",
            "task=nav_small",
            f"output_dir={out}",
            "total_env_steps=512",
            "pipeline.stages.0.max_stage_steps=512",
            "eval.num_episodes=0",
        ],
    )
    train(cfg)
    yield out


def eval_cfg(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    cfg = _compose(
        "evaluate",
        [
            "num_episodes=4",
            "num_envs=2",
            "progress_bar=false",
            f"output_dir={tmp_path / 'eval_out'}",
            *overrides,
        ],
    )
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return plain


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def summary_steps(run: Path) -> list[int]:
    data = json.loads((run / "eval_summary.json").read_text())
    return [row["step"] for row in data["checkpoints"]]


def test_run_dir_evaluates_every_checkpoint_once_in_step_order(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = copy_run(run_dir, tmp_path)
    calls: list[list[int]] = []
    real = eval_runs.evaluate_policy

    def spy(**kwargs: Any) -> Any:
        calls.append(list(kwargs["episode_seeds"]))
        return real(**kwargs)

    monkeypatch.setattr(eval_runs, "evaluate_policy", spy)
    logged = evaluate(eval_cfg(tmp_path, f"run_dir={run}"))
    assert "eval/success" in logged
    assert len(calls) == len(STEPS)  # each checkpoint exactly once
    assert all(c == list(range(1_000_000, 1_000_004)) for c in calls)
    assert summary_steps(run) == STEPS
    for step in STEPS:
        ckpt = run / "checkpoints" / f"ckpt_stage00_step{step:012d}.pt"
        data = json.loads(_result(ckpt).read_text())
        assert [e["episode_seed"] for e in data["episodes"]] == list(range(1_000_000, 1_000_004))
        assert data["settings"]["step"] == step
        assert set(data["metrics"]) >= {"success", "spl", "return", "length"}
    with (run / "eval_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == STEPS
    assert {"success", "spl", "return", "length", "stage"} <= set(rows[0])
    png = run / "eval_summary.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_steps_thins_and_keeps_the_last(run_dir: Path, tmp_path: Path) -> None:
    run = copy_run(run_dir, tmp_path)
    evaluate(eval_cfg(tmp_path, f"run_dir={run}", "every_steps=200", "plot=false"))
    assert summary_steps(run) == [128, 384, 512]
    assert not list((run / "checkpoints").glob("ckpt_stage00_step000000000256.eval*.json"))
    evaluate(eval_cfg(tmp_path, f"run_dir={run}", "every_steps=1000", "plot=false"))
    assert summary_steps(run) == [128, 512]


def test_each_setting_keeps_its_own_summary(run_dir: Path, tmp_path: Path) -> None:
    """argmax and sampled evaluations of one run: neither summary replaces the other."""
    run = copy_run(run_dir, tmp_path)
    evaluate(eval_cfg(tmp_path, f"run_dir={run}", "every_steps=1000", "deterministic=true"))
    evaluate(eval_cfg(tmp_path, f"run_dir={run}", "every_steps=1000", "deterministic=false"))
    (argmax,) = run.glob("eval_summary.test-4ep-argmax-*.json")
    (sampled,) = run.glob("eval_summary.test-4ep-sampled-*.json")
    assert json.loads(argmax.read_text())["settings"]["deterministic"] is True
    assert json.loads(sampled.read_text())["settings"]["deterministic"] is False
    for summary in (argmax, sampled):
        assert summary.with_suffix(".csv").is_file() and summary.with_suffix(".png").is_file()
    # eval_summary.* is the latest evaluation's, a copy of its own
    assert (run / "eval_summary.json").read_text() == sampled.read_text()
    assert (run / "eval_summary.png").read_bytes() == sampled.with_suffix(".png").read_bytes()


def test_thin_by_steps_per_run() -> None:
    refs = [CheckpointRef(Path(f"a/checkpoints/c{s}.pt"), 0, s) for s in (10, 20, 30, 45, 50)]
    refs += [CheckpointRef(Path(f"b/checkpoints/c{s}.pt"), 0, s) for s in (5, 6)]
    kept = thin_by_steps(refs, 20)
    assert [(r.run_dir.name, r.step) for r in kept] == [
        ("a", 10),
        ("a", 30),
        ("a", 50),
        ("b", 5),
        ("b", 6),
    ]
    assert thin_by_steps(refs, 0) == refs


def test_glob_selects_matching_checkpoints_in_step_order(run_dir: Path, tmp_path: Path) -> None:
    run = copy_run(run_dir, tmp_path)
    pattern = str(run / "checkpoints" / "ckpt_stage00_step000000000[35]*.pt")
    evaluate(eval_cfg(tmp_path, f"ckpt='{pattern}'", "plot=false"))
    assert summary_steps(run) == [384, 512]
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        evaluate(eval_cfg(tmp_path, f"ckpt='{run}/nothing_*.pt'"))


def _result(checkpoint: Path, pattern: str = "*-*ep-*") -> Path:
    """The only result of evaluate.py for ``checkpoint`` whose settings tag matches."""
    (path,) = checkpoint.parent.glob(f"{checkpoint.stem}.eval.{pattern}.json")
    return path


def test_single_checkpoint_file(run_dir: Path, tmp_path: Path) -> None:
    run = copy_run(run_dir, tmp_path)
    ckpt = run / "checkpoints" / "ckpt_stage00_step000000000256.pt"
    logged = evaluate(eval_cfg(tmp_path, f"ckpt={ckpt}", "deterministic=true"))
    assert "eval/spl" in logged
    data = json.loads(_result(ckpt).read_text())
    assert data["settings"]["deterministic"] is True
    assert data["settings"]["split"] == "test"  # held-out layouts by default
    assert not (run / "eval_summary.json").exists()  # a single file writes no run summary
    evaluate(eval_cfg(tmp_path, f"ckpt={ckpt}", "deterministic=true", "split=valid"))
    valid = json.loads(_result(ckpt, "valid-*").read_text())
    assert valid["settings"]["split"] == "valid"
    assert valid["episodes"] != data["episodes"]  # other layouts, other episodes
    # Both results stay, side by side: the settings are in the names.
    assert json.loads(_result(ckpt, "test-*").read_text()) == data


def test_expert_reference_on_pointnav(run_dir: Path, tmp_path: Path) -> None:
    run = copy_run(run_dir, tmp_path)
    logged = evaluate(eval_cfg(tmp_path, f"run_dir={run}", "test_expert=true", "num_episodes=8"))
    assert logged["expert/success"] == 1.0
    assert logged["expert/spl"] == 1.0
    data = json.loads((run / "expert.eval.json").read_text())
    assert [e["episode_seed"] for e in data["episodes"]] == list(range(1_000_000, 1_000_008))
    # A later evaluation of the run on the same episodes shows the expert as the reference.
    evaluate(eval_cfg(tmp_path, f"run_dir={run}", "num_episodes=8", "every_steps=1000"))
    summary = json.loads((run / "eval_summary.json").read_text())
    assert summary["expert"]["success"] == 1.0


def test_expert_from_a_task_config_without_a_run(tmp_path: Path) -> None:
    logged = evaluate(eval_cfg(tmp_path, "test_expert=true", "task=nav_small"))
    assert logged["expert/success"] == 1.0
    assert (tmp_path / "eval_out" / "expert.eval.json").is_file()


def test_expert_of_a_task_without_one_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoExpertError, match="declares no expert"):
        evaluate(eval_cfg(tmp_path, "test_expert=true", "task=gym"))
    with pytest.raises(ConfigError, match="needs a task"):
        evaluate(eval_cfg(tmp_path, "test_expert=true"))


def test_errors_name_the_problem(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        evaluate(eval_cfg(tmp_path, f"run_dir={tmp_path}"))
    with pytest.raises(ConfigError, match="exactly one of"):
        evaluate(eval_cfg(tmp_path))
    with pytest.raises(ConfigError, match="num_episodes: must be >= 1, got 0"):
        evaluate(eval_cfg(tmp_path, f"run_dir={run_dir}", "num_episodes=0"))
    with pytest.raises(ConfigError, match="every_steps: must be >= 0"):
        evaluate(eval_cfg(tmp_path, f"run_dir={run_dir}", "every_steps=-1"))
    run = copy_run(run_dir, tmp_path)
    with pytest.raises(ConfigError, match="is a folder"):
        evaluate(eval_cfg(tmp_path, f"ckpt={run}"))
    bad = run / "checkpoints" / "ckpt_stage00_step000000000300.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=str(bad.name)):
        evaluate(eval_cfg(tmp_path, f"run_dir={run}"))


def test_cli_run_dir(run_dir: Path, tmp_path: Path) -> None:
    run = copy_run(run_dir, tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            f"run_dir={run}",
            "num_episodes=3",
            "every_steps=256",
            "progress_bar=true",  # (output to a pipe: the bar is off unless asked for)
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        cwd=ROOT,
        env={**os.environ, "WANDB_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "checkpoints: 100%" in proc.stderr  # the progress bar
    assert summary_steps(run) == [128, 384, 512]
    for step in ("128", "384", "512"):
        assert step in proc.stdout
    assert (run / "eval_summary.png").is_file()


def test_the_summary_plot_draws_the_training_curve(tmp_path: Path) -> None:
    from rl.evaluation.report import plot_checkpoint_metrics, training_curve

    metrics = tmp_path / "metrics.jsonl"
    records = [
        {"env_step": 64, "charts/success": 0.25, "charts/episodic_return": 1.5},
        {"env_step": 96, "losses/ppo/policy_loss": 0.1},  # no episode finished: skipped
        {"env_step": 128, "charts/success": 0.5, "charts/spl": 0.4},
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in records) + '\n{"env_step": 1')
    curve = training_curve(metrics)
    assert curve == [
        {"step": 64.0, "success": 0.25, "return": 1.5},
        {"step": 128.0, "success": 0.5, "spl": 0.4},
    ]
    assert training_curve(tmp_path / "missing.jsonl") == []
    # An untrusted run folder's metrics.jsonl: a link to /dev/zero (memory) or a FIFO (a hang)
    # is skipped at once (issue 34), and so is a link to a real metrics file.
    for name, make in (
        ("zero.jsonl", lambda p: p.symlink_to("/dev/zero")),
        ("fifo.jsonl", os.mkfifo),
        ("link.jsonl", lambda p: p.symlink_to(metrics)),
    ):
        make(tmp_path / name)
        assert training_curve(tmp_path / name) == [], name
    # Checkpoint rows without SPL: the SPL panel comes from the training curve alone.
    rows = [{"step": 128, "success": 0.5, "return": 2.0}]
    assert plot_checkpoint_metrics(rows, tmp_path / "a.png") is not None
    assert plot_checkpoint_metrics([{"step": 1}], tmp_path / "b.png") is None
    assert plot_checkpoint_metrics([{"step": 1}], tmp_path / "c.png", training=curve) is not None
