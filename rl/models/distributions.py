"""Categorical-policy helpers written for the hot path (no ``torch.distributions`` overhead)."""

from __future__ import annotations

import torch


def log_probs_all(logits: torch.Tensor) -> torch.Tensor:
    """Normalised log-probabilities of every action, ``[..., A]``."""
    return torch.log_softmax(logits, dim=-1)


def log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``actions`` (``[...]`` long) under ``logits`` (``[..., A]``)."""
    return log_probs_all(logits).gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution, ``[...]``."""
    logp = log_probs_all(logits)
    return -(logp.exp() * logp).sum(-1)


def sample(
    logits: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Sample actions ``[...]`` (argmax when ``deterministic``)."""
    if deterministic:
        return logits.argmax(-1)
    probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1])
