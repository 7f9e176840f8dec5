"""Several agents in one environment: the PettingZoo adapter, agents as rows, masked losses."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from small import assert_same_step

from rl.collection.base import RolloutRequest
from rl.collection.local import InProcessCollector
from rl.losses import PPOLoss
from rl.models.policy import build_policy
from rl.sampling import build_sampler, finished_episodes
from rl.sampling.agents import AgentRows
from rl.storage.estimators import GAE
from rl.tasks import build_env, task_spaces
from rl.tasks.agents import AGENT_ACTIVE, AGENT_DONE, AGENT_REWARDS, stack_space, unstack_space

pytest.importorskip("pettingzoo")

# Agent 0 leaves after 2 steps, agent 1 after 4; agent 2 is still in when the episode is cut at 5.
CUE = {
    "_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter",
    "env": {
        "_target_": "rl_envs.toys.agents.CueAgents",
        "_partial_": True,
        "lifetimes": [2, 4, 6],
        "max_cycles": 5,
    },
}
MLP = {
    "_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [],
    "trunk_layers": [], "rnn": None, "head_layers": [16], "activation": "tanh",
}  # fmt: skip
CENTRAL = {**MLP, "critic_keys": ["state"], "critic_layers": [16]}
MULTIPROCESS = {
    "_target_": "rl.sampling.MultiprocessSampler", "_partial_": True, "num_processes": 2,
    "mp_start_method": "forkserver",
}  # fmt: skip


def cue_actions(step) -> np.ndarray:
    """The right action of every row (its cue), wrong for the rows of odd index."""
    cue = step["obs", "obs"][:, 0].long().numpy()
    wrong = np.arange(len(cue)) % 2 == 1
    return np.where(wrong, 1 - cue, cue)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 2.0, (3,)),
        gym.spaces.Discrete(5),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.MultiBinary(4),
    ],
    ids=["box", "discrete", "multidiscrete", "multibinary"],
)
def test_agent_spaces_stack_and_unstack(space) -> None:
    stacked = stack_space(space, 3)
    assert stacked.shape[:1] == (3,) and unstack_space(stacked) == space


def test_the_adapter_stacks_agents_and_reports_who_left() -> None:
    env = build_env(CUE)
    obs, info = env.reset(seed=0)
    assert obs["obs"].shape == (3, 2) and obs["state"].shape == (3, 6)
    assert info[AGENT_ACTIVE].all()
    seen = []
    for _ in range(5):
        cues = obs["obs"][:, 0].astype(np.int64)
        was_in = info[AGENT_ACTIVE]
        obs, reward, terminated, truncated, info = env.step(cues)
        seen.append((info[AGENT_DONE].tolist(), info[AGENT_ACTIVE].tolist()))
        assert reward == info[AGENT_REWARDS].sum()
        # rows of zeros for agents out before this step; the one leaving now: its last obs
        assert (obs["obs"][~was_in] == 0).all()
        assert (info[AGENT_REWARDS][~was_in] == 0).all()
    assert seen == [
        ([0, 0, 0], [True, True, True]),
        ([1, 0, 0], [False, True, True]),  # agent 0 terminated at its 2nd step
        ([0, 0, 0], [False, True, True]),
        ([0, 1, 0], [False, False, True]),
        ([0, 0, 2], [False, False, False]),  # agent 2 cut at the 5th
    ]
    assert truncated and not terminated
    # every agent repeated its cue: 1 per step it was in the episode
    assert info["episode_metrics"] == {"return/agent_0": 2.0, "return/agent_1": 4.0,
                                       "return/agent_2": 5.0}  # fmt: skip
    obs_space, action_space = task_spaces(CUE)
    assert obs_space["obs"].shape == (2,) and obs_space["state"].shape == (6,)
    assert action_space == gym.spaces.Discrete(2)


def test_every_agent_is_a_row_with_its_own_reward_and_end() -> None:
    with build_sampler(None, task=CUE, num_envs=2, seed=3) as sampler:
        assert isinstance(sampler, AgentRows) and sampler.num_envs == 6
        step = sampler.reset()
        assert step["obs", "obs"].shape == (6, 2) and step[AGENT_ACTIVE].all()
        ends = []
        for _ in range(5):
            actions = cue_actions(step)
            right = torch.as_tensor(actions == step["obs", "obs"][:, 0].long().numpy())
            result = sampler.step(actions)
            active = step[AGENT_ACTIVE]
            # each agent's own reward: 1 for its cue repeated, 0 once out of the episode
            assert torch.equal(result["rewards"], (right & active).float())
            ends.append((result["terminated"].tolist(), result["truncated"].tolist()))
            step = result
        episodes = finished_episodes(result)
    assert ends[1][0] == [True, False, False] * 2  # agent 0 of both environments leaves
    assert ends[3][0] == [False, True, False] * 2
    assert ends[4] == ([False] * 6, [True] * 6)  # the cut: every row's episode ends
    # the team's episodes, one per environment
    assert len(episodes) == 2 and all("return/agent_2" in e.metrics for e in episodes)
    assert "final_obs" in result.keys() and result["final_obs", "obs"].shape == (6, 2)


def test_multiprocess_agent_rows_equal_serial_ones() -> None:
    def run(config) -> list:
        with build_sampler(config, task=CUE, num_envs=3, seed=5) as sampler:
            steps = [sampler.reset()]
            for _ in range(12):
                steps.append(sampler.step(cue_actions(steps[-1])))
            return steps

    for a, b in zip(run(None), run(MULTIPROCESS), strict=True):
        assert_same_step(a, b)


def _rollout(model_cfg: dict, steps: int = 12):
    torch.manual_seed(0)
    sampler = build_sampler(None, task=CUE, num_envs=2, seed=1)
    model = build_policy(model_cfg, sampler.observation_space, sampler.action_space)
    collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
    rollout = collector.collect(RolloutRequest(num_steps=steps))
    GAE(gae_lambda=0.95)(rollout.storage, model=model, next_value=rollout.next_value, gamma=0.99)
    batch = next(rollout.storage.minibatches(1, torch.Generator().manual_seed(0)))
    collector.close()
    return model, batch


def _loss_and_grads(model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    output, _ = model(
        batch["obs"], batch["episode_starts"], model.initial_state(batch.shape[1], "cpu")
    )
    loss = PPOLoss()(batch=batch, output=output, step_count=0)
    loss.total.backward()
    return loss.total.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("model_cfg", [MLP, CENTRAL], ids=["shared", "centralised_critic"])
def test_steps_of_agents_out_of_the_episode_carry_no_weight(model_cfg: dict) -> None:
    model, batch = _rollout(model_cfg)
    out = ~batch[AGENT_ACTIVE]
    assert out.any() and (~out).any()  # both kinds of steps in the batch
    loss, grads = _loss_and_grads(model, batch)
    # Whatever the steps of absent agents hold (any values the pipeline could record there),
    # the loss and its gradients do not change.
    junk = batch.clone()
    g = torch.Generator().manual_seed(1)
    for key in ("advantages", "returns", "values"):
        noise = torch.randn(junk[key].shape, generator=g) * 50
        junk[key] = torch.where(out, noise, junk[key])
    logprobs = torch.rand(junk["logprobs"].shape, generator=g).clamp_min(1e-3).log()
    junk["logprobs"] = torch.where(out, logprobs, junk["logprobs"])
    junk["actions"] = torch.where(out, 1 - junk["actions"], junk["actions"])
    again, again_grads = _loss_and_grads(model, junk)
    assert torch.equal(loss, again)
    assert all(torch.equal(a, b) for a, b in zip(grads, again_grads, strict=True))
    # ... while the same change to the steps of agents in play does (the test can fail).
    live = batch.clone()
    live["advantages"] = torch.where(~out, live["advantages"] * 3 + 1, live["advantages"])
    assert not torch.equal(loss, _loss_and_grads(model, live)[0])


def test_a_centralised_critic_reads_the_state_and_the_actor_does_not() -> None:
    obs_space, action_space = task_spaces(CUE)
    model = build_policy(CENTRAL, obs_space, action_space)
    obs = {k: torch.rand(1, 4, *s.shape) for k, s in obs_space.spaces.items()}
    starts = torch.zeros(1, 4, dtype=torch.bool)
    out, _ = model(obs, starts, model.initial_state(4, "cpu"))
    changed = {**obs, "state": torch.rand(1, 4, 6)}
    out2, _ = model(changed, starts, model.initial_state(4, "cpu"))
    assert torch.equal(out.dist.logits, out2.dist.logits)  # the actor: the agent's own obs
    assert not torch.equal(out.values, out2.values)  # the critic: the global state


def test_an_aec_environment_goes_through_pettingzoos_conversion() -> None:
    pytest.importorskip("mpe2")
    aec = {"_target_": "mpe2.simple_spread_v3.env", "_partial_": True, "N": 2, "max_cycles": 5}
    task = {"_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter", "env": aec}
    with build_sampler(None, task=task, num_envs=2, seed=0) as sampler:
        assert isinstance(sampler, AgentRows) and sampler.num_envs == 4
        step = sampler.reset()
        for _ in range(5):
            step = sampler.step(np.zeros(4, dtype=np.int64))
        assert step["truncated"].all() and len(finished_episodes(step)) == 2
