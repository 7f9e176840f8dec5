"""Multi-agent PointNav: shared layouts in the task's split, blocking, the waiting expert."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from rl.sampling import build_sampler, finished_episodes  # noqa: E402
from rl.tasks.splits import split_of  # noqa: E402
from rl_envs.pointnav.env import Actions  # noqa: E402
from rl_envs.pointnav.multi import MultiPointNav  # noqa: E402
from rl_envs.pointnav.view import DIR_VEC  # noqa: E402

SMALL = {"size": 9, "rooms_per_side": 2, "max_steps": 50}


def task(agents: int = 2, split: str = "train") -> dict:
    env = {"_target_": "rl_envs.pointnav.multi.MultiPointNav", "_partial_": True,
           "agents": agents, "split": split, **SMALL}  # fmt: skip
    return {"_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter", "env": env,
            "global_state": "concat"}  # fmt: skip


@pytest.mark.parametrize("agents", [2, 3])
def test_the_expert_brings_every_agent_to_its_goal(agents: int) -> None:
    episodes = []
    with build_sampler(None, task=task(agents), num_envs=6, seed=0) as sampler:
        step = sampler.reset()
        while len(episodes) < 60:
            step = sampler.step(step["expert_actions"].clamp(min=0).numpy())
            episodes += finished_episodes(step)
    success = np.mean([e.metrics["success"] for e in episodes])
    assert success >= 0.95, success  # the team's: every agent stopped on its own goal
    assert all(f"spl/agent_{agents - 1}" in e.metrics for e in episodes)


def test_agents_share_one_layout_and_block_each_other() -> None:
    env = MultiPointNav(agents=2, **SMALL)
    env.reset(seed=3)
    a, b = env.envs
    assert (a._door_x, a._door_y) == (b._door_x, b._door_y)  # one layout
    assert a.goal_pos != b.goal_pos and a.agent_pos != b.agent_pos
    # Put agent 1 right in front of agent 0: agent 0's FORWARD leaves it in place.
    free = np.argwhere(a.distance_field >= 0)
    for x, y in free:
        d = next((d for d in range(4) if a._dist[x + DIR_VEC[d][0]][y + DIR_VEC[d][1]] >= 0), None)
        if d is not None:
            break
    a.agent_pos, a.agent_dir = (int(x), int(y)), d
    b.agent_pos = (int(x) + DIR_VEC[d][0], int(y) + DIR_VEC[d][1])
    env._occupancy()
    env.step({"agent_0": Actions.FORWARD, "agent_1": Actions.LEFT})
    assert a.agent_pos == (int(x), int(y))
    # Once agent 1 has left the episode (STOP), it blocks no more.
    env.step({"agent_0": Actions.LEFT, "agent_1": Actions.STOP})
    env.step({"agent_0": Actions.RIGHT})
    env.step({"agent_0": Actions.FORWARD})
    assert a.agent_pos == b.agent_pos


def test_layouts_stay_in_their_split() -> None:
    for split in ("train", "test"):
        env = MultiPointNav(agents=2, split=split, **SMALL)
        layout = env.envs[0]._layout
        for seed in range(20):
            env.reset(seed=seed)
            door_v = env.envs[0]._door_v
            assert split_of(layout.layout_key(door_v, ())) == split


def test_the_expert_evaluates_through_the_step_runner() -> None:
    from rl.collection.episodes import evaluate_expert

    # rows of agents that have stopped carry no expert action (-1): the runner's expert skips them
    result = evaluate_expert(task=task(2, "test"), episode_seeds=list(range(24)), num_envs=4)
    assert len(result.episodes) == 24
    assert result.metrics["success"] >= 0.95 and "spl/agent_1" in result.metrics, result.metrics


def test_a_probe_video_shows_every_agent() -> None:
    from rl.evaluation.video import record_episode, rendering_sampler
    from rl.models import build_policy
    from rl.tasks import task_spaces

    model = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [4],
             "trunk_layers": [8], "rnn": "gru", "rnn_hidden_size": 8}  # fmt: skip
    policy = build_policy(model, *task_spaces(task()))
    with rendering_sampler(task(), seed=5) as sampler:
        frames, metrics = record_episode(model=policy, sampler=sampler, device="cpu")
    assert len(frames) == metrics["length"] + 1
    height, width, _ = frames[0].shape
    assert width == 2 * height  # the two agents' square views of the grid, side by side
    assert "success/agent_1" in metrics or metrics["length"] == 50  # cut at max_steps
