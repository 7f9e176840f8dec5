"""Policies and value functions."""

from rl.models.actor_critic import ActorCritic, ActorCriticOutput

__all__ = ["ActorCritic", "ActorCriticOutput"]
