"""logger=tensorboard: event files read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from rl.engine import run
from rl.loggers.tensorboard import run_hparams


def test_scalars_with_the_env_step_axis_and_probe_videos(compose_cfg: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run.train(
        compose_cfg(
            ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "model.cnn_channels=[8]",
             "logger=tensorboard", "video_interval=128", f"output_dir={out}"],
            set_output_dir=False,
        )
    )  # fmt: skip
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for key in (
        "charts/SPS",
        "charts/episodic_return",
        "losses/ppo/policy_loss",
        "losses/grad_norm",
        "time/update_fraction",
        "pipeline/stage",
        "eval/success",
    ):
        assert key in scalars, key  # fmt: skip
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    sps_steps = [r["env_step"] for r in logged if "charts/SPS" in r]
    assert [e.step for e in events.Scalars("charts/SPS")] == sps_steps == [64, 128, 192, 256]
    sps = [r["charts/SPS"] for r in logged if "charts/SPS" in r]
    assert [e.value for e in events.Scalars("charts/SPS")] == pytest.approx(sps, rel=1e-6)
    videos = events.Images("videos/probe")
    assert [v.step for v in videos] == [128, 256]
    assert videos[0].encoded_image_string[:3] == b"GIF"
    # The HParams dashboard: the run's settings against its metrics, one finished session.
    hp = {
        k: HParamsPluginData.FromString(v) for k, v in events.PluginTagToContent("hparams").items()
    }
    start = hp["_hparams_/session_start_info"].session_start_info.hparams
    assert start["pipeline.optimizer.lr"].number_value == pytest.approx(3e-3)
    assert (
        start["sampler.num_envs"].number_value == 4 and start["exp_name"].string_value == "ppo_nav"
    )
    metrics = [m.name.tag for m in hp["_hparams_/experiment"].experiment.metric_infos]
    assert "eval/success" in metrics and "eval/success" in scalars
    assert hp["_hparams_/session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS


def test_hparams_are_the_usual_settings_and_the_command_lines() -> None:
    config = {"seed": 3, "exp_name": "x", "pipeline": {"optimizer": {"lr": 0.1}, "gamma": 0.9},
              "model": {"cnn_channels": [8, 16]}, "sampler": {"num_envs": 4}}  # fmt: skip
    overrides = ["model.cnn_channels=[8,16]", "+pipeline.gamma=0.9", "hydra.verbose=true"]
    assert run_hparams(config, overrides) == {
        "seed": 3, "exp_name": "x", "sampler.num_envs": 4, "pipeline.gamma": 0.9,
        "pipeline.optimizer.lr": 0.1, "model.cnn_channels": "[8, 16]",
    }  # fmt: skip
