"""A policy's outputs are checked once where it is built, against the Policy protocol's shapes:
the error names the class, the output and the shape expected, before anything trains."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import open_dict
from tensordict import TensorDict
from torch import nn

import rl.engine.run
from rl.models import ActionHead, ActorCritic, PolicyBase, PolicyOutput, build_policy
from rl.models.policy import PolicyShapeError, check_policy

SPACE = gym.spaces.Dict(
    {"x": gym.spaces.Box(-1.0, 1.0, (4,), np.float32), "d": gym.spaces.Discrete(3)}
)


class MLP(PolicyBase):
    """A user's MLP; ``mistake`` makes one of its outputs the wrong shape."""

    def __init__(self, *, observation_space, action_space, mistake: str = "") -> None:
        super().__init__()
        self.keys = sorted(observation_space.spaces)
        size = sum(int(np.prod(s.shape)) or 1 for s in observation_space.spaces.values())
        self.body = nn.Sequential(nn.Linear(size, 16), nn.Tanh())
        self.actor, self.critic = ActionHead(action_space, 16), nn.Linear(16, 1)
        self.mistake = mistake

    def initial_state(self, num_envs, device="cpu"):
        if self.mistake == "state":
            return TensorDict({"h": torch.zeros(1, num_envs, 4)}, [1])  # layers-first
        return TensorDict({}, [num_envs])

    def forward(self, obs, episode_starts, state):
        t, n = episode_starts.shape
        x = torch.cat([obs[k].reshape(t, n, -1).float() for k in self.keys], -1)
        h = self.body(x)
        values = self.critic(h)
        if self.mistake != "values":
            values = values[..., 0]
        return PolicyOutput(self.actor(h), values), state


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        ("values", r"policy MLP: forward\(\)'s values has shape \[3, 2, 1\]; expected \[3, 2\]"),
        ("state", r"policy MLP: initial_state\(2\) is TensorDict .*expected a TensorDict of "
                  r"batch \[2\]"),
    ],
)  # fmt: skip
def test_a_wrong_shape_is_named_where_the_policy_is_built(mistake: str, message: str) -> None:
    with pytest.raises(PolicyShapeError, match=message):
        check_policy(MLP(observation_space=SPACE, action_space=gym.spaces.Discrete(3),
                         mistake=mistake), SPACE)  # fmt: skip


@pytest.mark.parametrize(
    "action_space",
    [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([2, 3])],
    ids=["discrete", "box", "multidiscrete"],
)
@pytest.mark.parametrize("rnn", [None, "gru", "lstm"])
def test_the_shipped_policies_pass_and_the_probe_changes_nothing(action_space, rnn) -> None:
    torch.manual_seed(0)
    model = ActorCritic(observation_space=SPACE, action_space=action_space, rnn=rnn,
                        trunk_layers=[8], rnn_hidden_size=8)  # fmt: skip
    model.train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check_policy(model, SPACE)
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())


def test_a_users_wrong_policy_fails_before_the_run_with_its_name(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["+experiment=ppo_cartpole", "+debug=smoke"])
    with open_dict(cfg):
        cfg.model = {"_target_": "tests.test_policy_checks.MLP", "_partial_": True,
                     "mistake": "values"}  # fmt: skip
    with pytest.raises(PolicyShapeError, match=r"policy MLP: forward\(\)'s values"):
        rl.engine.run.train(cfg)
    assert (
        not list((tmp_path / "run" / "checkpoints").glob("*.pt"))
        if (tmp_path / "run" / "checkpoints").exists()
        else True
    )


def test_build_policy_runs_the_check() -> None:
    with pytest.raises(PolicyShapeError):
        build_policy({"_target_": "tests.test_policy_checks.MLP", "_partial_": True,
                      "mistake": "values"}, SPACE, gym.spaces.Discrete(3))  # fmt: skip


def test_write_step_writes_matching_entries_as_given_and_checks_the_others() -> None:
    """write_step skips set()'s checks only for entries already of the step's batch and
    device: the others still go through them (a wrong batch is refused, not written)."""
    from rl.models import Categorical, policy_input
    from rl.models.policy import write_step

    step = policy_input({"x": torch.zeros(4, 2)}, torch.zeros(4, dtype=torch.bool),
                        TensorDict({}, [4], device="cpu"))  # fmt: skip
    values, state = torch.arange(4.0), TensorDict({"h": torch.ones(4, 3)}, [4], device="cpu")
    write_step(step, Categorical(torch.zeros(4, 3)), values, state)
    assert step["values"] is values and step["next_state", "h"] is state["h"]
    assert step["actions"].shape == (4,) and step["logprobs"].shape == (4,)
    with pytest.raises(RuntimeError, match="batch"):
        write_step(step, Categorical(torch.zeros(4, 3)), torch.zeros(3), state)
    with pytest.raises(RuntimeError, match="batch"):
        write_step(
            step, Categorical(torch.zeros(4, 3)), values, TensorDict({"h": torch.ones(3, 3)}, [3])
        )
