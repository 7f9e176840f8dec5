"""V-trace (``pipeline/advantage=vtrace``): the pure function against a reference written from
the paper's definition, its on-policy reduction to n-step returns, truncation vs termination,
episode boundaries; then the learner's use of it and the config keys."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pipelines import ppo_pipeline
from small import small_nav

from rl.collection import InProcessCollector, RolloutRequest
from rl.engine import run
from rl.engine.settings import verify_train_cfg
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic
from rl.pipeline import PipelineStage, TrainingPipeline
from rl.sampling import SerialSampler
from rl.storage import (
    GAE,
    DiscountedReturns,
    VTrace,
    compute_discounted_returns,
    compute_gae,
    compute_vtrace,
)
from rl.training import Learner, OnPolicyTrainer
from rl.utils.config import ConfigError
from rl.utils.seeding import set_seed

T, N = 23, 6
INF = math.inf


def _random_rollout(seed: int, t: int = T, n: int = N, spread: float = 0.7) -> dict[str, Any]:
    """Random ``[T, N]`` rollout with both endings, and log-probs whose ratios straddle 1."""
    g = torch.Generator().manual_seed(seed)
    ended = torch.rand(t, n, generator=g) < 0.25
    is_term = torch.rand(t, n, generator=g) < 0.5
    terminated, truncated = ended & is_term, ended & ~is_term
    terminated[3, 0], truncated[3, 0] = True, False
    truncated[5, 1], terminated[5, 1] = True, False
    behaviour = -torch.rand(t, n, generator=g, dtype=torch.float64) * 2.0
    return {
        "rewards": torch.randn(t, n, generator=g, dtype=torch.float64),
        "values": torch.randn(t, n, generator=g, dtype=torch.float64),
        "next_value": torch.randn(n, generator=g, dtype=torch.float64),
        "terminated": terminated,
        "truncated": truncated,
        "truncation_values": torch.randn(t, n, generator=g, dtype=torch.float64),
        "behaviour_logprobs": behaviour,
        "target_logprobs": behaviour
        + spread * torch.randn(t, n, generator=g, dtype=torch.float64),
    }


def _reference_vtrace(
    r: dict[str, Any], gamma: float, rho_bar: float, c_bar: float, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Espeholt et al. (2018), eq. (1), as a plain sum per environment (no recursion):

    v_s = V(x_s) + sum_{t=s}^{end} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t,
    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
    pg advantage_s = rho_s (r_s + gamma v_{s+1} - V(x_s)),

    where ``end`` is the last step of s's episode in the rollout and, at an episode's end,
    V(x_{t+1}) (and v_{s+1}) is 0 after a termination, the final observation's value after a
    truncation; after the rollout's last step both are ``next_value``.
    """
    t_len, n = r["values"].shape
    vs = torch.zeros(t_len, n, dtype=torch.float64)
    adv = torch.zeros(t_len, n, dtype=torch.float64)
    for env in range(n):
        rew = [r["rewards"][t, env].item() for t in range(t_len)]
        val = [r["values"][t, env].item() for t in range(t_len)]
        term = [bool(r["terminated"][t, env]) for t in range(t_len)]
        trunc = [bool(r["truncated"][t, env]) for t in range(t_len)]
        ratio = [
            math.exp(r["target_logprobs"][t, env].item() - r["behaviour_logprobs"][t, env].item())
            for t in range(t_len)
        ]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lam * min(c_bar, x) for x in ratio]

        # V(x_{t+1}) as seen from step t's episode.
        bootstrap = [
            0.0
            if term[t]
            else r["truncation_values"][t, env].item()
            if trunc[t]
            else r["next_value"][env].item()
            if t == t_len - 1
            else val[t + 1]
            for t in range(t_len)
        ]
        delta = [rho[t] * (rew[t] + gamma * bootstrap[t] - val[t]) for t in range(t_len)]
        for s in range(t_len):
            total, weight = 0.0, 1.0
            for t in range(s, t_len):
                total += (gamma ** (t - s)) * weight * delta[t]
                if term[t] or trunc[t]:
                    break
                weight *= c[t]
            vs[s, env] = val[s] + total
        for s in range(t_len):
            ended = term[s] or trunc[s] or s == t_len - 1
            following = bootstrap[s] if ended else vs[s + 1, env].item()
            adv[s, env] = rho[s] * (rew[s] + gamma * following - val[s])
    return adv, vs


