"""Behaviour cloning: cross-entropy against the expert's actions (AllenAct's ``Imitation``)."""

from __future__ import annotations

from typing import Annotated

import torch
from tensordict import TensorDict

from rl.losses.base import (
    Loss,
    LossOutput,
    explained_variance,
    step_weights,
    value_terms,
    weighted_mean,
)
from rl.models.distributions import ActionDistribution, Categorical
from rl.models.grouped import GroupedDistribution
from rl.models.policy import PolicyOutput
from rl.tasks.fields import EXPERT_ACTIONS
from rl.utils.config import Check


class ImitationLoss(Loss):
    """Mean negative log-likelihood of the expert's action, over steps that have one.

    Reads ``expert_actions`` (``[T, n]``, -1 where the task gave none) of a rollout minibatch
    or an off-policy expert batch; a batch without any gives a zero loss. Needs a ``Discrete``
    action space.

    Args:
        value_loss_coef: Weight of a value regression on the rollout's returns (0: none).
            Imitation alone leaves the critic untrained, so a PPO stage after it would start
            from random values; on-policy rollouts only (an expert batch has no returns).
    """

    def __init__(self, *, value_loss_coef: Annotated[float, Check(ge=0)] = 0.0) -> None:
        self.value_loss_coef = value_loss_coef

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Cross-entropy on the expert's actions, plus the value term."""
        if not _discrete(output.dist):
            raise ValueError(
                "imitation: the expert gives one discrete action per step, but the policy's "
                f"action distribution is a {type(output.dist).__name__}; imitation needs a "
                "Discrete action space"
            )
        if EXPERT_ACTIONS not in batch.keys():
            raise ValueError(
                f"imitation reads the task's expert actions (the step field {EXPERT_ACTIONS!r}, "
                "info['expert_action']), but the task declares no such field "
                "(rl.tasks.fields: StepField); imitation needs a task with an expert"
            )
        expert = batch[EXPERT_ACTIONS]
        mask = expert >= 0
        weights = step_weights(batch)
        if weights is not None:  # agents out of their episode have nothing to imitate
            mask = mask & (weights > 0)
        count = int(mask.sum())
        logp = output.dist.log_prob(expert.clamp(min=0))
        if count == 0:  # zero gradients for the policy's parameters, as a masked loss gives
            out = LossOutput(
                total=logp.sum() * 0.0,
                terms={"imitation_loss": 0.0},
                diagnostics={"expert_fraction": 0.0},
            )
        else:
            loss = -(logp * mask).sum() / count
            with torch.no_grad():
                agree = ((output.dist.mode() == expert) & mask).sum().item() / count
            out = LossOutput(
                total=loss,
                terms={"imitation_loss": loss.item()},
                diagnostics={"expert_accuracy": agree, "expert_fraction": count / expert.numel()},
            )
        if self.value_loss_coef > 0:
            self._add_value_term(out, batch, output)
        return out

    def _add_value_term(self, out: LossOutput, batch: TensorDict, output: PolicyOutput) -> None:
        if "returns" not in batch.keys():
            raise ValueError(
                "imitation: value_loss_coef > 0 regresses the values on the rollout's returns, "
                "but this batch has none (an off-policy expert batch?); use value_loss_coef: 0 "
                "for off-policy imitation"
            )
        values, _, returns = value_terms(batch, output)  # (normalised with value normalisation)
        value_loss = 0.5 * weighted_mean((values - returns).pow(2), step_weights(batch))
        out.total = out.total + self.value_loss_coef * value_loss
        out.terms["value_loss"] = value_loss.item()
        out.diagnostics["explained_variance"] = explained_variance(
            batch["values"], batch["returns"]
        )


def _discrete(dist: ActionDistribution) -> bool:
    """Whether ``dist`` is over one discrete action (every group's, for groups of agents)."""
    if isinstance(dist, GroupedDistribution):
        return all(isinstance(d, Categorical) for _, d, _ in dist.parts)
    return isinstance(dist, Categorical)
