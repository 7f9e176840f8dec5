"""Proximal policy optimisation loss (Schulman et al., 2017), AllenAct's parameter names."""

from __future__ import annotations

from typing import Annotated

import torch
from tensordict import TensorDict

from rl.losses.base import (
    Loss,
    LossOutput,
    normalized_advantages,
    step_weights,
    value_terms,
    weighted_mean,
    weighted_var,
)
from rl.models.policy import PolicyOutput
from rl.pipeline.schedules import Schedule
from rl.utils.config import Check


class PPOLoss(Loss):
    """Clipped surrogate + (clipped) value loss - entropy bonus.

    Args:
        clip_param: Clip range of the probability ratio (and of the value change).
        clip_decay: Multiplier of ``clip_param`` as a function of env steps (None: constant).
        value_loss_coef: Weight of the value loss.
        entropy_coef: Weight of the entropy bonus.
        use_clipped_value_loss: Clip the value update around the rollout's values.
        normalize_advantage: Normalise advantages to zero mean, unit std: with the whole
            rollout's statistics when the batch carries them (distributed: every rank's, so the
            result does not depend on how the data is split), else per minibatch.
    """

    def __init__(
        self,
        *,
        clip_param: Annotated[float, Check(gt=0)] = 0.2,
        clip_decay: Schedule | None = None,
        value_loss_coef: Annotated[float, Check(ge=0)] = 0.5,
        entropy_coef: Annotated[float, Check(ge=0)] = 0.01,
        use_clipped_value_loss: bool = True,
        normalize_advantage: bool = True,
    ) -> None:
        self.clip_param = clip_param
        self.clip_decay = clip_decay
        self.value_loss_coef = value_loss_coef
        self.entropy_coef = entropy_coef
        self.use_clipped_value_loss = use_clipped_value_loss
        self.normalize_advantage = normalize_advantage

    def current_clip(self, step_count: int) -> float:
        """The clip range at ``step_count`` env steps."""
        decay = 1.0 if self.clip_decay is None else self.clip_decay(step_count)
        return self.clip_param * decay

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """PPO on a minibatch ``[T, n]``."""
        clip = self.current_clip(step_count)
        weights = step_weights(batch)  # None but for agents out of their episode
        logprobs = output.dist.log_prob(batch["actions"])
        entropy = weighted_mean(output.dist.entropy(), weights)
        adv = normalized_advantages(batch) if self.normalize_advantage else batch["advantages"]

        logratio = logprobs - batch["logprobs"]
        ratio = logratio.exp()
        surr1 = ratio * adv
        surr2 = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
        policy_loss = -weighted_mean(torch.min(surr1, surr2), weights)

        # In normalised units for a policy with value normalisation.
        values, old_values, returns = value_terms(batch, output)
        if self.use_clipped_value_loss:
            v_clipped = old_values + (values - old_values).clamp(-clip, clip)
            worst = torch.max((values - returns).pow(2), (v_clipped - returns).pow(2))
            value_loss = 0.5 * weighted_mean(worst, weights)
        else:
            value_loss = 0.5 * weighted_mean((values - returns).pow(2), weights)

        total = policy_loss + self.value_loss_coef * value_loss - self.entropy_coef * entropy
        with torch.no_grad():  # every logged value in one host read
            ratio_change = ratio - 1.0
            logged = torch.stack(
                [
                    policy_loss,
                    value_loss,
                    entropy,
                    weighted_mean(ratio_change - logratio, weights),
                    weighted_mean(-logratio, weights),
                    weighted_mean((ratio_change.abs() > clip).float(), weights),
                    weighted_var(batch["returns"], weights),
                    weighted_var(batch["returns"] - batch["values"], weights),
                ]
            ).tolist()
        pg, vf, ent, approx_kl, old_approx_kl, clipfrac, var_returns, var_residual = logged
        return LossOutput(
            total=total,
            terms={"policy_loss": pg, "value_loss": vf, "entropy": ent},
            diagnostics={
                "approx_kl": approx_kl,
                "old_approx_kl": old_approx_kl,
                "clipfrac": clipfrac,
                "clip_param": clip,
                # explained_variance(old values, returns): NaN for constant returns
                "explained_variance": (
                    float("nan") if var_returns == 0 else 1.0 - var_residual / var_returns
                ),
            },
        )
