"""Every common space: nested observations flattened by key path, Box/MultiDiscrete actions,
their distributions against torch.distributions, clipping, clear errors, and learning.

The learning tests train the toy tasks of :mod:`rl_envs.toys.spaces` through the real engine
(``rl.engine.run.train``) with ``ppo_cartpole``'s settings and a task swapped in.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import open_dict
from small import assert_same_step

import rl.engine.run
from rl.collection import InProcessCollector, RolloutRequest
from rl.models import (
    ActorCritic,
    Categorical,
    DiagGaussian,
    MultiCategorical,
    build_policy,
    policy_input,
)
from rl.sampling import MultiprocessSampler, SerialSampler
from rl.tasks import SpaceError, dict_space, task_spaces
from rl.tasks.spaces import ObservationFlattener

MATCH = {"_target_": "rl_envs.toys.spaces.MatchTargetEnv", "nvec": [3, 4], "max_steps": 4}
CORRIDOR = {"_target_": "rl_envs.toys.spaces.NestedCorridorEnv", "length": 7, "max_steps": 14}
REACH = {"_target_": "rl_envs.toys.spaces.ReachTargetEnv", "dim": 2, "max_steps": 4}
MLP = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [],
       "trunk_layers": [], "rnn": None, "head_layers": [32, 32], "activation": "tanh"}  # fmt: skip


# ------------------------------------------------------------------------ observations
def test_nested_dict_and_tuple_entries_are_flattened_by_key_path() -> None:
    space, actions = task_spaces(CORRIDOR)
    assert list(space.spaces) == ["agent/cell", "goal/0", "goal/1"]
    assert isinstance(space["agent/cell"], gym.spaces.Discrete)
    assert isinstance(space["goal/1"], gym.spaces.Box) and actions == gym.spaces.Discrete(3)
    flatten = ObservationFlattener(gym.spaces.Tuple((gym.spaces.Discrete(2), space)))
    obs = flatten((1, {"agent/cell": 3, "goal/0": 4, "goal/1": np.zeros(1)}))
    assert list(obs) == ["0", "1/agent/cell", "1/goal/0", "1/goal/1"] and obs["0"] == 1
    assert list(dict_space(gym.spaces.Box(0, 1, (2,))).spaces) == ["obs"]


def test_samplers_give_the_flat_entries_bitwise_alike() -> None:
    with (
        SerialSampler(task=CORRIDOR, num_envs=4, seed=5) as serial,
        MultiprocessSampler(task=CORRIDOR, num_envs=4, num_processes=2, seed=5) as mp,
    ):
        a, b = serial.reset(), mp.reset()
        assert set(a["obs"].keys()) == {"agent/cell", "goal/0", "goal/1"}
        assert a["obs", "agent/cell"].dtype == torch.int64 and a["obs", "goal/1"].shape == (4, 1)
        assert_same_step(a, b)
        rng = np.random.default_rng(0)
        for _ in range(30):
            actions = rng.integers(0, 3, 4)
            assert_same_step(serial.step(actions), mp.step(actions))


def test_a_text_entry_is_refused_naming_the_task_the_key_and_the_wrapper() -> None:
    task = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1",
            "wrappers": ["rl_envs.toys.spaces.TextObservation"]}  # fmt: skip
    for build in (lambda: task_spaces(task), lambda: SerialSampler(task=task, num_envs=2)):
        with pytest.raises(SpaceError) as err:
            build()
        message = str(err.value)
        assert message.startswith("task CartPole-v1: observation entry '0' is Text(")
        assert "FilterObservation" in message and "task=minigrid" in message


def test_an_unsupported_action_space_is_refused_naming_the_task() -> None:
    class DictActions(gym.Wrapper):
        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.action_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})

    env = DictActions(gym.make("CartPole-v1"))
    with pytest.raises(SpaceError, match=r"task CartPole-v1: action space Dict\("):
        from rl.tasks.spaces import check_action_space

        check_action_space(env.action_space, "CartPole-v1")
    env.close()


# --------------------------------------------------------------------- distributions
def test_gaussian_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(5, 3, 2, generator=g), torch.randn(2, generator=g)
    ours = DiagGaussian(mean, log_std)
    ref = torch.distributions.Normal(mean, log_std.exp())
    actions = torch.randn(5, 3, 2, generator=g)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(ours.entropy(), ref.entropy().sum(-1))
    assert torch.equal(ours.mode(), mean)
    draws = DiagGaussian(torch.zeros(20000, 2), log_std).sample(g)
    torch.testing.assert_close(draws.std(0), log_std.exp(), rtol=0.03, atol=0)
    assert torch.equal(ours.index(2).mean, mean[2])


def test_categorical_draws_follow_the_softmax_and_never_a_minus_inf_logit() -> None:
    """Gumbel-max draws (Categorical.sample) against the softmax, with a ruled-out action."""
    logits = torch.tensor([0.0, 1.0, -2.0, -torch.inf]).expand(100_000, 4)
    draws = Categorical(logits).sample(torch.Generator().manual_seed(2))
    assert draws.shape == (100_000,) and draws.dtype == torch.long
    freq = torch.bincount(draws, minlength=4).double() / len(draws)
    expected = torch.softmax(logits[0].double(), -1)
    # 5 standard errors of each frequency: a wrong distribution is off by far more.
    tol = 5 * (expected * (1 - expected) / len(draws)).sqrt()
    assert ((freq - expected).abs() <= tol).all(), (freq, expected)
    assert freq[3] == 0
    again = Categorical(logits).sample(torch.Generator().manual_seed(2))
    assert torch.equal(draws, again)  # the generator alone decides
    assert Categorical(torch.zeros(2, 5, 3)).sample().shape == (2, 5)


def test_multi_categorical_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 3, 7, generator=g)
    ours = MultiCategorical(logits, (3, 4))
    refs = [torch.distributions.Categorical(logits=x) for x in logits.split([3, 4], -1)]
    actions = torch.stack([r.sample() for r in refs], -1)
    expected = sum(r.log_prob(actions[..., i]) for i, r in enumerate(refs))
    torch.testing.assert_close(ours.log_prob(actions), expected)
    torch.testing.assert_close(ours.entropy(), sum(r.entropy() for r in refs))
    assert ours.sample(g).shape == (4, 3, 2)
    assert torch.equal(
        ours.mode(), torch.stack([x.argmax(-1) for x in logits.split([3, 4], -1)], -1)
    )


@pytest.mark.parametrize(
    ("action_space", "shape", "dtype"),
    [
        (gym.spaces.Discrete(5), (6,), torch.long),
        (gym.spaces.MultiDiscrete([3, 4]), (6, 2), torch.long),
        (gym.spaces.Box(-1, 1, (3,), dtype=np.float32), (6, 3), torch.float32),
    ],
)
def test_the_policy_acts_in_every_supported_action_space(action_space, shape, dtype) -> None:
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (4,), dtype=np.float32),
                             "m": gym.spaces.MultiDiscrete([2, 3]),
                             "b": gym.spaces.MultiBinary(3)})  # fmt: skip
    policy = build_policy(MLP, space, action_space)
    obs = {
        "x": torch.rand(6, 4),
        "m": torch.tensor([[1, 2]] * 6),
        "b": torch.ones(6, 3, dtype=torch.int8),
    }
    starts = torch.ones(6, dtype=torch.bool)
    step = policy.act(policy_input(obs, starts, policy.initial_state(6, "cpu")))
    assert step["actions"].shape == shape and step["actions"].dtype == dtype
    assert step["logprobs"].shape == step["values"].shape == (6,)
    mode = policy.act(
        policy_input(obs, starts, policy.initial_state(6, "cpu")), deterministic=True
    )
    out, _ = policy(
        {k: v[None] for k, v in obs.items()}, starts[None], policy.initial_state(6, "cpu")
    )
    assert torch.equal(mode["actions"], out.dist.mode()[0])
    torch.testing.assert_close(out.dist.log_prob(step["actions"][None])[0], step["logprobs"])


def test_a_users_class_that_is_not_a_policy_is_refused_naming_the_key() -> None:
    space, actions = task_spaces(REACH)
    with pytest.raises(
        TypeError, match=r"model._target_='tests.test_spaces.not_a_policy' built a"
    ):
        build_policy(
            {"_target_": "tests.test_spaces.not_a_policy", "_partial_": True}, space, actions
        )


def not_a_policy(observation_space: gym.Space, action_space: gym.Space) -> torch.nn.Module:
    return torch.nn.Identity()


# ------------------------------------------------------------------------ Box actions
def test_box_actions_reach_the_environment_clipped_and_are_stored_unclipped() -> None:
    """ReachTargetEnv raises on an action outside [-2, 2]; a wide Gaussian draws many."""
    space, actions = task_spaces(REACH)
    torch.manual_seed(0)
    policy = ActorCritic(observation_space=space, action_space=actions, cnn_channels=[],
                         trunk_layers=[8], rnn=None, log_std_init=1.5)  # fmt: skip
    for sampler in (
        SerialSampler(task=REACH, num_envs=4, seed=0),
        MultiprocessSampler(task=REACH, num_envs=4, num_processes=2, seed=0),
    ):
        collector = InProcessCollector(model=policy, sampler=sampler, device="cpu")
        try:
            rollout = collector.collect(RolloutRequest(num_steps=16))
        finally:
            collector.close()
        storage = rollout.storage
        stored = storage["actions"][:16]
        assert stored.shape == (16, 4, 2) and stored.dtype == torch.float32
        assert (stored.abs() > 2).any(), "the test needs draws outside the bounds"
        # The stored log-probabilities are of the unclipped draws.
        with torch.no_grad():
            out, _ = policy(
                {"obs": storage["obs", "obs"][:16]},
                storage["episode_starts"][:16],
                policy.initial_state(4, "cpu"),
            )
        torch.testing.assert_close(out.dist.log_prob(stored), storage["logprobs"][:16])
        # The environment got clipped actions: -mean |clip(a) - target| >= -3.
        assert (storage["rewards"][:16] >= -3.0).all()


@pytest.mark.parametrize("task", [MATCH, CORRIDOR, REACH], ids=["multidiscrete", "nested", "box"])
def test_probe_videos_and_the_inference_agent_act_in_every_space(task: dict, tmp_path) -> None:
    from rl.checkpoints import save_checkpoint
    from rl.checkpoints.errors import UntrustedCheckpointError
    from rl.evaluation import InferenceAgent
    from rl.evaluation.video import record_episode, rendering_sampler
    from rl.tasks import build_env

    policy = build_policy(MLP, *task_spaces(task))
    with rendering_sampler(task, seed=3) as sampler:
        frames, metrics = record_episode(model=policy, sampler=sampler, device="cpu")
    assert len(frames) == metrics["length"] + 1 and frames[0].ndim == 3
    assert "success" in metrics
    env = build_env(task, render_mode="rgb_array")
    config = {"task": task, "model": MLP}
    path = save_checkpoint(tmp_path, {"model": policy.state_dict(), "config": config}, 0, 0)
    # Saved by a script, not from conf/: the user names the task and model it was made with.
    with pytest.raises(UntrustedCheckpointError, match="task._target_"):
        InferenceAgent.from_checkpoint(path)
    trusted = [task["_target_"], MLP["_target_"]]
    agent = InferenceAgent.from_checkpoint(path, deterministic=True, trusted_targets=trusted)
    obs, _ = env.reset(seed=4)
    for _ in range(6):
        action = agent.act(obs)
        assert env.action_space.contains(action), action
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
            agent.reset()
    env.close()


# ------------------------------------------------------------------------- learning
def _train_toy(
    compose_cfg, task: dict, steps: int, stop_at: str, overrides: list[str] = ()
) -> dict:
    """``steps`` is an upper bound, as in test_learning.py: the stage ends once the metric
    ``stop_at`` reaches its value (a training metric: of sampled actions over the last 2048 env
    steps; ``eval/*``: of an evaluation every 4096 env steps), from 8192 env steps on."""
    metric, threshold = stop_at.split(">=")
    cfg = compose_cfg(
        [
            "+experiment=ppo_cartpole",
            f"total_env_steps={steps}",
            "eval.num_episodes=100",
            "torch_threads=1",
            "logger.sinks.console.progress_bar=false",
            "+pipeline.stages.0.early_stopping_criterion={_target_:rl.pipeline.MetricThresholdCriterion,"
            f"metric:{metric},threshold:{threshold},min_stage_steps:8192}}",
            "pipeline.metric_accumulate_interval=2048",
            *overrides,
        ]  # fmt: skip
    )
    with open_dict(cfg):
        cfg.task = task
    return rl.engine.run.train(cfg)


@pytest.mark.slow
@pytest.mark.learning
def test_multidiscrete_actions_learn(compose_cfg) -> None:
    # Stops at 14k-25k env steps over seed offsets 0-2, evaluated at 0.95-0.97.
    metrics = _train_toy(
        compose_cfg,
        MATCH,
        30_000,
        "charts/success>=0.97",
        ["pipeline.named_losses.ppo.entropy_coef=0.01"],
    )
    assert metrics["eval/success"] >= 0.9, metrics  # a random policy matches 1/12 of the time


@pytest.mark.slow
@pytest.mark.learning
def test_nested_dict_and_tuple_observations_learn(compose_cfg) -> None:
    # Stops at the first check (8,192 env steps) over seed offsets 0-6, evaluated at 0.95-1.0.
    # (With the goal's offset scaled by the corridor's length, offsets 3 and 6 stalled at 0.83.)
    metrics = _train_toy(compose_cfg, CORRIDOR, 40_000, "charts/success>=0.97")
    assert metrics["eval/success"] >= 0.9, metrics  # a random policy: about 0.1


@pytest.mark.slow
@pytest.mark.learning
def test_box_actions_learn(compose_cfg) -> None:
    # Sampled actions stay far from the target (the Gaussian's spread: -0.75 at 40k steps) while
    # the mean action is already close, so the stop judges the deterministic evaluation itself,
    # every 4096 steps, with a margin over the threshold below: over seed offsets 0-2 it stopped
    # at 8k-12k env steps at -0.15 to -0.20 (the full 40k ended at -0.08 on offset 0).
    metrics = _train_toy(
        compose_cfg,
        REACH,
        40_000,
        "eval/episodic_return>=-0.2",
        ["eval.deterministic=true", "eval.interval=4096"],
    )
    # The mean action within 0.1 of the target on average; a random policy: about -4 x 0.9.
    assert metrics["eval/episodic_return"] >= -0.4, metrics


def test_probe_video_frames_carry_a_caption() -> None:
    from rl.evaluation.video import record_episode, rendering_sampler

    policy = build_policy(MLP, *task_spaces(MATCH))
    sampler = rendering_sampler(MATCH, seed=3)
    plain, metrics = record_episode(
        model=policy, sampler=sampler, generator=torch.Generator().manual_seed(0), device="cpu"
    )
    # The same sampler plays the same episode again (what a probe video each interval does).
    captioned, again = record_episode(
        model=policy,
        sampler=sampler,
        generator=torch.Generator().manual_seed(0),
        captions=True,
        device="cpu",
    )
    sampler.close()
    assert again == metrics and len(captioned) == len(plain)
    h, w = plain[0].shape[:2]
    scale = -(-320 // w)
    for frame, raw in zip(captioned, plain, strict=True):
        assert frame.shape == (h * scale + 32, w * scale, 3)  # enlarged, two caption lines
        assert (frame[: h * scale : scale, ::scale] == raw).all()
        assert frame[h * scale :].any()  # text on the strip
    assert not (captioned[0][h * scale :] == captioned[-1][h * scale :]).all()
