"""NaN and infinity are errors where they enter, never saved (issue 19, point 4).

Environments' rewards and observations are checked by the sampler (serial, multiprocess and
process collection workers, which run one), losses and gradient norms by the learner (an error
naming the term, or ``pipeline.on_nonfinite=skip`` with a counter), weights by the checkpoint
writer.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from collectors import worker_settings
from pipelines import ppo_pipeline
from small import SMALL

from rl.checkpoints import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from rl.collection import CollectionSpec, InProcessCollector, RolloutRequest
from rl.collection.worker_set import CollectionWorkerError, CollectionWorkerSet
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic, build_policy
from rl.pipeline import PipelineStage
from rl.sampling import MultiprocessSampler, SamplerProcessError, SerialSampler
from rl.tasks import task_spaces
from rl.training import OnPolicyTrainer, RunRecord
from rl.utils.finite import NonFiniteError
from rl.utils.seeding import env_seeds

NUM_ENVS = 4
MLP = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [],
       "trunk_layers": [], "rnn": None, "head_layers": [16]}  # fmt: skip


def faulty(mode: str, env: int = 2, life_step: int = 13) -> dict[str, Any]:
    """Environment ``env`` of 4 returns a NaN on its ``life_step``-th step (13: step 3 of its
    second episode, since episodes of action 0 are truncated after 10 steps)."""
    return {"_target_": "rl_envs.toys.debug.FaultyEnv",
            "fail_seed": env_seeds(NUM_ENVS, 0)[env], "fail_at_step": life_step,
            "mode": mode, "max_steps": 10}  # fmt: skip


FIELDS = [("nan_reward", "non-finite reward (nan)"), ("nan_obs", "non-finite observation (nan)")]


@pytest.mark.parametrize(("mode", "field"), FIELDS)
@pytest.mark.parametrize("kind", ["serial", "multiprocess"])
def test_the_sampler_names_the_environment_step_and_field(
    kind: str, mode: str, field: str
) -> None:
    make = SerialSampler if kind == "serial" else functools.partial(MultiprocessSampler,
                                                                    num_processes=2)  # fmt: skip
    with make(task=faulty(mode), num_envs=NUM_ENVS, seed=0) as sampler:
        sampler.reset()
        error = NonFiniteError if kind == "serial" else SamplerProcessError
        with pytest.raises(error) as info:
            for _ in range(20):
                sampler.step(np.zeros(NUM_ENVS, dtype=np.int64))
    message = str(info.value)
    assert f"environment 2 returned a {field} at step 3 of its episode" in message
    if kind == "multiprocess":  # and which worker process, with its pid
        assert f"sampler process 1 (pid {sampler.process_pids[1]}" in message


@pytest.mark.timeout(120)
def test_a_process_collection_worker_names_itself_and_the_environment() -> None:
    spec = CollectionSpec(
        task=faulty("nan_reward"),
        sampler={
            "_target_": "rl.sampling.SerialSampler",
            "_partial_": True,
            "num_envs": NUM_ENVS,
        },  # fmt: skip
        model=MLP,
        seed=0,
    )
    model = build_policy(spec.model, *task_spaces(spec.task))
    settings = worker_settings(backend="process", num_workers=2, compress=False)
    workers = CollectionWorkerSet(spec=spec, model=model, **settings)
    try:
        with pytest.raises(CollectionWorkerError) as info:
            for _ in range(4):
                workers.collect(RolloutRequest(num_steps=8))
    finally:
        workers.close()
    message = str(info.value)
    assert f"collection worker 1 (pid {workers.pids[1]})" in message
    # (the policy's actions end episodes early, so the step of the episode varies)
    assert re.search(
        r"environment 2 returned a non-finite reward \(nan\) at step \d+ of its", message
    )


# ------------------------------------------------------------------------------ losses
class NaNAfter(PPOLoss):
    """PPO whose value loss turns NaN after ``after`` minibatches (a diverging critic)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.calls = after, 0

    def __call__(self, **kwargs: Any) -> Any:
        out = super().__call__(**kwargs)
        self.calls += 1
        if self.calls > self.after:
            out.total = out.total * float("nan")
            out.terms["value_loss"] = float("nan")
        return out


def make_trainer(tmp_path: Path, sampler: SerialSampler, on_nonfinite: str) -> OnPolicyTrainer:
    torch.manual_seed(0)
    model = ActorCritic(observation_space=sampler.observation_space,
                        action_space=sampler.action_space, cnn_channels=[8], trunk_layers=[16],
                        rnn=None)  # fmt: skip
    pipeline = ppo_pipeline(
        named_losses={"ppo": NaNAfter(after=3)},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=128)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=8, num_mini_batch=2, update_repeats=1, save_interval=32,
        metric_accumulate_interval=32, on_nonfinite=on_nonfinite,
    )  # fmt: skip
    return OnPolicyTrainer(
        model=model, pipeline=pipeline,
        collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
        logger=MetricsLogger([]), output_dir=tmp_path, run=RunRecord(config={}), seed=0,
        device="cpu",
    )  # fmt: skip


def test_a_nonfinite_loss_is_an_error_naming_the_term(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=NUM_ENVS, seed=0) as sampler:
        trainer = make_trainer(tmp_path, sampler, "error")
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        with pytest.raises(NonFiniteError, match=r"loss term losses/ppo/value_loss .*=nan"):
            trainer.train()
    # The failing step was not applied: the weights are finite, and only the first 3 steps moved
    # them; every checkpoint on disk is finite.
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    for path in list_checkpoints(tmp_path):
        assert all(torch.isfinite(v).all() for v in load_checkpoint(path)["model"].values())


def test_skip_drops_nonfinite_steps_and_counts_them(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=NUM_ENVS, seed=0) as sampler:
        trainer = make_trainer(tmp_path, sampler, "skip")
        metrics = trainer.train()
    # 128 steps / (4 envs x 8 steps) = 4 rollouts of 2 minibatches; all but the first 3 skipped.
    assert trainer.learner.nonfinite_skips == 8 - 3
    assert metrics["losses/nonfinite_skipped"] == 1.0  # the last interval skipped every step
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    saved = load_checkpoint(latest_checkpoint(tmp_path))
    assert saved["trainer"]["nonfinite_skips"] == 5  # and resumes with the count


def test_nonfinite_weights_are_never_saved(tmp_path: Path) -> None:
    good = save_checkpoint(tmp_path, {"model": {"w": torch.ones(3)}, "config": {}}, 0, 10)
    for poisoned in ({"model": {"w": torch.tensor([1.0, float("nan")])}},
                     {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {
                         "exp_avg": torch.tensor([float("inf")])}}}}):  # fmt: skip
        with pytest.raises(NonFiniteError) as info:
            save_checkpoint(tmp_path, {**poisoned, "config": {}}, 0, 20)
        message = str(info.value)
        assert "ckpt_stage00_step000000000020.pt not written: non-finite values in" in message
        assert f"the previous checkpoint {good} is intact" in message
        assert list_checkpoints(tmp_path) == [good] and latest_checkpoint(tmp_path) == good
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
