"""Behaviour cloning: cross-entropy against the expert's actions (AllenAct's ``Imitation``)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rl.losses.base import Loss, LossOutput
from rl.models.distributions import Categorical
from rl.models.policy import PolicyOutput


class ImitationLoss(Loss):
    """Mean negative log-likelihood of the expert's action, over steps that have one.

    Reads ``expert_actions`` (``[T, n]``, -1 where the task gave none) of a rollout minibatch
    or an off-policy expert batch. Steps without an expert action are masked out; a batch
    without any gives a zero loss. The expert gives one discrete action per step, so this loss
    needs a ``Discrete`` action space.
    """

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Cross-entropy on ``batch["expert_actions"]`` ``[T, n]`` (-1: none)."""
        if not isinstance(output.dist, Categorical):
            raise ValueError(
                "imitation: the expert gives one discrete action per step, but the policy's "
                f"action distribution is a {type(output.dist).__name__}; imitation needs a "
                "Discrete action space"
            )
        expert = batch["expert_actions"]
        mask = expert >= 0
        count = int(mask.sum())
        logp = output.dist.log_prob(expert.clamp(min=0))
        if count == 0:  # zero gradients for the policy's parameters, as a masked loss gives
            return LossOutput(
                total=logp.sum() * 0.0,
                terms={"imitation_loss": 0.0},
                diagnostics={"expert_fraction": 0.0},
            )
        loss = -(logp * mask).sum() / count
        with torch.no_grad():
            agree = ((output.dist.mode() == expert) & mask).sum().item() / count
        return LossOutput(
            total=loss,
            terms={"imitation_loss": loss.item()},
            diagnostics={"expert_accuracy": agree, "expert_fraction": count / expert.numel()},
        )
