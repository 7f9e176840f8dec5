"""Policies: the protocol, the default actor-critic, action distributions, building one."""

from rl.models.actor_critic import ActorCritic
from rl.models.distributions import (
    ActionDistribution,
    ActionHead,
    Categorical,
    DiagGaussian,
    MultiCategorical,
)
from rl.models.grouped import GroupedDistribution, GroupedPolicy
from rl.models.lstm import lstm_sequence
from rl.models.policy import (
    Policy,
    PolicyBase,
    PolicyOutput,
    build_policy,
    empty_state,
    policy_input,
)
from rl.models.value_norm import ValueNorm

__all__ = [
    "ActionDistribution",
    "ActionHead",
    "ActorCritic",
    "Categorical",
    "DiagGaussian",
    "GroupedDistribution",
    "GroupedPolicy",
    "MultiCategorical",
    "Policy",
    "PolicyBase",
    "PolicyOutput",
    "ValueNorm",
    "build_policy",
    "empty_state",
    "lstm_sequence",
    "policy_input",
]
