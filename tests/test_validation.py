"""Validation during training (separate process, one result per checkpoint) and probe videos."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hydra import compose, initialize
from hydra.core.global_hydra import GlobalHydra

from rl.engine.run import train
from rl.evaluation.settings import ValidSettings
from rl.evaluation.validation import BackgroundValidation
from rl.evaluation.video import write_video
from rl.loggers.base import MetricsLogger
from rl.training.trainer import OnPolicyTrainer
from rl.utils.config import ConfigError

STEPS = [128, 256, 384, 512]


def compose_train(out: Path, *overrides: str) -> Any:
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path="../conf"):
            return compose(
                config_name="train",
                return_hydra_config=True,  # the typed overrides (resume) come from this config
                overrides=[
                    "+experiment=ppo_nav",
                    "+debug=smoke",
                    "task=nav_small",
                    f"output_dir={out}",
                    "total_env_steps=512",
                    "pipeline.stages.0.max_stage_steps=512",
                    "eval.num_episodes=0",
                    *overrides,
                ],
            )
    finally:
        GlobalHydra.instance().clear()


def validation_children() -> list[Any]:
    return [p for p in mp.active_children() if p.name == "rl-validation"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """A tiny run with validation and probe videos on; checkpoints every 128 env steps."""
    out = tmp_path_factory.mktemp("valid") / "run"
    metrics = train(
        compose_train(
            out,
            "valid.enabled=true",
            "valid.num_episodes=3",
            "valid.num_envs=2",
            "video_interval=256",
        )
    )
    return out, metrics


def test_one_valid_result_per_checkpoint(run: tuple[Path, dict[str, float]]) -> None:
    out, metrics = run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if any(k.startswith("valid/") for k in r)]
    assert [r["env_step"] for r in valid] == STEPS  # every checkpoint, once, in order
    ckpts = sorted((out / "checkpoints").glob("ckpt_*.pt"))
    assert len(ckpts) == len(STEPS)
    for r in valid:
        assert {"valid/success", "valid/spl", "valid/episodic_return"} <= set(r)
    assert "valid/success" in metrics  # the newest result is returned (sweep objectives)
    assert validation_children() == []  # no process left behind


def test_probe_videos_written(run: tuple[Path, dict[str, float]]) -> None:
    out, _ = run
    videos = sorted((out / "videos").iterdir())
    assert [v.name for v in videos] == ["step_000000000256.mp4", "step_000000000512.mp4"]
    import imageio.v2 as imageio

    with imageio.get_reader(videos[0]) as reader:
        frames = [frame for frame in reader]  # noqa: C416  (len(reader) is inf)
    assert len(frames) >= 2 and frames[0].shape[2] == 3


def test_gif_when_ffmpeg_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails
    frames = [np.full((20, 30, 3), i * 40, dtype=np.uint8) for i in range(4)]
    path = write_video(frames, tmp_path / "v.mp4")
    assert path.suffix == ".gif" and path.read_bytes()[:3] == b"GIF"


class RecordingLogger(MetricsLogger):
    def __init__(self) -> None:
        super().__init__([])
        self.records: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.records.append((step, dict(metrics)))


def test_falls_behind_loudly_and_skips_nothing(
    run: tuple[Path, dict[str, float]], caplog: pytest.LogCaptureFixture
) -> None:
    out, _ = run
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    logger = RecordingLogger()
    settings = dataclasses.replace(ValidSettings(**cfg["valid"]), num_episodes=2, num_envs=2)
    validation = BackgroundValidation(
        settings, task=cfg["task"], model=cfg["model"], logger=logger, device="cpu"
    )
    try:
        with caplog.at_level(logging.WARNING, logger="rl.evaluation.validation"):
            for path in sorted((out / "checkpoints").glob("ckpt_*.pt")):
                validation.submit(path)
        assert "4 checkpoints pending" in caplog.text
        validation.finish()
    finally:
        validation.close()
    assert [step for step, _ in logger.records] == STEPS
    assert validation._process is not None and not validation._process.processes[0].is_alive()


def test_validation_process_stopped_when_training_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = OnPolicyTrainer.save
    saves: list[Path] = []

    def failing_save(self: OnPolicyTrainer, *args: Any, **kwargs: Any) -> Path:
        path = real_save(self, *args, **kwargs)
        saves.append(path)
        if len(saves) == 2:
            raise RuntimeError("boom")
        return path

    monkeypatch.setattr(OnPolicyTrainer, "save", failing_save)
    with pytest.raises(RuntimeError, match="boom"):
        train(compose_train(tmp_path / "run", "valid.enabled=true", "valid.num_episodes=2"))
    assert validation_children() == []


def test_valid_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid.episodes: unknown key"):
        train(compose_train(tmp_path / "run", "+valid.episodes=3"))
    with pytest.raises(ConfigError, match="video_interval"):
        train(compose_train(tmp_path / "run", "video_interval=-1"))


def test_wandb_sink_logs_videos(run: tuple[Path, dict[str, float]], tmp_path: Path) -> None:
    from rl.loggers import RunContext, WandbSink

    video = sorted((run[0] / "videos").iterdir())[0]
    context = RunContext(
        output_dir=tmp_path,
        config={"a": 1},
        exp_name="x",
        task_id="t",
        seed=1,
        total_steps=10,
        run_name="r",
    )
    sink = WandbSink(context=context, mode="offline")
    try:
        sink.log_video(256, video)
    finally:
        sink.close()
    assert list(tmp_path.glob("wandb/offline-run-*/files/media/videos/**/*.mp4"))


def test_periodic_evaluation_at_its_interval_with_exact_episode_counts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(compose_train(out, "eval.interval=128", "eval.num_episodes=3", "eval.num_envs=2"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/success" in r]
    assert [r["env_step"] for r in evals] == [128, 256, 384, 512]  # the last one not twice
    # Each record says how long its evaluation took (benchmarks take it off the clock).
    assert all(0 < r["eval/seconds"] < r["wall_time"] for r in evals)
    final = json.loads(
        (out / "checkpoints" / "ckpt_stage00_step000000000512.eval.json").read_text()
    )
    assert [e["episode_seed"] for e in final["episodes"]] == [1_000_000, 1_000_001, 1_000_002]


def test_validations_pending_at_a_stop_run_after_resume(
    run: tuple[Path, dict[str, float]], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(run[0], out)
    # What a stop with validations pending leaves: checkpoints without their result.
    for step in (256, 384):
        (out / "checkpoints" / f"ckpt_stage00_step{step:012d}.valid.json").unlink()
    before = (out / "metrics.jsonl").read_text().count('"valid/success"')
    train(
        compose_train(
            tmp_path / "ignored",
            f"resume={out}",
            "total_env_steps=640",
            "pipeline.stages.0.max_stage_steps=640",
            "valid.enabled=true",
            "valid.num_episodes=3",
            "valid.num_envs=2",
            "video_interval=256",
        )
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid_steps = [r["env_step"] for r in records if "valid/success" in r][before:]
    assert valid_steps == [256, 384, 640]  # the pending two first, then the new one
    assert all(p.with_suffix(".valid.json").exists() for p in (out / "checkpoints").glob("*.pt"))