# ------------------------------------------------------------ the pure function
def test_random_rollout_has_both_endings_and_ratios_on_both_sides_of_the_clips() -> None:
    r = _random_rollout(0)
    assert r["terminated"].any() and r["truncated"].any()
    ratios = (r["target_logprobs"] - r["behaviour_logprobs"]).exp()
    assert (ratios > 1.5).float().mean() > 0.1 and (ratios < 0.7).float().mean() > 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("gamma", "rho_bar", "c_bar", "lam"),
    [
        (0.99, 1.0, 1.0, 1.0),  # the paper's usual clips: both active
        (0.9, 2.0, 0.8, 1.0),  # rho_bar > 1 > c_bar
        (0.97, INF, INF, 1.0),  # no clipping: full importance sampling
        (0.95, 1.2, 1.0, 0.9),  # with the paper's lambda
        (0.5, 0.5, 0.5, 0.0),  # clips below 1, lambda 0: one-step targets
    ],
)
def test_vtrace_matches_the_papers_definition(
    seed: int, gamma: float, rho_bar: float, c_bar: float, lam: float
) -> None:
    r = _random_rollout(seed)
    adv, vs = compute_vtrace(**r, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, vtrace_lambda=lam)
    ref_adv, ref_vs = _reference_vtrace(r, gamma, rho_bar, c_bar, lam)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(adv, ref_adv)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("rho_bar", "c_bar"), [(1.0, 1.0), (1.5, 1.0), (INF, 3.0)])
def test_on_policy_vtrace_equals_n_step_discounted_returns(
    seed: int, rho_bar: float, c_bar: float
) -> None:
    r = _random_rollout(seed)
    r["target_logprobs"] = r["behaviour_logprobs"].clone()  # all ratios 1
    adv, vs = compute_vtrace(**r, gamma=0.97, rho_bar=rho_bar, c_bar=c_bar)
    plain = {k: v for k, v in r.items() if not k.endswith("logprobs")}
    ret_adv, returns = compute_discounted_returns(**plain, gamma=0.97)
    torch.testing.assert_close(vs, returns)
    torch.testing.assert_close(adv, ret_adv)


@pytest.mark.parametrize("lam", [0.0, 0.8, 0.95])
def test_on_policy_vtrace_with_lambda_gives_gae_targets(lam: float) -> None:
    r = _random_rollout(3)
    r["target_logprobs"] = r["behaviour_logprobs"].clone()
    _, vs = compute_vtrace(**r, gamma=0.99, vtrace_lambda=lam)
    plain = {k: v for k, v in r.items() if not k.endswith("logprobs")}
    _, gae_returns = compute_gae(**plain, gamma=0.99, gae_lambda=lam)
    torch.testing.assert_close(vs, gae_returns)


def test_ratios_above_both_clips_are_cut_to_the_on_policy_result() -> None:
    r = _random_rollout(4)
    r["target_logprobs"] = r["behaviour_logprobs"] + 2.0  # every ratio e^2 > 1
    adv, vs = compute_vtrace(**r, gamma=0.9, rho_bar=1.0, c_bar=1.0)
    plain = {k: v for k, v in r.items() if not k.endswith("logprobs")}
    ret_adv, returns = compute_discounted_returns(**plain, gamma=0.9)
    torch.testing.assert_close(vs, returns)
    torch.testing.assert_close(adv, ret_adv)
    # ... while below the clips the weights act: the targets differ from the on-policy ones.
    r["target_logprobs"] = r["behaviour_logprobs"] - 1.0
    _, vs_low = compute_vtrace(**r, gamma=0.9, rho_bar=1.0, c_bar=1.0)
    assert not torch.allclose(vs_low, returns)


def _one_env(t_len: int, end_at: int, kind: str, log_ratio: float = 0.0) -> dict[str, Any]:
    z = torch.zeros(t_len, 1, dtype=torch.float64)
    ended = torch.zeros(t_len, 1, dtype=torch.bool)
    ended[end_at] = True
    no = torch.zeros_like(ended)
    return {
        "rewards": z.clone(),
        "values": z.clone(),
        "next_value": torch.full((1,), 100.0, dtype=torch.float64),
        "terminated": ended if kind == "terminated" else no,
        "truncated": ended if kind == "truncated" else no,
        "truncation_values": torch.full((t_len, 1), 7.0, dtype=torch.float64),
        "behaviour_logprobs": z.clone(),
        "target_logprobs": z + log_ratio,
    }


