"""The core is open where researchers extend it: their own policy class through the config, and
a new per-step field with a loss reading it, touching no storage or transport code.

``CountingPolicy`` below is a researcher's policy (not an ``ActorCritic``): an MLP with its own
recurrent state (a step counter, ``{"count": [N, 1]}``), which records a per-step field
(``count_target``: the counter's value) by writing it into the step in ``act``; its
``forward`` outputs the counter it recomputes over a sequence and a prediction of it
(:attr:`rl.models.PolicyOutput.extras`). ``CountLoss`` is a researcher's auxiliary loss that
reads the field from the minibatch, checks it against the recomputed counter step by step (so
the field is aligned with its steps and each sequence starts from its stored state), and
regresses the prediction on it. Both are named as ``_target_``s in the config and go
through the real engine, in process and through a collection worker process (the field
crosses the process boundary in the shipped rollout).
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import pytest
import torch
from omegaconf import open_dict
from tensordict import TensorDict
from torch import nn

import rl.engine.run
from rl.losses import Loss, LossOutput
from rl.models import ActionHead, PolicyBase, PolicyOutput


class CountingPolicy(PolicyBase):
    """An MLP actor-critic that counts the steps of each episode in its recurrent state."""

    def __init__(
        self, *, observation_space: gym.spaces.Dict, action_space: gym.Space, hidden: int = 32
    ) -> None:
        super().__init__()
        size = sum(int(torch.tensor(s.shape).prod()) for s in observation_space.spaces.values())
        self.keys = sorted(observation_space.spaces)
        self.body = nn.Sequential(nn.Linear(size, hidden), nn.Tanh())
        self.actor = ActionHead(action_space, hidden)
        self.critic = nn.Linear(hidden, 1)
        self.count_head = nn.Linear(1, 1)  # what CountLoss trains, from zero
        nn.init.zeros_(self.count_head.weight)
        nn.init.zeros_(self.count_head.bias)

    def initial_state(self, num_envs: int, device: torch.device | str = "cpu") -> TensorDict:
        """The step counter of each environment's episode."""
        return TensorDict({"count": torch.zeros(num_envs, 1, device=device)}, [num_envs])

    def forward(
        self, obs: Mapping[str, torch.Tensor], episode_starts: torch.Tensor, state: TensorDict
    ) -> tuple[PolicyOutput, TensorDict]:
        """Actor, critic and the count prediction over ``[T, N]``; the counter after."""
        t_len, n = episode_starts.shape
        count, counts = state["count"][:, 0], []
        for t in range(t_len):  # reset at episode starts, then count this step
            count = torch.where(episode_starts[t], torch.zeros_like(count), count) + 1
            counts.append(count)
        steps = torch.stack(counts)  # [T, N]
        x = torch.cat([obs[k].reshape(t_len, n, -1).float() for k in self.keys], -1)
        features = self.body(x)
        predicted = self.count_head(steps.unsqueeze(-1) / 100.0)[..., 0]
        extras = {"count": steps, "predicted_count": predicted}
        output = PolicyOutput(self.actor(features), self.critic(features)[..., 0], extras)
        return output, TensorDict({"count": count.unsqueeze(-1)}, [n])

    @torch.no_grad()
    def act(self, step: TensorDict, **kwargs) -> TensorDict:  # noqa: ANN003, D102
        step = super().act(step, **kwargs)
        step["count_target"] = step["next_state", "count"][:, 0].clone()  # the new field
        return step


class CountLoss(Loss):
    """Regress the policy's ``predicted_count`` on the recorded ``count_target`` field."""

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Mean squared error of the prediction (counts in hundreds of steps)."""
        target = batch["count_target"]
        if not torch.equal(target, output.extras["count"]):
            raise AssertionError("count_target does not line up with the steps it was recorded at")
        loss = (output.extras["predicted_count"] - target / 100.0).pow(2).mean()
        untrained = (target / 100.0).pow(2).mean()  # the zero-initialised head's error
        return LossOutput(
            total=loss, terms={"count_mse": loss.item(), "untrained_mse": untrained.item()}
        )


@pytest.mark.learning
@pytest.mark.parametrize(
    "collector",
    [[], ["collector=process", "collector.mode=sync"]],
    ids=["in-process", "process-worker"],
)
def test_a_users_policy_and_a_new_field_train_end_to_end(compose_cfg, collector) -> None:
    cfg = compose_cfg(
        [
            "+experiment=ppo_cartpole",
            "total_env_steps=24576",
            "eval.num_episodes=10",
            "logger.sinks.console.progress_bar=false",
            "torch_threads=1",
            "+pipeline.named_losses.count={_target_: tests.test_open_core.CountLoss}",
            "pipeline.stages.0.loss_names=[ppo,count]",
            "trusted_targets=[tests.test_open_core.*]",
            *collector,
        ]  # fmt: skip
    )
    with open_dict(cfg):
        cfg.model = {"_target_": "tests.test_open_core.CountingPolicy", "_partial_": True}
    metrics = rl.engine.run.train(cfg)  # CountLoss checked every minibatch's field
    # The head learned the count: over seeds 1-8 its error was 0.7-4% of the untrained head's
    # on the same minibatches; and PPO on the rest learned (evaluation return 97-192 for seeds
    # 1-8 at this budget; a random policy: about 22).
    count, untrained = metrics["losses/count/count_mse"], metrics["losses/count/untrained_mse"]
    assert 0.0 <= count < 0.25 * untrained, metrics
    assert metrics["eval/episodic_return"] > 50, metrics
