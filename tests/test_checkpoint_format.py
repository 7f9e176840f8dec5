"""Checkpoints written by earlier code resume exactly, and the layout stays what it says it is.

``fixtures/checkpoint_format2`` holds the step-128 checkpoint of a run made at commit 2c68314
(before the engine was split into training / collection / evaluation / checkpoints) with::

    python train.py +experiment=ppo_nav +debug=smoke task=nav_small model.cnn_channels=[8] \\
        model.trunk_layers=[16] model.rnn_hidden_size=8 eval.num_episodes=0

Resuming it with today's code must give the same run as training from scratch with today's
code: the old file is read completely and means what it meant (formats 3 and 4 keep the layout
and add entries; the
carried GRU state, ``rollout.hidden`` ``[L, N, H]`` in format 2, is ``rollout.state.h``
``[N, L, H]`` now). Same episodes, same pipeline
position; weights and optimizer moments agree to float32 rounding, not bitwise, since the
recurrent update's hand-written backward (``rl.models.gru``) sums gradients in another order
than the autograd graph of the code that wrote the fixture.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rl.checkpoints import latest_checkpoint, list_checkpoints, load_checkpoint
from rl.engine import run
from rl.training import CHECKPOINT_FORMAT
from rl.utils.config import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_format2"
OVERRIDES = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "task=nav_small",
    "model.cnn_channels=[8]",
    "model.trunk_layers=[16]",
    "model.rnn_hidden_size=8",
    "eval.num_episodes=0",
    # What ppo_nav was then (its defaults changed since; the resumed run uses its saved config).
    "model.image_encoding=embed",
    "sampler=serial",
    "pipeline.recurrence=0",
    "pipeline.optimizer.lr=5e-4",
]
LAYOUT = {
    "format_version",
    "model",
    "losses",
    "optimizer",
    "lr_scheduler",
    "pipeline",
    "trackers",
    "finished_episodes",
    "trainer",
    "rng",
    "sampler",
    "rollout",
    "normalizer",
    "config",
    "choices",
    "config_sources",
    "wandb_run_id",
}


def _gru_state(checkpoint: dict) -> torch.Tensor:
    """The carried GRU state ``[N, L, H]``: format 3's ``rollout.state.h``, or format 2's
    ``rollout.hidden`` ``[L, N, H]``."""
    rollout = checkpoint["rollout"]
    if "state" in rollout:
        return rollout["state"]["h"]
    return rollout["hidden"].transpose(0, 1)


def _assert_same_training_state(a: dict, b: dict) -> None:
    assert a["pipeline"] == b["pipeline"]
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        torch.testing.assert_close(value, b["model"][key], atol=1e-6, rtol=1e-5, msg=key)
    for i, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            other = b["optimizer"]["state"][i][key]
            torch.testing.assert_close(value, other, atol=1e-6, rtol=1e-4, msg=f"{i}.{key}")
    torch.testing.assert_close(_gru_state(a), _gru_state(b), atol=1e-5, rtol=0)
    assert a["sampler"] == b["sampler"]  # the same episodes, to the last action


def test_a_format2_checkpoint_from_before_the_split_resumes_exactly(
    compose_cfg, tmp_path: Path
) -> None:
    old_run = tmp_path / "old"
    shutil.copytree(FIXTURE, old_run)
    old = load_checkpoint(list_checkpoints(old_run)[0])
    assert old["format_version"] == 2 and CHECKPOINT_FORMAT == 5
    # (format 3 adds normalizer, None when off; format 4 losses, empty without auxiliary heads;
    # format 5 replaces config_unresolved, dropped unread, by choices: None here, rebuilt on
    # conf/'s defaults; config_sources and finished_episodes, optional in format 5, read as
    # None when absent)
    assert set(old) == LAYOUT - {"normalizer", "losses", "finished_episodes"}
    assert old["choices"] is None
    assert old["config_sources"] is None
    # It names the environment where it was then (rl.tasks), read as where it is now (rl_envs).
    assert old["config"]["task"]["_target_"] == "rl.tasks.PointNavEnv"
    # As a user resumes: the run folder (the saved config is used; conf/ changed since).
    run.train(compose_cfg(["+experiment=ppo_nav", "+debug=smoke", f"resume={old_run}"]))
    resumed = load_checkpoint(latest_checkpoint(old_run))
    assert resumed["pipeline"]["total_steps"] == 256

    # Today's code from scratch, into tmp_path / "run"; the old run had no episode splits.
    run.train(compose_cfg([*OVERRIDES, "task.split=null"]))
    fresh = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert set(fresh) == LAYOUT  # today's checkpoints keep the layout
    _assert_same_training_state(resumed, fresh)
    # The checkpoint at the resume point is the same too (today's code wrote it afresh).
    again = load_checkpoint(list_checkpoints(tmp_path / "run")[0])
    _assert_same_training_state(old, again)


def test_a_config_naming_a_moved_environment_fails_with_its_new_path(compose_cfg) -> None:
    cfg = compose_cfg(
        ["+experiment=ppo_nav", "+debug=smoke", "task._target_=rl.tasks.PointNavEnv"]
    )
    with pytest.raises(ConfigError, match=r"task\._target_: 'rl.tasks.PointNavEnv' moved: write "
                       r"'rl_envs.pointnav.PointNavEnv'"):  # fmt: skip
        run.train(cfg)