@pytest.mark.parametrize("log_ratio", [0.0, math.log(0.5)])
def test_truncation_bootstraps_the_final_value_and_termination_zero(log_ratio: float) -> None:
    gamma, rho = 0.9, math.exp(log_ratio)  # rho <= 1: unclipped
    adv_trunc, vs_trunc = compute_vtrace(**_one_env(4, 1, "truncated", log_ratio), gamma=gamma)
    adv_term, vs_term = compute_vtrace(**_one_env(4, 1, "terminated", log_ratio), gamma=gamma)
    # At the truncation: V + rho (0 + gamma * V(final obs) - V) = rho * 0.9 * 7.
    assert vs_trunc[1, 0].item() == pytest.approx(rho * gamma * 7.0)
    assert adv_trunc[1, 0].item() == pytest.approx(rho * gamma * 7.0)
    assert vs_term[1, 0].item() == pytest.approx(0.0)
    assert adv_term[1, 0].item() == pytest.approx(0.0)
    # Before the ending the trace carries it back (c = rho): 0.9 * rho * (rho * 0.9 * 7).
    assert vs_trunc[0, 0].item() == pytest.approx(gamma * rho * rho * gamma * 7.0)
    assert vs_term[0, 0].item() == pytest.approx(0.0)
    # After the boundary the next episode bootstraps from next_value (100) only.
    assert vs_trunc[3, 0].item() == pytest.approx(rho * gamma * 100.0)
    assert vs_trunc[2, 0].item() == pytest.approx(vs_term[2, 0].item())
    assert vs_trunc[2, 0].item() == pytest.approx(gamma * rho * rho * gamma * 100.0)


@pytest.mark.parametrize("kind", ["terminated", "truncated"])
def test_the_trace_does_not_cross_an_episode_boundary(kind: str) -> None:
    g = torch.Generator().manual_seed(5)
    base = _one_env(6, 2, kind)
    base["rewards"] = torch.randn(6, 1, generator=g, dtype=torch.float64)
    base["values"] = torch.randn(6, 1, generator=g, dtype=torch.float64)
    base["target_logprobs"] = 0.5 * torch.randn(6, 1, generator=g, dtype=torch.float64)
    changed = {k: v.clone() for k, v in base.items()}
    changed["rewards"][3:] += 5.0  # only the next episode changes ...
    changed["values"][3:] -= 2.0
    changed["target_logprobs"][3:] -= 1.0
    changed["next_value"] += 3.0
    for rho_bar, c_bar in [(1.0, 1.0), (INF, INF)]:
        adv_a, vs_a = compute_vtrace(**base, gamma=0.99, rho_bar=rho_bar, c_bar=c_bar)
        adv_b, vs_b = compute_vtrace(**changed, gamma=0.99, rho_bar=rho_bar, c_bar=c_bar)
        torch.testing.assert_close(vs_a[:3], vs_b[:3])  # ... and the first is untouched
        torch.testing.assert_close(adv_a[:3], adv_b[:3])
        assert not torch.allclose(vs_a[3:], vs_b[3:])


# ------------------------------------------------------------------ the learner
SMALL = small_nav(max_steps=5)


def _pipeline(stages: list[PipelineStage] | None = None, **settings: Any) -> TrainingPipeline:
    defaults: dict[str, Any] = dict(
        num_steps=16, num_mini_batch=2, update_repeats=1, gamma=0.95, advantage=GAE()
    )
    defaults.update(settings)
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=stages or [PipelineStage(loss_names=["ppo"], max_stage_steps=1024)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        **defaults,
    )


def _collected(rnn: str | None, seed: int = 0):
    """A model and a rollout of 4 environments x 16 steps it collected (both endings)."""
    set_seed(seed)
    sampler = SerialSampler(task=SMALL, num_envs=4, seed=seed)
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        trunk_layers=[32],
        rnn=rnn,
        rnn_hidden_size=16,
    )
    collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
    rollouts = [collector.collect(RolloutRequest(num_steps=16)) for _ in range(2)]
    return model, rollouts[1], sampler  # the second starts mid-episode (a recurrent state)


