"""Advantage actor-critic loss (Mnih et al., 2016), AllenAct's parameter names."""

from __future__ import annotations

from typing import Annotated

from tensordict import TensorDict

from rl.losses.base import (
    Loss,
    LossOutput,
    explained_variance,
    normalized_advantages,
    step_weights,
    value_terms,
    weighted_mean,
)
from rl.models.policy import PolicyOutput
from rl.utils.config import Check


class A2CLoss(Loss):
    """Policy gradient with the advantage + value regression - entropy bonus.

    Args:
        value_loss_coef: Weight of the value loss.
        entropy_coef: Weight of the entropy bonus.
        normalize_advantage: Normalise advantages (A2C usually does not).
    """

    def __init__(
        self,
        *,
        value_loss_coef: Annotated[float, Check(ge=0)] = 0.5,
        entropy_coef: Annotated[float, Check(ge=0)] = 0.01,
        normalize_advantage: bool = False,
    ) -> None:
        self.value_loss_coef = value_loss_coef
        self.entropy_coef = entropy_coef
        self.normalize_advantage = normalize_advantage

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """A2C on a minibatch ``[T, n]``."""
        weights = step_weights(batch)  # None but for agents out of their episode
        logprobs = output.dist.log_prob(batch["actions"])
        entropy = weighted_mean(output.dist.entropy(), weights)
        adv = normalized_advantages(batch) if self.normalize_advantage else batch["advantages"]
        policy_loss = -weighted_mean(logprobs * adv.detach(), weights)
        values, _, returns = value_terms(batch, output)  # normalised with value normalisation
        value_loss = 0.5 * weighted_mean((values - returns).pow(2), weights)
        total = policy_loss + self.value_loss_coef * value_loss - self.entropy_coef * entropy
        return LossOutput(
            total=total,
            terms={
                "policy_loss": policy_loss.item(),
                "value_loss": value_loss.item(),
                "entropy": entropy.item(),
            },
            diagnostics={
                "explained_variance": explained_variance(batch["values"], batch["returns"])
            },
        )
