"""Value normalisation: the critic learns value targets at zero mean and unit variance.

MAPPO's ``ValueNorm`` (Yu et al., 2022), a debiased exponential moving average of the targets'
mean and mean square; how it is used: docs/concepts/multi-agent.md ("Value normalisation").
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ValueNorm"]


class ValueNorm(nn.Module):
    """Running mean and standard deviation of value targets (a policy's submodule).

    Args:
        beta: Decay of the moving averages, once per update.
        epsilon: Floor of the debiasing term (before the first update: mean 0, std 1).
        min_var: Floor of the variance.
    """

    running_mean: torch.Tensor
    running_mean_sq: torch.Tensor
    debiasing: torch.Tensor

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5, min_var: float = 1e-2):
        super().__init__()
        if not 0.0 < beta < 1.0:
            raise ValueError(f"model.value_norm_beta must be in (0, 1), got {beta}")
        self.beta, self.epsilon, self.min_var = beta, epsilon, min_var
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing", torch.zeros((), dtype=torch.float64))

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` as float32 scalars (``(0, 1)`` before the first update)."""
        debias = self.debiasing.clamp_min(self.epsilon)
        mean = self.running_mean / debias
        var = (self.running_mean_sq / debias - mean * mean).clamp_min(self.min_var)
        std = torch.where(self.debiasing > 0, var.sqrt(), torch.ones_like(var))  # (no host read)
        return mean.float(), std.float()

    @torch.no_grad()
    def update(self, mean: float, mean_sq: float) -> None:
        """Fold in a batch of targets with mean ``mean`` and mean square ``mean_sq``."""
        b = self.beta
        self.running_mean.mul_(b).add_((1.0 - b) * mean)
        self.running_mean_sq.mul_(b).add_((1.0 - b) * mean_sq)
        self.debiasing.mul_(b).add_(1.0 - b)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised values ``x`` in the targets' units."""
        mean, std = self.stats()
        return x * std + mean

    def extra_repr(self) -> str:
        """The settings, in ``print(policy)``."""
        return f"beta={self.beta}, min_var={self.min_var}"
