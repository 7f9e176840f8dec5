"""Advantage estimation: pure functions over time-major tensors, and the configured estimators.

:func:`compute_gae` (Schulman et al., 2016), :func:`compute_discounted_returns` and
:func:`compute_vtrace` (Espeholt et al., 2018, IMPALA) keep terminations and truncations apart
(Pardo et al., 2018): after a termination the next value is 0, after a truncation it is the
final observation's (``truncation_values``), and no trace flows into the next episode.

``pipeline.advantage`` builds :class:`GAE`, :class:`DiscountedReturns` or :class:`VTrace`
(:class:`AdvantageEstimator`); the learner calls it once per rollout, before the update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Protocol, runtime_checkable

import torch

from rl.models.policy import Policy
from rl.storage.rollout import RolloutStorage, sequence_start_state
from rl.utils.config import Check

__all__ = [
    "GAE",
    "AdvantageEstimator",
    "DiscountedReturns",
    "VTrace",
    "compute_discounted_returns",
    "compute_gae",
    "compute_vtrace",
]


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


def _discounted_sums(deltas: torch.Tensor, carry: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[t] = deltas[t] + carry[t] * out[t + 1]``, backwards over time (0 after the end)."""
    last = torch.zeros_like(out[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        out[t] = last
    return out


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
        rewards: ``[T, N]`` reward after the action at step t.
        values: ``[T, N]`` V(s_t) from the rollout.
        next_value: ``[N]`` V(s_T) of the observation after the rollout.
        terminated: ``[T, N]`` bool, step t reached a terminal state.
        truncated: ``[T, N]`` bool, the episode was cut at step t (never both).
        truncation_values: ``[T, N]`` V(final observation) where ``truncated`` (ignored elsewhere).
        gamma: Discount factor.
        gae_lambda: GAE's lambda (1: Monte-Carlo advantages, 0: one-step TD errors).

    Returns:
        ``(advantages, returns)``, both ``[T, N]``, with ``returns = advantages + values``.
    """
    next_values = _next_state_values(values, next_value, terminated, truncated, truncation_values)
    deltas = rewards + gamma * next_values - values
    carry = gamma * gae_lambda * (~(terminated | truncated)).to(values.dtype)
    advantages = _discounted_sums(deltas, carry, torch.empty_like(values))
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
    """N-step discounted returns bootstrapped from ``next_value`` (arguments: :func:`compute_gae`).

    Returns:
        ``(advantages, returns)``, both ``[T, N]``, with ``advantages = returns - values``.
    """
    next_values = _next_state_values(values, next_value, terminated, truncated, truncation_values)
    ended = terminated | truncated
    returns = torch.empty_like(values)
    running = next_value
    for t in range(values.shape[0] - 1, -1, -1):
        # Where the episode ended, restart from the bootstrap.
        running = rewards[t] + gamma * torch.where(ended[t], next_values[t], running)
        returns[t] = running
    return returns - values, returns


def compute_vtrace(
    *,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    vtrace_lambda: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al., 2018), time-major.

    With ``ratio_t = pi(a_t|x_t) / mu(a_t|x_t)``, ``rho_t = min(rho_bar, ratio_t)``,
    ``c_t = vtrace_lambda * min(c_bar, ratio_t)`` and
    ``delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))``:

        ``v_s = V(x_s) + sum_{t >= s} gamma^(t - s) * (c_s ... c_{t-1}) * delta_t``,

    summed to the end of ``s``'s episode within the rollout, with ``V(x_{t+1})`` as in
    :func:`compute_gae` (the paper assumes ``rho_bar >= c_bar``). The advantages are IMPALA's
    ``rho_s * (r_s + gamma * v_{s+1} - V(x_s))`` (``rho_s`` clipped at ``rho_bar`` too, IMPALA's
    default), ``v_{s+1}`` being the bootstrap value where the episode or rollout ends.
    On-policy with ``rho_bar, c_bar >= 1``, the targets are :func:`compute_discounted_returns`'
    at ``vtrace_lambda = 1`` and GAE's lambda-returns below. Call it without gradients.

    Args:
        rewards: ``[T, N]`` reward after the action at step t.
        values: ``[T, N]`` V(x_t) (IMPALA: the target policy's value function).
        next_value: ``[N]`` V(x_T) of the observation after the rollout.
        terminated: ``[T, N]`` bool, step t reached a terminal state.
        truncated: ``[T, N]`` bool, the episode was cut at step t (never both).
        truncation_values: ``[T, N]`` V(final observation) where ``truncated`` (ignored elsewhere).
        behaviour_logprobs: ``[T, N]`` log mu(a_t|x_t), of the policy that collected the rollout.
        target_logprobs: ``[T, N]`` log pi(a_t|x_t), of the policy being learnt.
        gamma: Discount factor.
        rho_bar: Truncation of the importance weights in ``delta_t`` and the advantages (the
            fixed point's policy lies between mu and pi, pi at ``rho_bar = inf``).
        c_bar: Truncation of the trace coefficients ``c_t``.
        vtrace_lambda: The paper's lambda in ``c_t`` (its remark 2; 1: V-trace as defined).

    Returns:
        ``(advantages, vs)``, both ``[T, N]`` (in general ``vs != advantages + values``).
    """
    next_values = _next_state_values(values, next_value, terminated, truncated, truncation_values)
    ended = terminated | truncated
    ratios = (target_logprobs - behaviour_logprobs).exp()
    rhos = ratios.clamp(max=rho_bar)
    cs = vtrace_lambda * ratios.clamp(max=c_bar)
    deltas = rhos * (rewards + gamma * next_values - values)
    carry = gamma * cs * (~ended).to(values.dtype)
    vs = values + _discounted_sums(deltas, carry, torch.empty_like(values))  # v_s - V(x_s)
    # v_{s+1} within the episode; at its end the bootstrap V(x_{s+1}) (0 if terminal).
    following = torch.cat([vs[1:], next_value.unsqueeze(0)], dim=0)
    vs_next = torch.where(ended, next_values, following)
    return rhos * (rewards + gamma * vs_next - values), vs


@runtime_checkable
class AdvantageEstimator(Protocol):
    """What ``pipeline.advantage`` builds: fills a rollout's advantages and value targets."""

    def __call__(
        self,
        storage: RolloutStorage,
        *,
        model: Policy,
        next_value: torch.Tensor,
        gamma: float,
    ) -> Mapping[str, float]:
        """Fill ``storage``'s ``advantages`` and ``returns``; return scalars to log.

        Args:
            storage: The rollout.
            model: The learner's policy as it is now (V-trace re-runs it; most ignore it).
            next_value: ``[N]`` V(s_T) of the observation after the rollout, from collection.
            gamma: The discount factor.
        """
        ...


def _inputs(storage: RolloutStorage, next_value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The arguments of the ``compute_*`` functions, from the recorded steps."""
    steps = storage.recorded()
    return {
        "rewards": steps["rewards"],
        "values": steps["values"],
        "next_value": next_value,
        "terminated": steps["terminated"],
        "truncated": steps["truncated"],
        "truncation_values": steps["truncation_values"],
    }


@dataclasses.dataclass(frozen=True)
class GAE:
    """Generalised advantage estimation (:func:`compute_gae`) from the rollout's values.

    Args:
        gae_lambda: The bias-variance trade-off (1: Monte-Carlo advantages, 0: one-step TD).
    """

    gae_lambda: Annotated[float, Check(ge=0, le=1)] = 0.95

    def __call__(
        self,
        storage: RolloutStorage,
        *,
        model: Policy,
        next_value: torch.Tensor,
        gamma: float,
    ) -> Mapping[str, float]:
        """See :class:`AdvantageEstimator`."""
        del model
        adv, ret = compute_gae(
            **_inputs(storage, next_value), gamma=gamma, gae_lambda=self.gae_lambda
        )
        storage.set_advantages(adv, ret)
        return {}


@dataclasses.dataclass(frozen=True)
class DiscountedReturns:
    """N-step discounted returns bootstrapped at the rollout's end; advantages = returns - V."""

    def __call__(
        self,
        storage: RolloutStorage,
        *,
        model: Policy,
        next_value: torch.Tensor,
        gamma: float,
    ) -> Mapping[str, float]:
        """See :class:`AdvantageEstimator`."""
        del model
        adv, ret = compute_discounted_returns(**_inputs(storage, next_value), gamma=gamma)
        storage.set_advantages(adv, ret)
        return {}


@dataclasses.dataclass(frozen=True)
class VTrace:
    """V-trace (:func:`compute_vtrace`): off-policy corrected targets with the current policy.

    The current policy is re-run without gradients over the recorded steps from the rollout's
    first state, and one step further: the target log-probabilities and, as in IMPALA, the
    current values (the recorded ones still serve value clipping). The behaviour
    log-probabilities are the recorded ``logprobs``; under teacher forcing those are of the
    expert's actions, so forced steps count as the policy's own. Truncated episodes bootstrap
    from the recorded ``truncation_values`` (final observations are not stored).

    Args:
        rho_bar: Truncation of the importance weights of the TD errors and advantages.
        c_bar: Truncation of the trace coefficients.
        vtrace_lambda: The paper's lambda in the trace coefficients (1: V-trace as defined).

    Logs ``losses/vtrace/rho_mean`` (mean pi/mu before clipping), ``rho_clipfrac`` (the fraction
    above ``rho_bar``; rounding puts some on-policy ratios just above 1) and ``behaviour_kl``
    (KL(mu || pi) estimated on the recorded actions: grows with the policy lag).
    """

    rho_bar: Annotated[float, Check(gt=0)] = 1.0
    c_bar: Annotated[float, Check(gt=0)] = 1.0
    vtrace_lambda: Annotated[float, Check(ge=0, le=1)] = 1.0

    @torch.no_grad()
    def __call__(
        self,
        storage: RolloutStorage,
        *,
        model: Policy,
        next_value: torch.Tensor,
        gamma: float,
    ) -> Mapping[str, float]:
        """See :class:`AdvantageEstimator` (``next_value`` is recomputed with ``model``)."""
        del next_value
        t = storage.step
        rows = storage.rows()  # [T + 1, N]
        steps, after = rows[:t], rows[t:]
        model.train()  # as in the update's forward passes
        output, state = model(steps["obs"], steps["episode_starts"], sequence_start_state(rows))
        following, _ = model(after["obs"], after["episode_starts"], state)
        target_logprobs = output.dist.log_prob(steps["actions"])
        behaviour_logprobs = steps["logprobs"]
        inputs = _inputs(storage, following.values[0])
        adv, ret = compute_vtrace(
            **{**inputs, "values": output.values},
            behaviour_logprobs=behaviour_logprobs,
            target_logprobs=target_logprobs,
            gamma=gamma,
            rho_bar=self.rho_bar,
            c_bar=self.c_bar,
            vtrace_lambda=self.vtrace_lambda,
        )
        storage.set_advantages(adv, ret)
        log_ratios = target_logprobs - behaviour_logprobs
        ratios = log_ratios.exp()
        rho_mean, clipfrac, kl = torch.stack(
            [
                ratios.mean(),
                (ratios > self.rho_bar).float().mean(),
                (ratios - 1.0 - log_ratios).mean(),  # KL(mu || pi), PPO's approx_kl estimator
            ]
        ).tolist()  # one host read
        return {
            "losses/vtrace/rho_mean": rho_mean,
            "losses/vtrace/rho_clipfrac": clipfrac,
            "losses/vtrace/behaviour_kl": kl,
        }
