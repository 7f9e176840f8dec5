"""Checkpoints that resume exactly: trainer state round trips, preemption, resume from the CLI.

In-process tests drive :class:`OnPolicyTrainer` directly (fast); the CLI tests run the real
``train.py`` in subprocesses to check signals, ``kill -9`` during checkpoint writes and
``resume=`` / ``init_from=`` end to end.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from rl.engine.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from rl.engine.trainer import OnPolicyTrainer, RolloutInfo
from rl.loggers import MetricsLogger
from rl.losses import ImitationLoss, PPOLoss
from rl.models import ActorCritic
from rl.pipeline import LinearDecay, PipelineStage, TrainingPipeline
from rl.sampling import SerialSampler

SMALL = {"_target_": "rl.tasks.PointNavEnv", "size": 9, "rooms_per_side": 2, "max_steps": 30}


class StopAt:
    """Callback: request a stop once the run reaches ``steps`` env steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        if info.total_steps >= self.steps:
            trainer.request_stop("test")


def make_pipeline() -> TrainingPipeline:
    """Two stages: imitation with teacher forcing, then PPO; LR decays with env steps."""
    return TrainingPipeline(
        named_losses={"ppo": PPOLoss(), "imitation": ImitationLoss()},
        stages=[
            PipelineStage(
                loss_names=["imitation"],
                max_stage_steps=96,
                teacher_forcing=LinearDecay(steps=96, startp=0.8, endp=0.0),
            ),
            PipelineStage(loss_names=["ppo"], max_stage_steps=160),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        lr_scheduler=functools.partial(
            torch.optim.lr_scheduler.LambdaLR, lr_lambda=LinearDecay(steps=256)
        ),
        num_steps=8,
        num_mini_batch=2,
        update_repeats=2,
        metric_accumulate_interval=48,
        save_interval=32,
    )


def make_trainer(tmp_path: Path, sampler: SerialSampler, callbacks=()) -> OnPolicyTrainer:
    torch.manual_seed(0)
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        trunk_layers=[32],
        rnn="gru",
        rnn_hidden_size=16,
    )
    return OnPolicyTrainer(
        model=model,
        pipeline=make_pipeline(),
        sampler=sampler,
        logger=MetricsLogger([]),
        output_dir=tmp_path,
        config={"note": "test"},
        seed=0,
        callbacks=list(callbacks),
    )


def test_interrupted_and_resumed_run_is_bitwise_equal_to_uninterrupted(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        reference = make_trainer(tmp_path / "a", sampler)
        reference.train()
    # Stop mid-stage (step 64, episodes in flight) and resume twice more, past the stage switch.
    for stop in (64, 128, None):
        with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
            callbacks = [StopAt(stop)] if stop else []
            trainer = make_trainer(tmp_path / "b", sampler, callbacks)
            found = list_checkpoints(tmp_path / "b")
            if found:
                trainer.load_state_dict(load_checkpoint(found[-1]))
            trainer.train()
            assert trainer.stop_reason == ("test" if stop else None)
            assert trainer.pipeline.total_steps == (stop or 256)
    assert trainer.pipeline.finished and reference.pipeline.finished
    for (name, a), b in zip(
        reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    for a, b in zip(
        reference.optimizer.state_dict()["state"].values(),
        trainer.optimizer.state_dict()["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert reference.last_metrics.keys() == trainer.last_metrics.keys()
    for key in ("losses/ppo/policy_loss", "charts/episodic_return", "charts/learning_rate"):
        assert reference.last_metrics[key] == trainer.last_metrics[key], key


def test_checkpoint_holds_the_full_training_state(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        trainer = make_trainer(tmp_path, sampler, [StopAt(32)])
        trainer.train()
    path = trainer.last_checkpoint
    assert path is not None and path.name == "ckpt_stage00_step000000000032.pt"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    state = torch.load(path, weights_only=True)  # loads without any pickled object
    for key in ("model", "optimizer", "lr_scheduler", "pipeline", "trackers", "rng"):
        assert state[key] is not None, key
    assert state["pipeline"]["total_steps"] == 32
    assert set(state["rng"]) >= {"python", "numpy", "torch", "shuffle"}
    assert state["rollout"]["hidden"].shape == (1, 4, 16)
    episodes = state["sampler"]["episodes"]
    assert len(episodes) == 4 and all(len(e["actions"]) > 0 for e in episodes)
    # numpy's PCG64 state holds 128-bit ints; they survive weights_only loading.
    auto_reset = [e for e in episodes if e["seed"] is None]
    for e in auto_reset:
        assert e["np_random"]["state"]["state"] > 2**64


class Pickled:
    pass


def test_checkpoint_that_needs_a_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ckpt_stage00_step000000000001.pt"
    torch.save({"model": {}, "config": {}, "x": Pickled()}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)
