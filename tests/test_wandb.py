"""wandb integration: an offline run file holds config, every metric section, the env-step
x-axis, the summary and the checkpoint artifact; resume keeps the run id; sweep grouping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from wandb_records import OfflineRun, read_run

from rl.evaluation.video import write_video
from rl.loggers import wandb as wandb_sink
from rl.loggers.base import RunContext

ROOT = Path(__file__).resolve().parents[1]


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = ["train.py", "+experiment=ppo_nav", "+debug=smoke", "logger=wandb"]
    return subprocess.run(
        [sys.executable, *args, f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_offline_run_file_holds_config_sections_axis_summary_and_artifact(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = train(
        run_dir,
        "valid.enabled=true",  # valid/*
        "valid.num_episodes=2",
        "valid.num_envs=2",
        "video_interval=128",  # videos/probe
        "logger.sinks.wandb.log_checkpoint=true",
        "tags=[nav,test]",
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = run_files(run_dir)
    run: OfflineRun = read_run(path)

    # Run fields from the config.
    assert run.run.run_group == "ppo_nav"
    assert run.run.job_type == "train"
    assert list(run.run.tags) == ["nav", "test"]
    assert run.run.display_name.startswith("PointNavEnv__ppo_nav__1__")
    assert path.name == f"run-{run.run.run_id}.wandb"

    # The resolved config, flat, with the openrlbenchmark keys at the top level and git state.
    assert run.config["exp_name"] == "ppo_nav"
    assert run.config["task_id"] == "PointNavEnv"
    assert run.config["seed"] == 1
    assert run.config["pipeline.num_steps"] == 16
    assert run.config["pipeline.optimizer.lr"] == 3.0e-3  # ppo_nav's
    assert run.config["eval.num_episodes"] == 4
    assert run.config["model.rnn_hidden_size"] == 128
    assert len(run.config["git_sha"]) == 40
    assert isinstance(run.config["git_dirty"], bool)

    # Every section, at env steps.
    keys = run.history_keys
    for section in ("charts/", "losses/ppo/", "eval/", "valid/", "time/", "pipeline/", "videos/"):
        assert any(k.startswith(section) for k in keys), (section, sorted(keys))
    for key in (
        "charts/episodic_return",
        "charts/SPS",
        "charts/learning_rate",
        "losses/ppo/policy_loss",
        "losses/ppo/approx_kl",
        "eval/success",
        "valid/success",
        "time/update_fraction",
        "pipeline/stage",
    ):
        assert key in keys, key
    assert all("global_step" in row for row in run.history)
    video_steps = [row["global_step"] for row in run.history if "videos/probe/path" in row]
    assert video_steps == [128, 256]

    # global_step is the x-axis of every chart (`*` covers videos and the summary too).
    defined = {(m.name, m.glob_name, m.step_metric) for m in run.metrics}
    assert ("global_step", "", "") in defined
    assert ("", "*", "global_step") in defined

    # Final summary: last values at the last env step.
    assert run.summary["global_step"] == 256
    for key in ("eval/success", "eval/spl", "valid/success", "charts/SPS", "losses/ppo/entropy"):
        assert key in run.summary, key

    # The final checkpoint as an artifact.
    (artifact,) = run.artifacts
    assert artifact.name == f"model-{run.run.run_id}"
    assert artifact.type == "model"
    names = {entry.path for entry in artifact.manifest.contents}
    assert names == {
        "ckpt_stage00_step000000000256.pt",
        "ckpt_stage00_step000000000256.eval.json",
    }


@pytest.mark.slow
def test_resume_continues_the_same_wandb_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = train(run_dir, "total_env_steps=128")
    assert proc.returncode == 0, proc.stderr
    proc = train(tmp_path / "resume", f"resume={run_dir}", "total_env_steps=256")
    assert proc.returncode == 0, proc.stderr
    first, second = (read_run(p) for p in run_files(run_dir))
    assert first.run.run_id == second.run.run_id
    assert first.summary["global_step"] == 128
    assert second.summary["global_step"] == 256
    assert [row["global_step"] for row in second.history if "charts/SPS" in row][0] > 128


# ----------------------------------------------------------------------- in-process
def _context(tmp_path: Path) -> RunContext:
    return RunContext(
        output_dir=tmp_path,
        config={"a": {"b": 1}, "exp_name": "x"},
        exp_name="x",
        task_id="T",
        seed=3,
        total_steps=10,
        run_name="T__x__3__0",
    )


def test_disabled_sink_accepts_everything_and_writes_nothing(tmp_path: Path) -> None:
    sink = wandb_sink.WandbSink(context=_context(tmp_path), mode="disabled", log_checkpoint=True)
    assert sink.run.disabled  # wandb's no-op run: no process, no files, no network
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"x")
    sink.log(5, {"charts/a": 1.0})
    sink.log_checkpoint(5, ckpt)
    video = write_video([np.zeros((16, 16, 3), dtype=np.uint8)] * 2, tmp_path / "v.mp4")
    sink.log_video(5, video)
    sink.close()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt.pt", video.name]  # no wandb/


def test_bad_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="online/offline/disabled"):
        wandb_sink.WandbSink(context=_context(tmp_path), mode="on")


def test_flatten_dict_and_git_state() -> None:
    assert wandb_sink.flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": [1]}) == {
        "a.b": 1,
        "a.c.d": 2,
        "e": [1],
    }
    state = wandb_sink.git_state()
    assert set(state) == {"git_sha", "git_dirty"}
    assert wandb_sink.git_state(Path("/")) == {}


def test_sweep_jobs_are_grouped_and_tagged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(wandb_sink, "sweep_of_current_job", lambda: ("2024-01-01_00-00-00", 1))
    calls = []

    class FakeRun:
        id = "abc"

        def define_metric(self, *args, **kwargs) -> None:
            pass

    def fake_init(**kwargs):
        calls.append(kwargs)
        return FakeRun()

    monkeypatch.setattr("wandb.init", fake_init)
    wandb_sink.WandbSink(context=_context(tmp_path), mode="offline", tags=["a"])
    assert calls[-1]["group"] == "x__sweep_2024-01-01_00-00-00"
    assert calls[-1]["tags"] == ["a", "sweep"]
    assert calls[-1]["config"]["sweep_job"] == 1
    # A resumed run (id set) keeps the group it has.
    wandb_sink.WandbSink(context=_context(tmp_path), mode="offline", id="abc")
    assert calls[-1]["group"] is None
    assert calls[-1]["resume"] == "allow"
