"""Observation and reward normalisation owned by the collector.

Statistics against numpy over the same data, frozen within a rollout, exact resume, one
synchronous collection worker bitwise like in-process collection, the checkpoint's statistics
reused by ``evaluate.py`` and ``InferenceAgent``, and DDP ranks holding the same statistics.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from pipelines import ppo_pipeline
from test_resume import StopAt

from rl.checkpoints import latest_checkpoint, load_checkpoint
from rl.collection import InProcessCollector, RolloutRequest
from rl.collection.normalization import Normalizer, NormalizeSettings, RunningMeanStd
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic, policy_input
from rl.pipeline import PipelineStage
from rl.sampling import SerialSampler
from rl.tasks import build_env, task_spaces
from rl.training import OnPolicyTrainer

PENDULUM = {"_target_": "rl.tasks.make_gym_env", "env_id": "Pendulum-v1"}
ON = NormalizeSettings(observations=True, rewards=True, clip=10.0, gamma=0.9, epsilon=1e-8)
# ppo_continuous, tiny: 4 envs x 16 steps, 256 env steps.
SMOKE = ["+experiment=ppo_continuous", "+debug=smoke", "pipeline.num_mini_batch=4",
         "eval.num_episodes=2"]  # fmt: skip


def test_running_statistics_match_numpy_over_the_concatenated_batches() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) for n in (5, 17, 1, 40)]
    stats = RunningMeanStd((3,))
    for b in batches:
        stats.merge(len(b), torch.from_numpy(b.mean(0)), torch.from_numpy(b.var(0)))
    data = np.concatenate(batches)
    # The initial pseudo-count (1e-4 of mean 0, variance 1) weighs almost nothing.
    np.testing.assert_allclose(stats.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var.numpy(), data.var(0), rtol=1e-4)
    assert stats.count == pytest.approx(len(data), abs=1e-3)


def test_statistics_are_frozen_within_a_rollout_and_merged_after_it() -> None:
    space = gym.spaces.Dict({"x": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                             "img": gym.spaces.Box(0, 255, (2, 2, 3), np.uint8)})  # fmt: skip
    norm = Normalizer(space, ON)
    assert norm.obs_keys == ["x"]  # byte images are not normalised
    raw = {"x": torch.tensor([[4.0, -2.0], [6.0, 2.0]]), "img": torch.ones(2, 2, 2, 3)}
    before = norm.observations(raw)
    torch.testing.assert_close(before["x"], raw["x"], atol=1e-3, rtol=0)  # mean 0, var 1
    assert before["img"] is raw["img"]
    norm.record_observations(raw)
    torch.testing.assert_close(norm.observations(raw)["x"], before["x"])  # frozen
    norm.commit()
    after = norm.observations(raw)["x"]
    torch.testing.assert_close(after, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-3, rtol=0)
    far = norm.observations({"x": torch.tensor([[1e6, 0.0]]), "img": raw["img"][:1]})["x"]
    assert far[0, 0] == 10.0  # clipped


def test_rewards_are_scaled_by_the_std_of_the_discounted_return() -> None:
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (1,), np.float32)})
    norm = Normalizer(space, ON)
    returns = torch.zeros(2, dtype=torch.float64)
    done = torch.tensor([False, True])
    scaled, returns = norm.rewards(torch.tensor([2.0, 4.0]), returns, done, None)
    torch.testing.assert_close(scaled, torch.tensor([2.0, 4.0]), atol=1e-3, rtol=0)
    assert returns.tolist() == [2.0, 0.0]  # the ended episode's return restarts
    no = torch.tensor([False, False])
    scaled, returns = norm.rewards(torch.tensor([1.0, 1.0]), returns, no, 0.5)  # 0.9 pinned
    assert returns.tolist() == [2.0 * 0.9 + 1.0, 1.0]
    norm.commit()
    seen = np.array([2.0, 4.0, 2.8, 1.0])  # the returns counted, before their resets
    std = np.sqrt(((seen - seen.mean()) ** 2).mean())
    scaled, _ = norm.rewards(torch.tensor([1.0, 1.0]), returns, no, None)
    torch.testing.assert_close(scaled, torch.full((2,), 1.0 / std), rtol=1e-3, atol=0)


def test_the_stages_discount_scales_rewards_unless_normalize_names_one() -> None:
    """normalize.gamma null: the return accumulates with the discount the rollout request
    carries (the current stage's); a number pins it; neither is an error."""
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (1,), np.float32)})
    follow = Normalizer(space, dataclasses.replace(ON, gamma=None))
    returns, no = torch.ones(1, dtype=torch.float64), torch.tensor([False])
    assert follow.rewards(torch.ones(1), returns, no, 0.5)[1].item() == 1.5
    assert Normalizer(space, ON).rewards(torch.ones(1), returns, no, 0.5)[1].item() == 1.9
    with pytest.raises(ValueError, match="normalize.gamma"):
        follow.rewards(torch.ones(1), returns, no, None)


