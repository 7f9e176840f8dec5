"""The loss protocol: ``loss(batch=..., output=..., step_count=...) -> LossOutput``.

A loss reads what it needs from the minibatch, a ``tensordict.TensorDict`` ``[T, n]`` of the
rollout's fields (:mod:`rl.storage.rollout`: ``actions``, ``logprobs`` and ``values`` of the
behaviour policy, ``advantages``, ``returns``, ``expert_actions``, ``obs``, ... and any field a
component recorded), and from the policy re-run on it (:class:`~rl.models.PolicyOutput`: the
action distribution and the values).
"""

from __future__ import annotations

import abc
import dataclasses

import torch
from tensordict import TensorDict

from rl.models.distributions import ActionDistribution
from rl.models.policy import PolicyOutput
from rl.storage.rollout import advantage_stats_of


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
    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Compute the loss.

        Args:
            batch: Minibatch of the rollout, time-major ``[T, n]`` (or an off-policy batch).
            output: The policy re-run on ``batch`` (distribution over ``[T, n]``, values).
            step_count: Global env steps so far (for schedules such as the clip decay).
        """


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - predicted] / Var[target]``; NaN when ``Var[target] == 0``."""
    var_target = torch.var(target, unbiased=False)
    if var_target.item() == 0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted, unbiased=False) / var_target)


def policy_terms(
    dist: ActionDistribution, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log-probabilities of actions [T, n], mean entropy [])`` under ``dist``."""
    return dist.log_prob(actions), dist.entropy().mean()


def normalized_advantages(batch: TensorDict) -> torch.Tensor:
    """Advantages ``[T, n]`` at zero mean and unit std.

    Uses the rollout-wide statistics the batch carries when the engine set them (global
    statistics under DDP, :func:`~rl.storage.advantage_stats_of`), else this minibatch's own.
    """
    adv = batch["advantages"]
    stats = advantage_stats_of(batch)
    if stats is not None:
        mean, std = stats
        return (adv - mean) / (std + 1e-8)
    if adv.numel() > 1:
        std, mean = torch.std_mean(adv)
        return (adv - mean) / (std + 1e-8)
    return adv
