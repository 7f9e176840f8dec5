"""A multi-agent task's sampler with every agent as one row of the batch (parameter sharing).

Environment ``e``'s agent ``i`` is row ``e * A + i``; one policy acts for every agent, and
everything downstream sees an ordinary batch of ``N * A`` rows:

- ``obs``/``final_obs`` ``[N, A, ...]`` become ``[N * A, ...]`` views; the task's other step
  fields (leading axis ``A``) become per row;
- ``rewards`` are the agent's own (``agent_rewards``), not the team's;
- a row ends where its agent ends (``agent_done``) or its environment does, so an agent that
  leaves early is not bootstrapped past and its recurrent state starts anew; ``agent_active``
  says which rows act (the others carry no weight in losses);
- finished episodes (the team's) stay per environment, on its first agent's row.

Exact resume and evaluation episode lists are the wrapped sampler's, per environment.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rl.sampling.base import EPISODES, Sampler
from rl.tasks.agents import (
    AGENT_DONE,
    AGENT_REWARDS,
    DONE_TERMINATED,
    DONE_TRUNCATED,
    num_agents,
    unstack_space,
)
from rl.tasks.fields import StepField

__all__ = ["AgentRows", "agent_rows"]

_CONSUMED = (AGENT_REWARDS, AGENT_DONE)  # turned into the rows' rewards and flags


def agent_rows(sampler: Sampler) -> Sampler:
    """``sampler`` with agents as rows where its task has several (else ``sampler`` itself)."""
    count = num_agents(sampler.step_fields)
    return sampler if count is None else AgentRows(sampler, count)


class AgentRows(Sampler):
    """``sampler`` (over a task stacked over ``agents`` agents) with one row per agent."""

    def __init__(self, sampler: Sampler, agents: int) -> None:
        self.inner, self.agents = sampler, agents
        self.num_envs = sampler.num_envs * agents
        self.observation_space = gym.spaces.Dict(
            {k: unstack_space(s) for k, s in sampler.observation_space.spaces.items()}
        )
        self.action_space = unstack_space(sampler.action_space)
        self.step_fields = {
            key: StepField(field.info, field.shape[1:], field.dtype, field.missing)
            for key, field in sampler.step_fields.items()
            if key not in _CONSUMED
        }
        for key, field in sampler.step_fields.items():
            if key not in _CONSUMED and field.shape[:1] != (agents,):
                raise ValueError(
                    f"step field {key!r} of a task with {agents} agents must be per agent "
                    f"(shape [{agents}, ...]), got shape {list(field.shape)}"
                )
        self.eval_mode = getattr(sampler, "eval_mode", False)

    def _rows(self, value: torch.Tensor) -> torch.Tensor:
        """``[n, A, ...]`` as ``[n * A, ...]``."""
        return value.reshape(-1, *value.shape[2:])

    def _per_env(self, value: torch.Tensor) -> torch.Tensor:
        """``[n]`` repeated for each agent: ``[n * A]``."""
        return value.repeat_interleave(self.agents)

    def _convert(self, step: TensorDict) -> TensorDict:
        n = step.batch_size[0] * self.agents
        obs = step.get("obs")
        data: dict[str, Any] = {
            "obs": TensorDict({k: self._rows(v) for k, v in obs.items()}, batch_size=[n])
        }
        for key in self.step_fields:
            data[key] = self._rows(step.get(key))
        if "rewards" not in step.keys():  # a reset
            return TensorDict(data, batch_size=[n])
        done = self._rows(step.get(AGENT_DONE))
        terminated = (done == DONE_TERMINATED) | self._per_env(step.get("terminated"))
        truncated = (done == DONE_TRUNCATED) | self._per_env(step.get("truncated"))
        truncated &= ~terminated
        data["rewards"] = self._rows(step.get(AGENT_REWARDS))
        data["terminated"], data["truncated"] = terminated, truncated
        data["paused"] = self._per_env(step.get("paused"))
        if truncated.any():
            # The environment's final observations; an agent cut alone (its environment goes
            # on) has this step's.
            env_cut = self._per_env(step.get("truncated"))
            final = step.get("final_obs") if "final_obs" in step.keys() else None
            rows = {}
            for key, value in data["obs"].items():
                row = value.clone()
                if final is not None:
                    row[env_cut] = self._rows(final.get(key))[env_cut]
                rows[key] = row
            data["final_obs"] = TensorDict(rows, batch_size=[n])
        if EPISODES in step.keys():  # on each environment's first agent's row
            episodes = TensorDict({}, batch_size=[n])
            for key, value in step.get(EPISODES).items(include_nested=True, leaves_only=True):
                episodes.set(key, self._per_env(value))
            ended = episodes.get("ended")
            episodes.set(
                "ended", ended & (torch.arange(n, device=ended.device) % self.agents == 0)
            )
            data[EPISODES] = episodes
        return TensorDict(data, batch_size=[n])

    @property
    def num_active(self) -> int:
        """Rows still running (every agent of the active environments)."""
        return self.inner.num_active * self.agents

    def reset(self) -> TensorDict:
        """Reset every environment; one row per agent."""
        return self._convert(self.inner.reset())

    def new_episodes(self) -> TensorDict:
        """Cut every episode and start new ones (training mode)."""
        return self._convert(self.inner.new_episodes())

    def step(self, actions: np.ndarray) -> TensorDict:
        """Step with one action per row (``[n * A, ...]``)."""
        actions = np.asarray(actions)
        stacked = actions.reshape(-1, self.agents, *actions.shape[1:])
        return self._convert(self.inner.step(stacked))

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sampler's episodes in flight."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore the wrapped sampler's episodes in flight; one row per agent."""
        return self._convert(self.inner.load_state_dict(state))

    def render(self, env_index: int = 0) -> Any:
        """One environment's frame (all its agents)."""
        return self.inner.render(env_index)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close the wrapped sampler."""
        self.inner.close()