def _mlp(sampler: SerialSampler) -> ActorCritic:
    return ActorCritic(observation_space=sampler.observation_space,
                       action_space=sampler.action_space, cnn_channels=[], trunk_layers=[],
                       rnn=None, head_layers=[16])  # fmt: skip


def _return_stats(normalize_gamma: float | None, request_gamma: float) -> RunningMeanStd:
    """The return statistics after one 16-step Pendulum rollout collected in process."""
    with SerialSampler(task=PENDULUM, num_envs=4, seed=3) as sampler:
        torch.manual_seed(0)
        space = sampler.observation_space
        model = _mlp(sampler)
        settings = dataclasses.replace(ON, gamma=normalize_gamma)
        collector = InProcessCollector(
            model=model, sampler=sampler, normalizer=Normalizer(space, settings), device="cpu"
        )
        collector.collect(RolloutRequest(num_steps=16, gamma=request_gamma))
        assert collector.normalizer is not None
        return collector.normalizer.return_stats


def test_a_rollout_requests_discount_reaches_reward_normalisation() -> None:
    followed = _return_stats(None, 0.5)
    pinned = _return_stats(0.5, 0.99)  # normalize.gamma wins over the request's
    other = _return_stats(None, 0.99)
    assert torch.equal(followed.var, pinned.var) and followed.count == pinned.count
    assert not torch.equal(followed.var, other.var)


def test_each_stage_asks_for_rollouts_with_its_own_discount(tmp_path: Path) -> None:
    """A stage's gamma (a PipelineStage override) travels with its rollout requests."""
    with SerialSampler(task=PENDULUM, num_envs=4, seed=3) as sampler:
        space = sampler.observation_space
        model = _mlp(sampler)
        pipeline = ppo_pipeline(
            named_losses={"ppo": PPOLoss()},
            stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=64),
                    PipelineStage(loss_names=["ppo"], max_stage_steps=64, gamma=0.5)],
            num_steps=16, gamma=0.9, save_interval=1_000,
        )  # fmt: skip
        normalizer = Normalizer(space, dataclasses.replace(ON, gamma=None))
        collector = InProcessCollector(
            model=model, sampler=sampler, normalizer=normalizer, device="cpu"
        )
        seen: list[float | None] = []
        collect = collector.collect

        def recording(request: RolloutRequest) -> Any:
            seen.append(request.gamma)
            return collect(request)

        collector.collect = recording  # type: ignore[method-assign]
        OnPolicyTrainer(model=model, pipeline=pipeline, collector=collector,
                        logger=MetricsLogger([]), output_dir=tmp_path, seed=0,
                        device="cpu").train()  # fmt: skip
    assert seen == [0.9, 0.5], seen


def _trainer(tmp_path: Path, sampler: SerialSampler, callbacks=()) -> OnPolicyTrainer:
    torch.manual_seed(0)
    space = sampler.observation_space
    model = _mlp(sampler)
    pipeline = ppo_pipeline(
        named_losses={"ppo": PPOLoss(entropy_coef=0.0)},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=192)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=16, num_mini_batch=4, recurrence=1, update_repeats=2, save_interval=64,
    )  # fmt: skip
    collector = InProcessCollector(
        model=model, sampler=sampler, normalizer=Normalizer(space, ON), device="cpu"
    )
    return OnPolicyTrainer(model=model, pipeline=pipeline, collector=collector,
                           logger=MetricsLogger([]), output_dir=tmp_path, seed=0,
                           callbacks=list(callbacks), device="cpu")  # fmt: skip


