"""Advantage estimation as pure functions over time-major tensors.

Terminations and truncations are kept apart (see Pardo et al., 2018, "Time Limits in
Reinforcement Learning"): at a termination the next state's value is 0; at a truncation the
episode was cut, not ended, so the value of its final observation (``truncation_values``) is
bootstrapped; after either, the trace does not flow into the next episode.
"""

from __future__ import annotations

import torch


def _next_state_values(
    values: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor,
) -> torch.Tensor:
    """V(s_{t+1}) within each step's own episode, ``[T, N]``."""
    following = torch.cat([values[1:], next_value.unsqueeze(0)], dim=0)
    following = torch.where(truncated, truncation_values, following)
    return torch.where(terminated, torch.zeros_like(following), following)


def compute_gae(
    *,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) with value bootstrap at truncation.

    Args:
        rewards: ``[T, N]`` reward received after the action at step t.
        values: ``[T, N]`` V(s_t) from the rollout.
        next_value: ``[N]`` V(s_T) of the observation following the rollout.
        terminated: ``[T, N]`` bool, the episode ended at step t by reaching a terminal state.
        truncated: ``[T, N]`` bool, the episode was cut at step t (time limit); never both.
        truncation_values: ``[T, N]`` V(final observation) where ``truncated`` (ignored elsewhere).
        gamma: Discount factor.
        gae_lambda: GAE's lambda (1: Monte-Carlo advantages, 0: one-step TD errors).

    Returns:
        ``(advantages, returns)``, both ``[T, N]``, with ``returns = advantages + values``.
    """
    next_values = _next_state_values(values, next_value, terminated, truncated, truncation_values)
    deltas = rewards + gamma * next_values - values
    carry = gamma * gae_lambda * (~(terminated | truncated)).to(values.dtype)
    advantages = torch.empty_like(values)
    last = torch.zeros_like(next_value)
    for t in range(values.shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def compute_discounted_returns(
    *,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """N-step discounted returns bootstrapped from ``next_value`` (``use_gae=False``).

    Same arguments and shapes as :func:`compute_gae`.

    Returns:
        ``(advantages, returns)`` with ``advantages = returns - values``.
    """
    next_values = _next_state_values(values, next_value, terminated, truncated, truncation_values)
    ended = terminated | truncated
    returns = torch.empty_like(values)
    running = next_value
    for t in range(values.shape[0] - 1, -1, -1):
        # Within an episode the return flows on; where it ended, restart from the bootstrap.
        running = rewards[t] + gamma * torch.where(ended[t], next_values[t], running)
        returns[t] = running
    return returns - values, returns
