"""The serial sampler: auto-reset, truncation bookkeeping, exact evaluation episode lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small import small_nav
from tensordict import TensorDict

from rl.sampling import EpisodeRecord, SerialSampler, decode_episodes, finished_episodes
from rl.sampling.base import episode_entries

SMALL = small_nav(max_steps=12)
CARTPOLE = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"}


def run_expert(sampler: SerialSampler, max_steps: int = 10_000) -> list:
    expert = sampler.reset()["expert_actions"].numpy()
    episodes = []
    for _ in range(max_steps):
        if not sampler.num_active:
            break
        # A random-ish but deterministic policy: the expert, except every 3rd env turns.
        actions = expert.copy()
        actions[::3] = 0
        batch = sampler.step(actions)
        episodes += finished_episodes(batch)
        expert = batch["expert_actions"][~batch["paused"]].numpy()
    return episodes


@pytest.mark.parametrize("num_envs", [1, 3, 4, 7, 16])
def test_evaluation_runs_every_episode_exactly_once(num_envs: int) -> None:
    seeds = list(range(100, 113))  # 13 episodes: uneven over 3, 4 and 7 envs, fewer than 16
    with SerialSampler(task=SMALL, num_envs=num_envs, episode_seeds=seeds) as sampler:
        episodes = run_expert(sampler)
        assert sampler.num_active == 0
        assert run_expert(sampler) == episodes  # reset() starts the list again
    assert sorted(e.episode_seed for e in episodes) == seeds


def test_evaluation_results_do_not_depend_on_the_split() -> None:
    seeds = list(range(7))

    def results(n: int) -> dict:
        with SerialSampler(task={**SMALL, "max_steps": 50}, num_envs=n, episode_seeds=seeds) as s:
            expert = s.reset()["expert_actions"].numpy()
            out = {}
            while s.num_active:
                b = s.step(expert)  # the pure expert: deterministic per episode
                out.update({e.episode_seed: e.metrics for e in finished_episodes(b)})
                expert = b["expert_actions"][~b["paused"]].numpy()
            return out

    one, three = results(1), results(3)
    assert one == three
    assert all(m["success"] == 1.0 and m["spl"] == 1.0 for m in one.values())


def test_truncation_reports_final_observation_and_resets() -> None:
    with SerialSampler(task=SMALL, num_envs=2, seed=3) as sampler:
        sampler.reset()
        turn_left = np.zeros(2, dtype=np.int64)  # never stops: every episode is truncated
        for step in range(1, 13):
            batch = sampler.step(turn_left)
            if step < 12:
                assert not batch["truncated"].any() and "final_obs" not in batch.keys()
        assert batch["truncated"].all() and not batch["terminated"].any()
        assert batch["truncated"].nonzero().squeeze(1).tolist() == [0, 1]
        assert batch["final_obs", "image"].shape == (2, 7, 7, 3)
        assert [e.metrics["length"] for e in finished_episodes(batch)] == [12.0, 12.0]
        # The returned obs already belongs to the next episode.
        assert not torch.equal(batch["obs", "goal"], batch["final_obs", "goal"])


def test_final_observations_are_zeros_where_no_episode_was_truncated() -> None:
    with SerialSampler(task=SMALL, num_envs=2, seed=3) as sampler:
        expert = sampler.reset()["expert_actions"].numpy()
        for _ in range(12):  # env 0 turns (truncated at step 12), env 1 follows the expert
            batch = sampler.step(np.array([0, expert[1]]))
            expert = batch["expert_actions"].numpy()
        assert batch["truncated"].tolist() == [True, False]
        assert batch["final_obs"].batch_size == (2,)  # every row, as obs
        for key in ("image", "goal"):
            assert batch["final_obs", key][0].any()  # env 0's last observation
            assert not batch["final_obs", key][1].any()  # zeros: env 1 was not truncated


def test_training_seeds_differ_per_env_and_are_reproducible() -> None:
    def first_obs(seed: int) -> np.ndarray:
        with SerialSampler(task=SMALL, num_envs=4, seed=seed) as s:
            return s.reset()["obs", "goal"].numpy()

    a, b, c = first_obs(0), first_obs(0), first_obs(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(row) for row in a}) > 1


def test_non_dict_observations_are_wrapped() -> None:
    with SerialSampler(task=CARTPOLE, num_envs=2, seed=0) as sampler:
        first = sampler.reset()
        assert list(first["obs"].keys()) == ["obs"] and first["obs", "obs"].shape == (2, 4)
        # CartPole declares no step fields: no expert actions at all.
        assert sampler.step_fields == {} and set(first.keys()) == {"obs"}
        batch = sampler.step(np.array([0, 1]))
        assert batch["rewards"].tolist() == [1.0, 1.0]
        assert "expert_actions" not in batch.keys()


def test_wrong_action_count_is_an_error() -> None:
    with SerialSampler(task=SMALL, num_envs=2, seed=0) as sampler:
        sampler.reset()
        with pytest.raises(ValueError, match="expected 2 actions"):
            sampler.step(np.zeros(3, dtype=np.int64))


def test_new_episodes_cuts_every_episode() -> None:
    with SerialSampler(task={**SMALL, "max_steps": 50}, num_envs=3, seed=5) as sampler:
        sampler.reset()
        for _ in range(3):
            batch = sampler.step(np.zeros(3, dtype=np.int64))
        first = sampler.new_episodes()
        assert first["obs", "image"].shape == (3, 7, 7, 3)
        assert first["expert_actions"].shape == (3,)
        assert not torch.equal(first["obs", "goal"], batch["obs", "goal"])
        # Lengths restart: the next episode end comes after the full max_steps.
        lengths = []
        for _ in range(50):
            step = sampler.step(np.zeros(3, np.int64))
            lengths += [e.metrics["length"] for e in finished_episodes(step)]
        assert lengths == [50.0, 50.0, 50.0]


def test_new_episodes_is_refused_in_evaluation_mode() -> None:
    with SerialSampler(task=SMALL, num_envs=2, episode_seeds=[1, 2, 3]) as sampler:
        sampler.reset()
        with pytest.raises(RuntimeError, match="skip evaluation episodes"):
            sampler.new_episodes()


def test_a_steps_episodes_are_entries_that_indexing_and_copies_keep() -> None:
    # Episodes end in envs 0 and 2 only: evaluation with two episodes each for those, one for
    # the others, so some rows pause and the step is indexed as the runner indexes it.
    with SerialSampler(task=SMALL, num_envs=3, seed=3, episode_seeds=[5, 6, 7]) as sampler:
        sampler.reset()
        turn_left = np.zeros(3, dtype=np.int64)  # every episode is truncated at step 12
        for _ in range(12):
            step = sampler.step(turn_left)
    episodes = finished_episodes(step)
    assert [(e.env_index, e.episode_seed) for e in episodes] == [(0, 5), (1, 6), (2, 7)]
    assert all(e.metrics["length"] == 12.0 for e in episodes)
    assert finished_episodes(step.clone()) == episodes  # a copy keeps them
    keep = torch.tensor([True, False, True])
    assert finished_episodes(step[keep]) == [episodes[0], episodes[2]]  # indexing keeps its rows'
    assert finished_episodes(step[~step["episodes", "ended"]]) == []
    assert step["episodes", "metrics", "return"].dtype == torch.float64


def test_many_steps_episodes_decode_at_once_in_step_then_row_order() -> None:
    # What a rollout's recorder does: keep the steps' entries, decode them once at its end.
    ended = np.array([False, True, True])
    first = episode_entries(
        [EpisodeRecord(1, {"return": 1.0, "success": 1.0}), EpisodeRecord(2, {"return": 2.0})],
        ended,
    )
    second = episode_entries([EpisodeRecord(0, {"return": 3.0, "success": 0.0}, 9)], ~ended)
    records = decode_episodes([first, second])
    assert records == finished_episodes(TensorDict({"episodes": first}, [3])) + [
        EpisodeRecord(0, {"return": 3.0, "success": 0.0}, 9)
    ]
    assert records[1].metrics == {"return": 2.0}  # (NaN in its success entry: not its metric)
    # Steps whose episodes have other metrics than the first's are each read by themselves.
    other = episode_entries([EpisodeRecord(0, {"length": 4.0})], ~ended)
    assert decode_episodes([first, other, second])[2:] == [
        EpisodeRecord(0, {"length": 4.0}),
        EpisodeRecord(0, {"return": 3.0, "success": 0.0}, 9),
    ]
    assert decode_episodes([]) == []
