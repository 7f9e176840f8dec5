"""The loss protocol, ``loss(batch=..., output=..., step_count=...) -> LossOutput``, and helpers.

A loss reads a rollout minibatch (``TensorDict`` ``[T, n]``, :mod:`rl.storage.rollout`) and the
policy re-run on it (docs/howto/add-a-loss.md); the helpers weigh out the steps that do not
count (agents out of play).
"""

from __future__ import annotations

import abc
import dataclasses

import torch
from tensordict import TensorDict

from rl.models.policy import PolicyOutput
from rl.storage.rollout import advantage_stats_of
from rl.tasks.agents import AGENT_ACTIVE


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
        """The loss on ``batch`` ``[T, n]`` and ``output``, the policy re-run on it.

        ``step_count`` (the run's env steps so far) drives schedules such as the clip decay.
        """


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - predicted] / Var[target]``; NaN when ``Var[target] == 0``."""
    var_target = torch.var(target, unbiased=False)
    if var_target.item() == 0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted, unbiased=False) / var_target)


def step_weights(batch: TensorDict) -> torch.Tensor | None:
    """The weight ``[T, n]`` of each step: 0 for agents out of their episode (None: all count)."""
    if AGENT_ACTIVE not in batch.keys():
        return None
    return batch[AGENT_ACTIVE].to(torch.float32)


def weighted_mean(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``x`` over the steps that count (:func:`step_weights`; None: all)."""
    if weights is None:
        return x.mean()
    return (x * weights).sum() / weights.sum().clamp_min(1.0)


def weighted_var(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The (biased) variance of ``x`` over the steps that count."""
    if weights is None:
        return torch.var(x, unbiased=False)
    return weighted_mean((x - weighted_mean(x, weights)).pow(2), weights)


def value_terms(
    batch: TensorDict, output: PolicyOutput
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values, old values, returns)`` ``[T, n]``, normalised if the policy normalises values."""
    values, old, returns = output.values, batch["values"], batch["returns"]
    if output.value_norm is None:
        return values, old, returns
    mean, std = output.value_norm
    return (values - mean) / std, (old - mean) / std, (returns - mean) / std


def normalized_advantages(batch: TensorDict) -> torch.Tensor:
    """Advantages ``[T, n]`` at zero mean and unit std.

    By the rollout-wide statistics where the batch carries them
    (:func:`~rl.storage.advantage_stats_of`), else by this minibatch's steps that count.
    """
    adv = batch["advantages"]
    stats = advantage_stats_of(batch)
    if stats is not None:
        rollout_mean, rollout_std = stats
        return (adv - rollout_mean) / (rollout_std + 1e-8)
    weights = step_weights(batch)
    if weights is not None:
        count = weights.sum()
        if count > 1:
            mean = weighted_mean(adv, weights)
            var = ((adv - mean).pow(2) * weights).sum() / (count - 1)  # unbiased, as std_mean
            return (adv - mean) / (var.sqrt() + 1e-8)
        return adv
    if adv.numel() > 1:
        std, mean = torch.std_mean(adv)
        return (adv - mean) / (std + 1e-8)
    return adv
