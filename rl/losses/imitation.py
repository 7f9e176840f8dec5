"""Behaviour cloning: cross-entropy against the expert's actions (AllenAct's ``Imitation``)."""

from __future__ import annotations

from typing import Protocol

import torch

from rl.losses.base import Loss, LossOutput
from rl.models import distributions as D
from rl.models.actor_critic import ActorCriticOutput


class HasExpertActions(Protocol):
    """Any batch with expert actions: a rollout minibatch or an off-policy expert batch."""

    expert_actions: torch.Tensor


class ImitationLoss(Loss):
    """Mean negative log-likelihood of the expert's action, over steps that have one.

    Steps whose expert action is negative (the task gave none) are masked out; a batch without
    any expert action gives a zero loss.
    """

    def __call__(  # type: ignore[override]
        self, *, batch: HasExpertActions, output: ActorCriticOutput, step_count: int
    ) -> LossOutput:
        """Cross-entropy on ``batch.expert_actions`` ``[T, n]`` (-1: none)."""
        expert = batch.expert_actions
        mask = expert >= 0
        count = int(mask.sum())
        if count == 0:
            zero = output.logits.sum() * 0.0
            return LossOutput(
                total=zero, terms={"imitation_loss": 0.0}, diagnostics={"expert_fraction": 0.0}
            )
        logp_all = D.log_probs_all(output.logits)
        logp = logp_all.gather(-1, expert.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        loss = -(logp * mask).sum() / count
        with torch.no_grad():
            agree = ((output.logits.argmax(-1) == expert) & mask).sum().item() / count
        return LossOutput(
            total=loss,
            terms={"imitation_loss": loss.item()},
            diagnostics={"expert_accuracy": agree, "expert_fraction": count / expert.numel()},
        )
