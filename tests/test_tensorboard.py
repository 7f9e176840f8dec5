"""logger=tensorboard: event files read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl.engine import run


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
