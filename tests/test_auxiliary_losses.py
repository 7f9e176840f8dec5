"""Auxiliary losses: values and gradients on hand-built batches, binding, checkpoints, training.

Unit tests build a minibatch and the policy features by hand and compare each loss with a
computation written out here; the end-to-end tests train through the engine and check that each
loss's own objective improves while PPO trains, and that a run with auxiliary heads resumes
bitwise.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from pipelines import ppo_pipeline
from small import SMALL
from tensordict import TensorDict

import rl.engine.run
from rl.checkpoints.files import latest_checkpoint, list_checkpoints, load_checkpoint
from rl.collection import InProcessCollector
from rl.loggers import MetricsLogger
from rl.losses import (
    CPCALoss,
    DepthPredictionLoss,
    InverseDynamicsLoss,
    PPOLoss,
    bind_losses,
)
from rl.losses.auxiliary import probe_features, same_episode
from rl.models import ActorCritic
from rl.models.policy import PolicyOutput
from rl.pipeline import PipelineStage
from rl.sampling import SerialSampler
from rl.training import Callback, OnPolicyTrainer, RolloutInfo, RunRecord

NO_SPACE = gym.spaces.Dict({})


def _output(**features: torch.Tensor) -> PolicyOutput:
    return PolicyOutput(dist=None, values=None, extras=features)  # type: ignore[arg-type]


def test_same_episode_marks_the_steps_ahead_in_the_same_episode() -> None:
    starts = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 1]], dtype=torch.bool)  # [T=4, n=2]
    got = same_episode(starts, 2)  # [T, K, n]
    expected = torch.zeros(4, 2, 2, dtype=torch.bool)
    # env 0: episodes {0, 1}, {2, 3}; env 1: {0, 1, 2}, {3}
    expected[0, 0, 0] = True  # 0 -> 1
    expected[2, 0, 0] = True  # 2 -> 3
    expected[0, 0, 1] = expected[0, 1, 1] = expected[1, 0, 1] = True  # 0 -> 1, 2; 1 -> 2
    assert torch.equal(got, expected)


# ------------------------------------------------------------------ inverse dynamics
def test_inverse_dynamics_value_and_gradient_by_hand() -> None:
    loss = InverseDynamicsLoss(feature="visual", hidden_size=0)  # linear: logits by hand
    loss.bind(
        features={"visual": 2}, observation_space=NO_SPACE, action_space=gym.spaces.Discrete(2)
    )
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])  # [W_now; W_after]
    with torch.no_grad():
        loss.pair_layer.weight.copy_(w)
        loss.pair_layer.bias.zero_()
    phi = torch.tensor(
        [[[1.0, 0.0], [0.0, 2.0]], [[0.0, 1.0], [1.0, 1.0]], [[2.0, 2.0], [3.0, 0.0]]],
        requires_grad=True,
    )  # [T=3, n=2, F=2]
    starts = torch.tensor([[1, 1], [0, 0], [0, 1]], dtype=torch.bool)  # env 1 restarts at t=2
    actions = torch.tensor([[0, 1], [1, 0], [0, 0]])
    batch = TensorDict({"episode_starts": starts, "actions": actions}, batch_size=[3, 2])
    out = loss(batch=batch, output=_output(visual=phi), step_count=0)

    # Pairs (t, env): (0, 0), (1, 0), (0, 1); logits = phi_t[:2] - phi_{t+1}[:2] per component.
    pairs = [(0, 0), (1, 0), (0, 1)]
    total, grad = 0.0, torch.zeros(3, 2, 2)
    for t, e in pairs:
        logits = phi[t, e].detach() - phi[t + 1, e].detach()
        p = torch.softmax(logits, 0)
        a = int(actions[t, e])
        total -= math.log(float(p[a]))
        d = p.clone()
        d[a] -= 1.0  # dCE/dlogits
        grad[t, e] += d / len(pairs)
        grad[t + 1, e] -= d / len(pairs)
    assert out.total.item() == pytest.approx(total / len(pairs), rel=1e-6)
    out.total.backward()
    assert torch.allclose(phi.grad, grad, atol=1e-6)
    assert phi.grad[2, 1].abs().sum() == 0  # the step after the restart is in no pair


def test_inverse_dynamics_without_pairs_is_zero_with_zero_gradients() -> None:
    loss = InverseDynamicsLoss()
    loss.bind(
        features={"visual": 3}, observation_space=NO_SPACE, action_space=gym.spaces.Discrete(4)
    )
    phi = torch.randn(2, 2, 3, requires_grad=True)
    batch = TensorDict(
        {"episode_starts": torch.ones(2, 2, dtype=torch.bool), "actions": torch.zeros(2, 2)},
        batch_size=[2, 2],
    )
    out = loss(batch=batch, output=_output(visual=phi), step_count=0)
    out.total.backward()
    assert out.total.item() == 0.0 and phi.grad.abs().sum() == 0


# ------------------------------------------------------------------------------ CPC|A
def _cpca_reference(
    loss: CPCALoss, batch: TensorDict, phi: torch.Tensor, belief: torch.Tensor, drawn: torch.Tensor
) -> torch.Tensor:
    """CPC|A by loops: the action GRU one step at a time from each belief, one pair at a time."""
    t_len, n, _ = phi.shape
    starts, actions = batch["episode_starts"], batch["actions"]
    cell = torch.nn.GRUCell(loss.action_rnn.input_size, loss.action_rnn.hidden_size)
    cell.load_state_dict(
        {k.replace("_l0", ""): v for k, v in loss.action_rnn.state_dict().items()}
    )

    def score(z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(loss.z_layer(z) + loss.phi_layer(target))
        return loss.out_layer(hidden)[0]

    flat = phi.reshape(t_len * n, -1)
    pos, neg = [], []
    for t in range(t_len):
        for e in range(n):
            h = belief[t, e].unsqueeze(0)
            for k in range(1, min(loss.horizon, t_len - 1) + 1):
                if t + k >= t_len or bool(starts[t + 1 : t + k + 1, e].any()):
                    break  # t + k is past the sequence or in a later episode
                h = cell(loss.action_embed(actions[t + k - 1, e].long().view(1)), h)
                pos.append(score(h[0], phi[t + k, e]))
                for m in range(loss.num_negatives):
                    neg.append(score(h[0], flat[drawn[m, t, k - 1, e]]))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    pos_t, neg_t = torch.stack(pos), torch.stack(neg)
    return bce(pos_t, torch.ones_like(pos_t)) + bce(neg_t, torch.zeros_like(neg_t))


def test_cpca_matches_a_loop_reference_and_masks_other_episodes() -> None:
    torch.manual_seed(0)
    t_len, n, f, h = 5, 3, 4, 6
    loss = CPCALoss(horizon=3, num_negatives=2, action_embed_dim=5, hidden_size=7)
    loss.bind(
        features={"visual": f, "belief": h},
        observation_space=NO_SPACE,
        action_space=gym.spaces.Discrete(3),
    )
    phi = torch.randn(t_len, n, f, requires_grad=True)
    belief = torch.randn(t_len, n, h, requires_grad=True)
    starts = torch.zeros(t_len, n, dtype=torch.bool)
    starts[0] = True
    starts[2, 1] = True  # env 1: episodes {0, 1}, {2, 3, 4}
    starts[1, 2] = True  # env 2: episodes {0}, {1, ..., 4}
    batch = TensorDict(
        {"episode_starts": starts, "actions": torch.randint(3, (t_len, n))}, batch_size=[t_len, n]
    )
    torch.manual_seed(7)
    out = loss(batch=batch, output=_output(visual=phi, belief=belief), step_count=0)
    torch.manual_seed(7)  # the same negatives as the loss drew
    drawn = torch.randint(t_len * n, (2, t_len, 3, n))
    reference = _cpca_reference(loss, batch, phi, belief, drawn)
    assert out.total.item() == pytest.approx(reference.item(), rel=1e-5)
    out.total.backward()
    grads = belief.grad.abs().sum(-1)  # [T, n]
    # No step ahead in the same episode: the last step, env 1 at t=1, env 2 at t=0.
    assert grads[t_len - 1].sum() == 0 and grads[1, 1] == 0 and grads[0, 2] == 0
    assert (grads[:-1, 0] > 0).all()


# --------------------------------------------------------------------------- depth
def test_depth_prediction_value_and_gradient_by_hand() -> None:
    space = gym.spaces.Dict({"depth": gym.spaces.Box(0.0, 4.0, (4, 4, 1), np.float32)})
    loss = DepthPredictionLoss(key="depth", feature="visual", size=(2, 2))
    loss.bind(features={"visual": 3}, observation_space=space, action_space=gym.spaces.Discrete(2))
    with torch.no_grad():  # the decoder predicts its bias: 0.25 everywhere
        loss.decoder[0].weight.zero_()
        loss.decoder[0].bias.fill_(0.25)
    depth = torch.zeros(1, 1, 4, 4, 1)
    depth[0, 0, :2, :2] = 4.0  # top-left quadrant at the maximum depth: 1.0 scaled
    depth[0, 0, 2:, 2:] = 2.0  # bottom-right: 0.5
    batch = TensorDict({"obs": {"depth": depth}}, batch_size=[1, 1])
    out = loss(batch=batch, output=_output(visual=torch.zeros(1, 1, 3)), step_count=0)
    # Pooled targets 1.0, 0.0, 0.0, 0.5 against 0.25: |0.75| + 0.25 + 0.25 + 0.25, mean 0.375.
    assert out.total.item() == pytest.approx(0.375)
    out.total.backward()
    expected = torch.tensor([-1.0, 1.0, 1.0, -1.0]) / 4  # d mean|p - y| / dp: sign / 4
    assert torch.allclose(loss.decoder[0].bias.grad, expected)


# ------------------------------------------------------------------------- binding
def test_binding_errors_name_the_loss_and_what_is_missing() -> None:
    discrete = gym.spaces.Discrete(3)
    with pytest.raises(ValueError, match=r"InverseDynamicsLoss: feature='visual'.*embedding"):
        InverseDynamicsLoss().bind(
            features={"embedding": 4, "belief": 4},
            observation_space=NO_SPACE,
            action_space=discrete,
        )
    with pytest.raises(ValueError, match=r"CPCALoss: needs a Discrete action space"):
        CPCALoss().bind(
            features={"visual": 4, "belief": 4},
            observation_space=NO_SPACE,
            action_space=gym.spaces.Box(-1, 1, (2,)),
        )
    with pytest.raises(ValueError, match=r"no depth image 'depth'.*task.depth=true"):
        DepthPredictionLoss().bind(
            features={"visual": 4}, observation_space=NO_SPACE, action_space=discrete
        )
    unbound = InverseDynamicsLoss()
    with pytest.raises(RuntimeError, match="bind it to the policy first"):
        unbound(batch=TensorDict({}, []), output=_output(), step_count=0)


def test_actor_critic_features_and_ignored_keys() -> None:
    space = gym.spaces.Dict(
        {
            "rgb": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8),
            "depth": gym.spaces.Box(0.0, 5.0, (12, 12, 1), np.float32),
            "goal": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        }
    )
    kwargs = dict(
        action_space=gym.spaces.Discrete(4),
        cnn_channels=[4],
        cnn_kernels=[3],
        cnn_strides=[3],
        image_encoding="scale",
        trunk_layers=[16],
        rnn_hidden_size=8,
    )
    both = ActorCritic(observation_space=space, **kwargs)
    rgb_only = ActorCritic(observation_space=space, ignore_keys=["depth"], **kwargs)
    assert probe_features(both, space) == {"visual": 2 * 4 * 4 * 4, "embedding": 16, "belief": 8}
    assert probe_features(rgb_only, space) == {"visual": 4 * 4 * 4, "embedding": 16, "belief": 8}
    with pytest.raises(ValueError, match=r"model.ignore_keys: \['dpeth'\] are not observation"):
        ActorCritic(observation_space=space, ignore_keys=["dpeth"], **kwargs)


# ---------------------------------------------------------------- end to end, resume


class _StopAt(Callback):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        if info.total_steps >= self.steps:
            trainer.request_stop("test")


def _trainer(path: Path, sampler: SerialSampler, callbacks=()) -> OnPolicyTrainer:
    torch.manual_seed(0)
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        trunk_layers=[32],
        rnn="gru",
        rnn_hidden_size=16,
    )
    pipeline = ppo_pipeline(
        named_losses={
            "ppo": PPOLoss(),
            "id": InverseDynamicsLoss(hidden_size=16),
            "cpca": CPCALoss(horizon=2, hidden_size=16),
        },
        stages=[
            PipelineStage(
                loss_names=["ppo", "id", "cpca"],
                loss_weights=[1.0, 0.1, 0.1],
                max_stage_steps=128,  # 4 rollouts: stopped after 2, resumed for the other 2
            )
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=8,
        num_mini_batch=2,
        update_repeats=2,
        save_interval=32,
        metric_accumulate_interval=64,
    )
    bind_losses(pipeline.used_losses, model, sampler.observation_space, sampler.action_space)
    return OnPolicyTrainer(
        model=model,
        pipeline=pipeline,
        collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
        logger=MetricsLogger([]),
        output_dir=path,
        run=RunRecord(config={"note": "test"}),
        callbacks=list(callbacks),
        device="cpu",
    )


def test_a_run_with_auxiliary_heads_resumes_bitwise(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        reference = _trainer(tmp_path / "a", sampler)
        reference.train()
    for stop in (64, None):
        with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
            trainer = _trainer(tmp_path / "b", sampler, [_StopAt(stop)] if stop else [])
            found = list_checkpoints(tmp_path / "b")
            if found:
                trainer.load_state_dict(load_checkpoint(found[-1]))
            trainer.train()
    heads = reference.learner.losses_state_dict()
    assert set(heads) == {"id", "cpca"}  # PPO owns no parameters
    resumed = trainer.learner.losses_state_dict()
    for name in heads:
        for key, value in heads[name].items():
            assert torch.equal(value, resumed[name][key]), (name, key)
    for (key, a), b in zip(
        reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), key
    assert (
        reference.last_metrics["losses/cpca/cpca_loss"]
        == trainer.last_metrics["losses/cpca/cpca_loss"]
    )


def _logged(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows if key in row]


@pytest.mark.slow
@pytest.mark.learning
def test_inverse_dynamics_and_cpca_train_end_to_end(compose_cfg, tmp_path: Path) -> None:
    """pipeline=ppo_aux on nav_small: each head learns its task while PPO trains.

    Over seeds 1-4, from the first 4,096 steps to the last of 40,960: inverse dynamics went from
    about 0.5 to 0.99 accuracy, CPC|A's accuracy rose by 0.13-0.19 and its loss fell by 0.17-0.28
    (at half this budget the rises were 0.07-0.09 against a threshold of 0.05).
    """
    cfg = compose_cfg(
        [
            "+experiment=ppo_nav",
            "task=nav_small",
            "pipeline=ppo_aux",
            "total_env_steps=40960",
            "pipeline.metric_accumulate_interval=4096",
            "eval.num_episodes=0",
            "logger.sinks.console.progress_bar=false",
        ]
    )
    rl.engine.run.train(cfg)
    run_dir = tmp_path / "run"
    inverse = _logged(run_dir, "losses/inverse_dynamics/accuracy")
    cpca = _logged(run_dir, "losses/cpca/accuracy")
    cpca_loss = _logged(run_dir, "losses/cpca/cpca_loss")
    # Actions of pairs: forward, left, right (STOP ends the episode): chance is about 1/3.
    assert inverse[0] < 0.7 and inverse[-1] > 0.9, inverse
    # CPC|A tells real future steps from others: chance is 0.5.
    assert cpca[-1] > cpca[0] + 0.07 and cpca_loss[-1] < cpca_loss[0] - 0.08, (cpca, cpca_loss)
    saved = load_checkpoint(latest_checkpoint(run_dir))
    assert set(saved["losses"]) == {"inverse_dynamics", "cpca"}
    assert "pair_layer.weight" in saved["losses"]["inverse_dynamics"]
    assert "action_rnn.weight_hh_l0" in saved["losses"]["cpca"]


def _depth_errors(run_dir: Path, task: dict, num_steps: int = 256) -> tuple[float, float]:
    """The trained depth head's L1 error on a fixed set of views, and the error of the best
    blind guess (each pixel's median depth over those same views).

    The views come from a uniformly random walk from fixed reset seeds, the same for every run
    and every seed offset; the head reads the final checkpoint's RGB encoder (the policy never
    sees depth).
    """
    from rl.evaluation import InferenceAgent
    from rl.tasks import build_env, dict_space

    checkpoint = latest_checkpoint(run_dir)
    model = InferenceAgent.from_checkpoint(checkpoint).model
    env = build_env(task)
    rng = np.random.default_rng(0)
    frames: list[dict[str, np.ndarray]] = []
    try:
        space = dict_space(env.observation_space)
        obs, _ = env.reset(seed=0)
        while len(frames) < num_steps:
            frames.append(obs)
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                obs, _ = env.reset(seed=len(frames))
        head = DepthPredictionLoss(key="depth", size=[15, 20])
        bind_losses({"depth": head}, model, space, env.action_space)
    finally:
        env.close()
    head.load_state_dict(load_checkpoint(checkpoint)["losses"]["depth"])
    batch = {k: torch.as_tensor(np.stack([f[k] for f in frames]))[None] for k in frames[0]}
    with torch.no_grad():
        output, _ = model(
            batch,
            torch.ones(1, num_steps, dtype=torch.bool),
            model.initial_state(num_steps, "cpu"),
        )
        trained = head(batch=TensorDict({"obs": batch}), output=output, step_count=0).total
    depth = batch["depth"][0].permute(0, 3, 1, 2)  # [B, 1, H, W]
    target = torch.nn.functional.adaptive_avg_pool2d(depth, (15, 20)) * head.scale
    blind = (target - target.median(dim=0).values).abs().mean()
    return float(trained), float(blind)


@pytest.mark.slow
@pytest.mark.learning
def test_depth_prediction_trains_end_to_end_on_nav3d(compose_cfg, tmp_path: Path) -> None:
    """An RGB encoder learns, through the engine, to predict the depth its policy does not see
    (task.depth, model.ignore_keys, the head bound, trained and saved with the checkpoint).

    The depth loss trains alone: beside PPO, what the policy looks at drifts as it learns, and
    the loss curve moved with the views more than with the head (on a fresh install it fell by
    8% where the test asked 20%, while that head was no better than the blind guess below on
    fixed views). So the test measures the final head on a fixed set of views
    instead: its error must be well below the best guess that does not look at the image (each
    pixel's median depth over those views). Over seeds 1-3 the ratio was 0.6-0.72.
    """
    cfg = compose_cfg(
        [
            "+experiment=ppo_nav3d",
            "task=nav3d_small",
            "pipeline=ppo_aux",
            "task.depth=true",
            "model.ignore_keys=[depth]",
            "pipeline.stages.0.loss_names=[depth]",
            "pipeline.stages.0.loss_weights=[1.0]",
            "collector=local",
            "~collector.num_workers",
            "sampler.num_envs=8",
            "pipeline.num_steps=32",
            "pipeline.optimizer.lr=1e-3",
            "pipeline.lr_scheduler=null",
            "total_env_steps=8192",
            "pipeline.metric_accumulate_interval=1024",
            "eval.num_episodes=0",
            "logger.sinks.console.progress_bar=false",
        ]
    )
    rl.engine.run.train(cfg)
    assert len(_logged(tmp_path / "run", "losses/depth/depth_loss")) == 8
    trained, blind = _depth_errors(tmp_path / "run", OmegaConf.to_container(cfg.task))
    assert trained < 0.85 * blind, (trained, blind)
