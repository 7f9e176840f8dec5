"""PPO loss diagnostics, its clipped surrogate by hand, imitation's value term, explained
variance."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from rl.losses import ImitationLoss, PPOLoss, explained_variance
from rl.models import Categorical, PolicyOutput
from rl.pipeline import LinearDecay

T, N, A = 6, 4, 5


def output_of(logits: torch.Tensor, values: torch.Tensor) -> PolicyOutput:
    return PolicyOutput(dist=Categorical(logits), values=values)


def _batch_and_output(seed: int = 0) -> tuple[TensorDict, PolicyOutput]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, N, A, generator=g)
    values = torch.randn(T, N, generator=g)
    actions = torch.randint(0, A, (T, N), generator=g)
    logprobs = torch.log_softmax(logits, -1).gather(-1, actions[..., None])[..., 0]
    batch = TensorDict(
        {
            "episode_starts": torch.zeros(T, N, dtype=torch.bool),
            "actions": actions,
            "logprobs": logprobs,
            "values": values.clone(),
            "advantages": torch.randn(T, N, generator=g),
            "returns": torch.randn(T, N, generator=g),
            "expert_actions": torch.full((T, N), -1),
        },
        batch_size=[T, N],
    )
    output = output_of(logits.clone().requires_grad_(), values.clone().requires_grad_())
    return batch, output


def test_rollout_policy_gives_ratio_one_diagnostics() -> None:
    batch, output = _batch_and_output()
    result = PPOLoss()(batch=batch, output=output, step_count=0)
    assert result.diagnostics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert result.diagnostics["old_approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert result.diagnostics["clipfrac"] == 0.0
    # Normalised advantages have zero mean, so the surrogate at ratio 1 is ~0.
    assert result.terms["policy_loss"] == pytest.approx(0.0, abs=1e-6)


def test_clipped_surrogate_matches_hand_computation() -> None:
    batch, output = _batch_and_output(1)
    # Shift the action logits by +-1: ratios far from 1 in both directions.
    shift = torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).expand(T, N)
    new_logits = output.dist.logits.detach().clone()
    new_logits.scatter_add_(-1, batch["actions"][..., None], shift[..., None])
    output = output_of(new_logits.requires_grad_(), output.values)
    clip = 0.2
    loss = PPOLoss(
        clip_param=clip, normalize_advantage=False, value_loss_coef=0.0, entropy_coef=0.0
    )
    result = loss(batch=batch, output=output, step_count=0)

    expected, clipped = [], 0
    for t in range(T):
        for n in range(N):
            new_lp = torch.log_softmax(new_logits[t, n], -1)[batch["actions"][t, n]].item()
            ratio = math.exp(new_lp - batch["logprobs"][t, n].item())
            adv = batch["advantages"][t, n].item()
            clipped_ratio = min(max(ratio, 1 - clip), 1 + clip)
            expected.append(min(ratio * adv, clipped_ratio * adv))
            clipped += abs(ratio - 1) > clip
    assert clipped > 0
    assert result.diagnostics["clipfrac"] == pytest.approx(clipped / (T * N))
    assert result.terms["policy_loss"] == pytest.approx(-sum(expected) / len(expected), rel=1e-5)
    assert result.total.item() == pytest.approx(result.terms["policy_loss"], rel=1e-6)
    assert result.diagnostics["approx_kl"] > 0


def test_clip_decay_schedule_scales_clip_param() -> None:
    batch, output = _batch_and_output()
    loss = PPOLoss(clip_param=0.2, clip_decay=LinearDecay(steps=1000, startp=1.0, endp=0.0))
    clips = [
        loss(batch=batch, output=output, step_count=s).diagnostics["clip_param"]
        for s in (0, 250, 1000, 5000)
    ]
    assert clips == pytest.approx([0.2, 0.15, 0.0, 0.0])
    assert (
        PPOLoss(clip_param=0.3)(batch=batch, output=output, step_count=10**9).diagnostics[
            "clip_param"
        ]
        == 0.3
    )


def test_clipped_value_loss_limits_value_change() -> None:
    batch, output = _batch_and_output(2)
    # Values moved far towards the returns: the clipped term dominates the max.
    moved = output_of(output.dist.logits, batch["returns"].clone())
    clip = 0.1
    result = PPOLoss(clip_param=clip, use_clipped_value_loss=True)(
        batch=batch, output=moved, step_count=0
    )
    old, returns = batch["values"], batch["returns"]
    v_clipped = old + (returns - old).clamp(-clip, clip)
    expected = 0.5 * (v_clipped - returns).pow(2).mean().item()
    assert result.terms["value_loss"] == pytest.approx(expected, rel=1e-5)
    unclipped = PPOLoss(use_clipped_value_loss=False)(batch=batch, output=moved, step_count=0)
    assert unclipped.terms["value_loss"] == pytest.approx(0.0, abs=1e-10)


def test_gradient_flows_to_logits_and_values() -> None:
    batch, output = _batch_and_output(3)
    PPOLoss()(batch=batch, output=output, step_count=0).total.backward()
    logits = output.dist.logits
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert output.values.grad is not None and output.values.grad.abs().sum() > 0


# -------------------------------------------------------- explained variance
def test_explained_variance_perfect_prediction() -> None:
    target = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert explained_variance(target.clone(), target) == pytest.approx(1.0)


def test_explained_variance_of_the_mean_is_zero() -> None:
    target = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert explained_variance(torch.full_like(target, target.mean().item()), target) == (
        pytest.approx(0.0, abs=1e-6)
    )


def test_explained_variance_nan_for_constant_target() -> None:
    target = torch.full((10,), 3.0)
    assert math.isnan(explained_variance(torch.randn(10), target))


def test_loss_reports_nan_explained_variance_without_raising() -> None:
    batch, output = _batch_and_output()
    batch["returns"] = torch.ones(T, N)
    result = PPOLoss()(batch=batch, output=output, step_count=0)
    assert math.isnan(result.diagnostics["explained_variance"])


def test_imitation_value_term_value_and_gradient_by_hand() -> None:
    batch, output = _batch_and_output(2)
    expert = torch.randint(0, A, (T, N), generator=torch.Generator().manual_seed(3))
    expert[0] = -1  # steps without an expert action: no imitation term, still a value term
    batch["expert_actions"] = expert
    plain = ImitationLoss()(batch=batch, output=output, step_count=0)
    assert "value_loss" not in plain.terms
    result = ImitationLoss(value_loss_coef=0.5)(batch=batch, output=output, step_count=0)

    mask = expert >= 0
    logp = torch.log_softmax(output.dist.logits.detach(), -1)
    nll = -logp.gather(-1, expert.clamp(min=0)[..., None])[..., 0][mask].mean().item()
    values, returns = output.values.detach(), batch["returns"]
    value_loss = sum(
        0.5 * (values[t, n].item() - returns[t, n].item()) ** 2 for t in range(T) for n in range(N)
    ) / (T * N)
    assert result.terms["imitation_loss"] == pytest.approx(nll, rel=1e-5)
    assert result.terms["value_loss"] == pytest.approx(value_loss, rel=1e-5)
    assert result.total.item() == pytest.approx(nll + 0.5 * value_loss, rel=1e-5)
    # d/dV of 0.5 * 0.5 * mean((V - R)^2) is 0.5 * (V - R) / (T * N).
    result.total.backward()
    expected = 0.5 * (values - returns) / (T * N)
    assert torch.allclose(output.values.grad, expected, atol=1e-6)


def test_imitation_value_term_needs_returns() -> None:
    batch, output = _batch_and_output(4)
    del batch["returns"]
    with pytest.raises(ValueError, match="value_loss_coef > 0 .* has none"):
        ImitationLoss(value_loss_coef=1.0)(batch=batch, output=output, step_count=0)
    ImitationLoss()(batch=batch, output=output, step_count=0)  # without the term: fine


def test_imitation_without_an_expert_field_is_an_error() -> None:
    """A task that declares no ``expert_actions`` field (e.g. CartPole) is an error, not a
    batch of -1 that silently gives a zero loss."""
    batch, output = _batch_and_output(5)
    del batch["expert_actions"]
    with pytest.raises(ValueError, match="declares no such field"):
        ImitationLoss()(batch=batch, output=output, step_count=0)
