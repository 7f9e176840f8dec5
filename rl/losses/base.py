"""The loss protocol: ``loss(batch=..., output=..., step_count=...) -> LossOutput``."""

from __future__ import annotations

import abc
import dataclasses

import torch

from rl.models.actor_critic import ActorCriticOutput
from rl.storage.rollout import RolloutBatch


@dataclasses.dataclass
class LossOutput:
    """What a loss returns.

    Attributes:
        total: Scalar tensor to minimise (before the stage's loss weight).
        terms: Named components, logged as ``losses/<loss>/<term>``.
        diagnostics: Named non-loss statistics (e.g. ``approx_kl``), logged the same way.
    """

    total: torch.Tensor
    terms: dict[str, float]
    diagnostics: dict[str, float] = dataclasses.field(default_factory=dict)


class Loss(abc.ABC):
    """A named training objective evaluated on a rollout minibatch."""

    @abc.abstractmethod
    def __call__(
        self, *, batch: RolloutBatch, output: ActorCriticOutput, step_count: int
    ) -> LossOutput:
        """Compute the loss.

        Args:
            batch: Minibatch of the rollout, time-major ``[T, n, ...]``.
            output: The model re-run on ``batch`` (logits ``[T, n, A]``, values ``[T, n]``).
            step_count: Global env steps so far (for schedules such as the clip decay).
        """


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - predicted] / Var[target]``; NaN when ``Var[target] == 0``."""
    var_target = torch.var(target, unbiased=False)
    if var_target.item() == 0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted, unbiased=False) / var_target)


def policy_terms(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log-probabilities of actions [T, n], mean entropy [])`` of a categorical policy."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return logprobs, -(logp_all.exp() * logp_all).sum(-1).mean()


def normalized_advantages(batch: RolloutBatch) -> torch.Tensor:
    """Advantages ``[T, n]`` at zero mean and unit std.

    Uses the rollout-wide statistics in ``batch.advantage_stats`` when the engine set them
    (global statistics under DDP), else this minibatch's own.
    """
    adv = batch.advantages
    if batch.advantage_stats is not None:
        mean, std = batch.advantage_stats
        return (adv - mean) / (std + 1e-8)
    if adv.numel() > 1:
        return (adv - adv.mean()) / (adv.std() + 1e-8)
    return adv
