"""deterministic=true: deterministic algorithms during the run, the previous settings after."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rl.checkpoints import latest_checkpoint, load_checkpoint
from rl.engine import run
from rl.training import OnPolicyTrainer

SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "model.cnn_channels=[8]",
         "eval.num_episodes=0"]  # fmt: skip


def settings() -> tuple[bool, bool, bool, str | None]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def test_the_switch_is_applied_during_training_and_undone_after(
    compose_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = settings()
    assert before[0] is False
    seen = []
    real_train = OnPolicyTrainer.train

    def spy(self: OnPolicyTrainer) -> dict[str, float]:
        seen.append(settings())
        return real_train(self)

    monkeypatch.setattr(OnPolicyTrainer, "train", spy)
    run.train(compose_cfg([*SMOKE, "deterministic=true", f"output_dir={tmp_path / 'a'}"],
                          set_output_dir=False))  # fmt: skip
    assert seen == [(True, True, False, ":4096:8")]
    assert settings() == before
    run.train(compose_cfg([*SMOKE, f"output_dir={tmp_path / 'b'}"], set_output_dir=False))
    assert seen[-1] == before  # off by default
    a = load_checkpoint(latest_checkpoint(tmp_path / "a"))["model"]
    b = load_checkpoint(latest_checkpoint(tmp_path / "b"))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # on the CPU it changes no result