def _perturb(model: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Move the weights as updates would have since collection (the policy lag)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _expected_vtrace(model, storage, gamma, vtrace) -> tuple[torch.Tensor, torch.Tensor]:
    """compute_vtrace on one forward pass over all T + 1 rows (from the first state)."""
    t = storage.step
    rows = storage.rows()
    state = (
        rows["state"][0]
        if "state" in rows.keys()
        else model.initial_state(storage.num_envs, "cpu")
    )
    with torch.no_grad():
        out, _ = model(rows["obs"], rows["episode_starts"], state)
        actions = storage["actions"][: t + 1].clone()
        actions[t] = actions[t - 1]  # row T has no action: any valid one, then dropped
        logprobs = out.dist.log_prob(actions)[:t]
    return compute_vtrace(
        rewards=storage["rewards"][:t],
        values=out.values[:t],
        next_value=out.values[t],
        terminated=storage["terminated"][:t],
        truncated=storage["truncated"][:t],
        truncation_values=storage["truncation_values"][:t],
        behaviour_logprobs=storage["logprobs"][:t],
        target_logprobs=logprobs,
        gamma=gamma,
        rho_bar=vtrace.rho_bar,
        c_bar=vtrace.c_bar,
        vtrace_lambda=vtrace.vtrace_lambda,
    )


@pytest.mark.parametrize("rnn", [None, "gru"])
def test_the_learner_fills_vtrace_targets_of_its_current_policy(rnn: str | None) -> None:
    model, rollout, sampler = _collected(rnn)
    with sampler:
        storage = rollout.storage
        assert storage["terminated"][: storage.step].any()
        assert storage["truncated"][: storage.step].any()
        _perturb(model, seed=1)
        pipe = _pipeline(advantage=VTrace(rho_bar=1.5, c_bar=0.9))
        settings = pipe.current_settings
        expected_adv, expected_vs = _expected_vtrace(model, storage, 0.95, settings.advantage)
        t = storage.step
        behaviour = storage["logprobs"][:t].clone()
        learner = Learner(model=model, pipeline=pipe, device="cpu")
        tracker, _ = learner.update(rollout, pipe.current_stage, settings, step_count=0)
        torch.testing.assert_close(storage["advantages"][:t], expected_adv)
        torch.testing.assert_close(storage["returns"][:t], expected_vs)
        logged = tracker.means()
        assert logged["losses/vtrace/rho_mean"] != pytest.approx(1.0, abs=1e-3)
        assert 0.0 < logged["losses/vtrace/rho_clipfrac"] < 1.0
        assert logged["losses/vtrace/behaviour_kl"] > 1e-3
        # The behaviour log-probs (PPO's ratio reads them) stay the recorded ones.
        assert torch.equal(storage["logprobs"][:t], behaviour)


def test_on_policy_vtrace_in_the_learner_gives_the_discounted_returns() -> None:
    model, rollout, sampler = _collected("gru", seed=3)
    with sampler:
        storage, t = rollout.storage, rollout.storage.step
        DiscountedReturns()(storage, model=model, next_value=rollout.next_value, gamma=0.95)
        returns = storage["returns"][:t].clone()
        advantages = storage["advantages"][:t].clone()
        logged = VTrace()(storage, model=model, next_value=rollout.next_value, gamma=0.95)
        # The learner's forward pass reproduces what the collecting policy recorded ...
        assert logged["losses/vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-5)
        assert abs(logged["losses/vtrace/behaviour_kl"]) < 1e-6
        # ... so V-trace's targets are the n-step returns.
        torch.testing.assert_close(storage["returns"][:t], returns, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(storage["advantages"][:t], advantages, atol=1e-5, rtol=1e-5)


def test_advantage_gae_does_not_run_vtrace(monkeypatch: pytest.MonkeyPatch) -> None:
    model, rollout, sampler = _collected(None)
    with sampler:
        storage, t = rollout.storage, rollout.storage.step
        _perturb(model, seed=2)
        expected, _ = compute_gae(
            rewards=storage["rewards"][:t],
            values=storage["values"][:t],
            next_value=rollout.next_value,
            terminated=storage["terminated"][:t],
            truncated=storage["truncated"][:t],
            truncation_values=storage["truncation_values"][:t],
            gamma=0.95,
            gae_lambda=0.9,
        )
        pipe = _pipeline(advantage=GAE(gae_lambda=0.9))

        def fail(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("advantage=gae ran V-trace")

        monkeypatch.setattr(VTrace, "__call__", fail)
        learner = Learner(model=model, pipeline=pipe, device="cpu")
        tracker, _ = learner.update(rollout, pipe.current_stage, pipe.current_settings, 0)
        assert torch.equal(storage["advantages"][:t], expected)  # bitwise: the recorded values
        assert not any(k.startswith("losses/vtrace/") for k in tracker.means())


def test_a_stage_switches_to_vtrace_and_training_runs(tmp_path: Path) -> None:
    stages = [
        PipelineStage(loss_names=["ppo"], max_stage_steps=128),
        PipelineStage(
            loss_names=["ppo"], max_stage_steps=128, advantage=VTrace(c_bar=0.5)
        ),  # fmt: skip
    ]
    pipe = _pipeline(stages, update_repeats=2, metric_accumulate_interval=64)
    assert [pipe.settings_for(i).advantage for i in (0, 1)] == [GAE(), VTrace(c_bar=0.5)]
    set_seed(0)
    with SerialSampler(task=SMALL, num_envs=4, seed=0) as sampler:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[8],
            trunk_layers=[32],
        )
        trainer = OnPolicyTrainer(
            model=model,
            pipeline=pipe,
            collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
            logger=MetricsLogger([]),
            output_dir=tmp_path,
            seed=0,
            device="cpu",
        )
        metrics = trainer.train()
    assert pipe.finished
    assert metrics["losses/vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("losses/"))


@pytest.mark.parametrize("where", ["pipeline", "stage"])
def test_an_estimator_that_is_not_one_is_an_error_naming_the_key(where: str) -> None:
    with pytest.raises(ValueError, match="advantage: expected an advantage estimator .* 'vtrace'"):
        if where == "pipeline":
            _pipeline(advantage="vtrace")  # the old string form
        else:
            PipelineStage(loss_names=["ppo"], max_stage_steps=64, advantage="vtrace")


# -------------------------------------------------------------------- configs
SMOKE = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "task=nav_small",
    "model.cnn_channels=[8]",
    "model.trunk_layers=[16]",
    "model.rnn_hidden_size=8",
    "eval.num_episodes=0",
    "valid=null",
]


def test_vtrace_configs_verify(compose_cfg: Any, resolve_cfg: Any) -> None:
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "pipeline/advantage=vtrace"]))
    assert plain["pipeline"]["advantage"] == {
        "_target_": "rl.storage.VTrace", "rho_bar": 1.0, "c_bar": 1.0, "vtrace_lambda": 1.0
    }  # fmt: skip
    verify_train_cfg(plain)
    typo = ["+experiment=ppo_nav", "pipeline/advantage=vtrace", "+pipeline.advantage.cbar=2"]
    with pytest.raises(ConfigError, match="pipeline.advantage.cbar: unknown key for rl.storage"):
        verify_train_cfg(resolve_cfg(compose_cfg(typo)))


@pytest.mark.learning
@pytest.mark.parametrize("collector", ["local", "process"])
def test_vtrace_sees_the_policy_lag_of_an_asynchronous_worker(
    collector: str, compose_cfg: Any, tmp_path: Path
) -> None:
    overrides = [
        *SMOKE,
        "pipeline/advantage=vtrace",
        f"collector={collector}",  # process: asynchronous, one worker (policy lag 1)
        "pipeline.lr_scheduler=null",  # the LR decays to 0 within the smoke budget otherwise
        "pipeline.optimizer.lr=1.0e-2",
    ]
    metrics = run.train(compose_cfg([*overrides, f"output_dir={tmp_path}"], set_output_dir=False))
    assert math.isfinite(metrics["losses/ppo/policy_loss"])
    kl = metrics["losses/vtrace/behaviour_kl"]
    # One bound between the two: the same weights give the same log-probs (0.0 exactly, for
    # seeds 1-9); one update's lag gave 2.9e-5 to 5.9e-4 over those seeds.
    if collector == "local":  # collected by the weights being updated: on-policy
        assert abs(kl) < 1e-6
    else:  # collected by the weights of one update before: behaviour and target differ
        assert kl > 1e-6
