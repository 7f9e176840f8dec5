"""Policies and value functions."""

from rl.models.actor_critic import ActorCritic, ActorCriticOutput
from rl.models.factory import build_model

__all__ = ["ActorCritic", "ActorCriticOutput", "build_model"]