def test_an_interrupted_normalised_run_resumes_exactly(tmp_path: Path) -> None:
    with SerialSampler(task=PENDULUM, num_envs=4, seed=3) as sampler:
        reference = _trainer(tmp_path / "a", sampler)
        reference.train()
    with SerialSampler(task=PENDULUM, num_envs=4, seed=3) as sampler:
        stopped = _trainer(tmp_path / "b", sampler, [StopAt(64)])
        stopped.train()
    saved = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert saved["normalizer"]["obs"]["obs"]["count"] == pytest.approx(64, abs=1e-3)
    assert saved["rollout"]["returns"].dtype == torch.float64
    with SerialSampler(task=PENDULUM, num_envs=4, seed=3) as sampler:
        resumed = _trainer(tmp_path / "b", sampler)
        resumed.load_state_dict(saved)
        resumed.train()
    for k, v in reference.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    a, b = reference.collector.normalizer, resumed.collector.normalizer
    assert torch.equal(a.obs_stats["obs"].mean, b.obs_stats["obs"].mean)
    assert torch.equal(a.return_stats.var, b.return_stats.var)


def _final(run_dir: Path) -> dict[str, Any]:
    return load_checkpoint(latest_checkpoint(run_dir))


def test_one_sync_worker_normalises_bitwise_like_in_process_collection(
    compose_cfg: Any, tmp_path: Path
) -> None:
    run.train(compose_cfg([*SMOKE, f"output_dir={tmp_path / 'local'}"], set_output_dir=False))
    workers = ["collector=process", "collector.num_workers=1", "collector.mode=sync"]
    run.train(
        compose_cfg([*SMOKE, *workers, f"output_dir={tmp_path / 'w'}"], set_output_dir=False)
    )
    local, worker = _final(tmp_path / "local"), _final(tmp_path / "w")
    for k, v in local["model"].items():
        assert torch.equal(v, worker["model"][k]), k
    for part in ("mean", "var"):
        assert torch.equal(local["normalizer"]["obs"]["obs"][part],
                           worker["normalizer"]["obs"]["obs"][part])  # fmt: skip
        assert torch.equal(
            local["normalizer"]["return"][part], worker["normalizer"]["return"][part]
        )
    assert local["normalizer"]["obs"]["obs"]["count"] == pytest.approx(256, abs=1e-3)


def test_evaluation_and_the_inference_agent_reuse_the_saved_statistics(
    compose_cfg: Any, tmp_path: Path
) -> None:
    """The agent normalises as the engine does: the same deterministic actions, step by step,
    as the policy on observations normalised with the checkpoint's statistics."""
    run.train(compose_cfg([*SMOKE, "total_env_steps=512"]))
    path = latest_checkpoint(tmp_path / "run")
    state = load_checkpoint(path)
    agent = InferenceAgent.from_checkpoint(path, deterministic=True)
    assert agent.normalizer is not None
    space, actions = task_spaces(PENDULUM)
    norm = Normalizer.from_state(space, state["normalizer"])
    env = build_env(PENDULUM)
    obs, _ = env.reset(seed=5)
    agent.reset()
    policy = agent.model
    for _ in range(20):
        action = agent.act(obs)
        x = norm.observations({"obs": torch.as_tensor(obs)[None]})
        start, state = torch.zeros(1, dtype=torch.bool), policy.initial_state(1, "cpu")
        step = policy.act(policy_input(x, start, state), deterministic=True)
        expected = np.clip(step["actions"][0].numpy(), actions.low, actions.high)
        np.testing.assert_array_equal(action, expected)
        obs, *_ = env.step(action)
    env.close()
    # evaluate.py on the run folder evaluates with the same statistics: the result of the
    # final evaluation during training is reproduced.
    cfg = compose_cfg([f"ckpt={path}", "num_episodes=2", f"output_dir={tmp_path}/e",
                       "deterministic=true"], config_name="evaluate")  # fmt: skip
    metrics = run.evaluate(cfg)
    assert np.isfinite(metrics["eval/episodic_return"])


@pytest.mark.slow
def test_ddp_ranks_merge_every_ranks_moments(compose_cfg: Any, tmp_path: Path) -> None:
    overrides = [*SMOKE, "distributed=ddp", "distributed.world_size=2"]
    run.train(compose_cfg(overrides))
    saved = _final(tmp_path / "run")
    # The budget counts both ranks' steps (2 x 4 envs x 32 steps): every rank summed both
    # ranks' moments each rollout, so rank 0 counted all 256 observations, not its own 128.
    assert saved["normalizer"]["obs"]["obs"]["count"] == pytest.approx(256, abs=1e-3)
