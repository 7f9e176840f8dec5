"""Advantage estimators: configured objects that fill a rollout's ``advantages`` and ``returns``.

``pipeline.advantage`` (a training setting a stage may override) is one of these, built from
its ``_target_`` (``conf/pipeline/advantage/``: ``gae``, ``returns``, ``vtrace``). The learner
calls it once per rollout, before the update's epochs::

    scalars = estimator(storage, model=model, next_value=next_value, gamma=gamma)

An estimator reads the recorded steps (:meth:`RolloutStorage.recorded`: ``rewards``,
``values``, ``terminated``, ``truncated``, ``truncation_values``, ``logprobs``, ``actions``,
``obs``, and any field a component records), writes ``[T, N]`` advantages and value targets
with :meth:`RolloutStorage.set_advantages`, and returns scalars to log (``{}`` for none).
A new estimator is a class with that ``__call__`` in a file of one's own, named by a YAML
``_target_``: nothing in the framework changes (``docs/concepts/pipeline.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Protocol, runtime_checkable

import torch

from rl.models.policy import Policy
from rl.storage.advantages import compute_discounted_returns, compute_gae, compute_vtrace
from rl.storage.rollout import RolloutStorage, sequence_start_state
from rl.utils.config import Check

__all__ = ["GAE", "AdvantageEstimator", "DiscountedReturns", "VTrace"]


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
        """Fill ``storage``'s ``advantages`` and ``returns``; what to log.

        Args:
            storage: The rollout (:meth:`RolloutStorage.recorded` are its steps).
            model: The learner's policy as it is now (V-trace re-runs it; most ignore it).
            next_value: ``[N]`` V(s_T) of the observation after the rollout, from collection.
            gamma: The discount factor (the ``gamma`` training setting).

        Returns:
            Scalars to log with the update's (``{}``: none).
        """
        ...


def _inputs(storage: RolloutStorage, next_value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The arguments of :mod:`rl.storage.advantages`' estimators, from the recorded steps."""
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
    """Generalised advantage estimation (Schulman et al., 2016) from the rollout's values.

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
    """V-trace (Espeholt et al., 2018): off-policy corrected targets with the current policy.

    The policy as it is now is re-run (without gradients) over the recorded steps from the
    rollout's first state, as the update's whole-rollout minibatches are, and one step
    further, over the observation after the rollout. That gives the target policy's
    log-probabilities of the recorded actions and, as in IMPALA, the learner's current values
    V(x_t) and V(x_T) (not the values recorded by the behaviour policy, which the value-loss
    clipping still uses). The behaviour log-probabilities are the recorded ``logprobs`` (PPO's
    ratio keeps using them too); under teacher forcing they are the policy's log-probabilities
    of the expert's actions, so forced steps count as the policy's own. A truncated episode
    bootstraps from the recorded ``truncation_values``: its final observation is not stored.

    Args:
        rho_bar: Truncation of the importance weights of the TD errors and advantages.
        c_bar: Truncation of the trace coefficients.
        vtrace_lambda: The paper's lambda in the trace coefficients (1: V-trace as defined).

    Logged: ``losses/vtrace/rho_mean`` (the mean importance weight pi/mu before clipping, 1 in
    expectation), ``losses/vtrace/rho_clipfrac`` (the fraction above ``rho_bar``; at
    ``rho_bar=1`` on-policy ratios that rounding puts just above 1 count too) and
    ``losses/vtrace/behaviour_kl`` (an estimate of KL(mu || pi) from the recorded actions: 0
    on-policy, it grows with the policy lag).
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
