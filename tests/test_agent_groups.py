"""Groups of agents of different kinds, one policy each; value normalisation (MAPPO)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hydra.errors import InstantiationException

from rl.checkpoints.config_tree import saved_choices
from rl.checkpoints.errors import UntrustedCheckpointError
from rl.collection.base import RolloutRequest
from rl.collection.local import InProcessCollector
from rl.engine import run
from rl.losses import PPOLoss
from rl.models import GroupedPolicy, ValueNorm, build_policy
from rl.models.grouped import GROUP_ENTRY
from rl.sampling import build_sampler
from rl.storage.estimators import GAE
from rl.tasks import build_env, task_layout
from rl.tasks.agents import AGENT_ACTIVE, AGENT_GROUP, union_action_space

pytest.importorskip("pettingzoo")


def cue_task(groups, choices=(2, 3, 3), lifetimes=(2, 4, 6)) -> dict:
    """CueAgents whose agents choose among ``choices`` values (``choose<n>_<i>``)."""
    return {
        "_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter",
        "env": {"_target_": "rl_envs.toys.agents.CueAgents", "_partial_": True,
                "lifetimes": list(lifetimes), "max_cycles": 5, "choices": list(choices)},
        "groups": groups,
    }  # fmt: skip


GROUPS = cue_task("prefix")
MLP = {
    "_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [],
    "trunk_layers": [], "rnn": None, "head_layers": [16], "activation": "tanh",
}  # fmt: skip
GRU = {**MLP, "trunk_layers": [16], "rnn": "gru", "rnn_hidden_size": 8}
GROUPED = {"_target_": "rl.models.GroupedPolicy", "_partial_": True, "policy": GRU}


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def grouped_policy(cfg: dict = GROUPED, task: dict = GROUPS) -> GroupedPolicy:
    layout = task_layout(task)
    return build_policy(cfg, layout.observation_space, layout.action_space, groups=layout.groups)


def test_the_rows_action_space_joins_the_groups_ones() -> None:
    assert union_action_space([gym.spaces.Discrete(3), gym.spaces.Discrete(5)]) == (
        gym.spaces.Discrete(5)
    )
    box = union_action_space([gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(0, 3, (3,))])
    assert box.shape == (3,)
    assert box.low.tolist() == [-1, -1, 0] and box.high.tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="cannot share rows"):
        union_action_space([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])


def test_agents_of_different_kinds_need_groups_named_over_all_agents() -> None:
    with pytest.raises(
        InstantiationException, match=r"agent 'choose3_1' has the obs.*task\.groups"
    ):
        build_env(cue_task(None))
    bad = [
        ({"a": ["choose2_0"], "b": ["choose3_1"]}, r"in no group: \['choose3_2'\]"),
        ({"a": ["choose2_0", "choose3_1"], "b": ["choose3_2"]}, "group 'a'"),
        ({"a": ["choose2_0", "x"], "b": ["choose3_1", "choose3_2"]}, r"environment: \['x'\]"),
        ({"a": ["choose2_0"], "b": ["choose3_1", "choose3_2", "choose2_0"]}, "in two groups"),
    ]
    for groups, message in bad:
        with pytest.raises(InstantiationException, match=message):
            build_env(cue_task(groups))


def test_each_group_has_its_own_entry_and_the_policy_its_own_spaces() -> None:
    env = build_env(GROUPS)
    try:
        obs, _ = env.reset(seed=0)
        assert obs[AGENT_GROUP].tolist() == [0, 1, 1]
        own = obs["obs"]
        assert own["choose2"].shape == (3, 3) and own["choose3"].shape == (3, 4)
        assert not own["choose2"][1:].any() and not own["choose3"][0].any()  # others' rows: 0
        assert own["choose2"][0, :2].sum() == 1 and (own["choose3"][1:, :3].sum(1) == 1).all()
        assert env.action_space == gym.spaces.MultiDiscrete([3, 3, 3])  # the union, Discrete(3)
    finally:
        env.close()
    layout = task_layout(GROUPS)
    assert [(g.name, g.agents) for g in layout.groups] == [("choose2", (0,)), ("choose3", (1, 2))]
    two, three = layout.groups
    assert two.action_space == gym.spaces.Discrete(2) and three.action_space.n == 3
    assert two.observation_space["obs"].shape == (3,) and three.observation_space["obs"].shape == (
        4,
    )
    assert set(two.observation_space.spaces) == {"obs", "state"}  # not agent_group
    with pytest.raises(ValueError, match="model=grouped"):
        build_policy(MLP, layout.observation_space, layout.action_space, groups=layout.groups)
    with pytest.raises(ValueError, match=r"group_policies: \['choose4'\] are not groups"):
        grouped_policy({**GROUPED, "group_policies": {"choose4": {"head_layers": [4]}}})
    wider = grouped_policy({**GROUPED, "group_policies": {"choose3": {"rnn_hidden_size": 12}}})
    assert wider.policies["choose2"].rnn.hidden_size == 8
    assert wider.policies["choose3"].rnn.hidden_size == 12


def _rollout(model, task=GROUPS, steps: int = 10):
    sampler = build_sampler(None, task=task, num_envs=2, seed=1)
    collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
    rollout = collector.collect(RolloutRequest(num_steps=steps))
    GAE(gae_lambda=0.95)(rollout.storage, model=model, next_value=rollout.next_value, gamma=0.99)
    batch = next(rollout.storage.minibatches(1, torch.Generator().manual_seed(0)))
    collector.close()
    return batch


def test_a_grouped_policy_is_each_groups_policy_on_its_rows() -> None:
    torch.manual_seed(0)
    model = grouped_policy()
    batch = _rollout(model)  # 2 environments x 3 agents, columns shuffled
    obs, starts = batch["obs"], batch["episode_starts"]
    group = obs[AGENT_GROUP]
    assert (group == group[0]).all()  # a column is one agent throughout
    assert batch["actions"][group == 0].max() <= 1 and batch["actions"].max() == 2
    out, after = model(obs, starts, model.initial_state(6, "cpu"))
    for g, name in enumerate(("choose2", "choose3")):
        index = (group[0] == g).nonzero().squeeze(1)
        assert len(index) == (2 if g == 0 else 4)
        sub = model.policies[name]
        sub_obs = {"obs": obs[f"obs/{name}"][:, index], "state": obs["state"][:, index]}
        sub_out, sub_after = sub(sub_obs, starts[:, index], sub.initial_state(len(index), "cpu"))
        logp = out.dist.log_prob(batch["actions"])[:, index]
        assert torch.equal(logp, sub_out.dist.log_prob(batch["actions"][:, index]))
        assert torch.equal(out.values[:, index], sub_out.values)
        assert torch.equal(out.dist.entropy()[:, index], sub_out.dist.entropy())
        assert torch.equal(after[name]["h"][index], sub_after["h"])
    first = (group[0] == 0).nonzero().squeeze(1)
    # A loss on one group's rows trains that group's policy only.
    model.zero_grad()
    out.values[:, first].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.policies["choose3"].parameters())
    assert any(p.grad is not None and p.grad.any() for p in model.policies["choose2"].parameters())


@pytest.mark.learning
def test_groups_of_agents_learn_with_a_policy_each(compose_cfg, tmp_path) -> None:
    """Each kind of agent learns to repeat its own cue (of 2 or 3 values) in 20k agent-steps."""
    env = [
        "task.env._target_=rl_envs.toys.agents.CueAgents", "~task.env.max_cycles",
        "~task.env.continuous_actions", "+task.env.lifetimes=[4,4,4]",
        "+task.env.choices=[2,3,3]",
    ]  # fmt: skip
    cfg = compose_cfg(
        ["+experiment=mappo_speaker_listener", *env, "total_env_steps=20_000",
         "model.policy.value_norm=true", "eval.num_episodes=20", "eval.num_envs=4",
         "pipeline.save_interval=20_000", "pipeline.num_steps=32"]
    )  # fmt: skip
    run.train(cfg)
    final = [
        m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/return/choose2_0" in m
    ][-1]
    # Random: 2 of 4 steps right for choose2_0, 1.33 for the others; perfect: 4.
    assert final["eval/return/choose2_0"] >= 3.5
    assert final["eval/return/choose3_1"] >= 3.5 and final["eval/return/choose3_2"] >= 3.5


# ------------------------------------------------------------------ value normalisation
def test_value_norm_follows_the_targets_debiased_moving_moments() -> None:
    norm = ValueNorm(beta=0.9)
    mean, std = norm.stats()
    assert (float(mean), float(std)) == (0.0, 1.0)  # before any target: the identity
    norm.update(10.0, 10.0**2 + 4.0)  # a batch of mean 10, std 2
    mean, std = norm.stats()
    assert float(mean) == pytest.approx(10.0) and float(std) == pytest.approx(2.0)
    norm.update(20.0, 20.0**2 + 4.0)
    w = np.array([0.9 * 0.1, 0.1]) / (0.9 * 0.1 + 0.1)  # debiased weights of the two batches
    mean_sq = w @ [104.0, 404.0]
    expect = w @ [10.0, 20.0]
    assert float(norm.stats()[0]) == pytest.approx(expect)
    assert float(norm.stats()[1]) == pytest.approx(np.sqrt(mean_sq - expect**2))
    x = torch.tensor([0.0, 1.0])
    assert torch.allclose(norm.denormalize(x), norm.stats()[0] + x * norm.stats()[1])
    with pytest.raises(ValueError, match="value_norm_beta"):
        ValueNorm(beta=1.0)


def test_value_norm_makes_the_value_loss_one_of_normalised_units() -> None:
    torch.manual_seed(0)
    layout = task_layout(cue_task(None, choices=(2, 2, 2)))
    spaces = (layout.observation_space, layout.action_space)
    plain = build_policy(MLP, *spaces)
    normed = build_policy({**MLP, "value_norm": True}, *spaces)
    normed.load_state_dict(plain.state_dict(), strict=False)
    normed.value_norm.update(5.0, 25.0 + 9.0)  # mean 5, std 3
    batch = _rollout(plain, cue_task(None, choices=(2, 2, 2)))
    obs, starts = batch["obs"], batch["episode_starts"]
    out_plain, _ = plain(obs, starts, plain.initial_state(6, "cpu"))
    out_normed, _ = normed(obs, starts, normed.initial_state(6, "cpu"))
    # The same head, its output in the targets' units: values * 3 + 5.
    assert torch.allclose(out_normed.values, out_plain.values * 3 + 5, atol=1e-5)
    loss = PPOLoss(use_clipped_value_loss=False)
    expect = 0.5 * ((out_plain.values - (batch["returns"] - 5) / 3) ** 2)
    weights = batch[AGENT_ACTIVE].float()
    expect = ((expect * weights).sum() / weights.sum()).detach()
    with torch.no_grad():
        got = loss(batch=batch, output=out_normed, step_count=0).terms["value_loss"]
    assert got == pytest.approx(float(expect), rel=1e-5)
    assert GROUP_ENTRY == AGENT_GROUP  # (the policy's key is the tasks')


def test_the_learner_folds_each_rollouts_returns_into_the_statistics(compose_cfg, tmp_path):
    cfg = compose_cfg(
        ["+experiment=mappo_mpe", "+debug=smoke", "+task.env.max_cycles=10",
         "eval.num_episodes=0", "model.value_norm=true", "model.value_norm_beta=0.5"]
    )  # fmt: skip
    run.train(cfg)
    logged = [
        m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if "value_norm/mean" in m
    ]
    assert logged and all(m["value_norm/std"] > 0.1 for m in logged)
    assert logged[0]["value_norm/mean"] < -0.5  # simple_spread's returns are negative
    checkpoint = sorted((tmp_path / "run" / "checkpoints").glob("*.pt"))[-1]
    state = torch.load(checkpoint, weights_only=True)["model"]
    assert float(state["value_norm.debiasing"]) > 0.5  # saved with the weights: resume has it


def test_a_group_chosen_at_a_package_of_its_own_is_a_saved_choice() -> None:
    """A grouped run saves ``model@model.policy: mlp``; names only, as for any choice."""
    choices = {"model": "grouped", "model@model.policy": "nav_cnn_gru"}
    assert saved_choices(choices, "ckpt") == choices
    for bad in ("model@model/../x", "model@", "model@a..b", "model@a b", "m@a@b", "model@a;b"):
        with pytest.raises(UntrustedCheckpointError, match="is not a group and option name"):
            saved_choices({bad: "mlp"}, "ckpt")


def test_box_actions_of_different_lengths_share_padded_rows() -> None:
    """MPE's continuous speaker (3 values) and listener (5): each gets its own part of a row."""
    pytest.importorskip("mpe2")
    task = {
        "_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter",
        "env": {"_target_": "mpe2.simple_speaker_listener_v4.parallel_env", "_partial_": True,
                "continuous_actions": True},
        "groups": "prefix",
    }  # fmt: skip
    layout = task_layout(task)
    assert layout.action_space.shape == (5,)
    assert [g.action_space.shape for g in layout.groups] == [(3,), (5,)]
    env = build_env(task)
    try:
        env.reset(seed=0)
        sent = {}
        inner_step = env.env.step
        env.env.step = lambda actions: sent.update(actions) or inner_step(actions)
        env.step(np.arange(10, dtype=np.float32).reshape(2, 5) / 10)
        assert sent["speaker_0"].tolist() == pytest.approx([0.0, 0.1, 0.2])
        assert sent["listener_0"].tolist() == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9])
    finally:
        env.close()
    torch.manual_seed(0)
    model = grouped_policy({**GROUPED, "policy": MLP}, task)
    obs = {k: torch.zeros(1, 2, *s.shape) for k, s in layout.observation_space.spaces.items()}
    obs[AGENT_GROUP] = torch.tensor([[0, 1]])
    out, _ = model(obs, torch.zeros(1, 2, dtype=torch.bool), model.initial_state(2, "cpu"))
    actions = out.dist.sample()
    assert actions.shape == (1, 2, 5) and (actions[0, 0, 3:] == 0).all()  # the speaker's padding
    assert torch.isfinite(out.dist.log_prob(actions)).all()
