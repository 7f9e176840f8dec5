"""The serial sampler: auto-reset, truncation bookkeeping, exact evaluation episode lists."""

from __future__ import annotations

import numpy as np
import pytest
from small import small_nav

from rl.sampling import SerialSampler

SMALL = small_nav(max_steps=12)
CARTPOLE = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"}


def run_expert(sampler: SerialSampler, max_steps: int = 10_000) -> list:
    _, expert = sampler.reset()
    episodes = []
    for _ in range(max_steps):
        if not sampler.num_active:
            break
        # A random-ish but deterministic policy: the expert, except every 3rd env turns.
        actions = expert.copy()
        actions[::3] = 0
        batch = sampler.step(actions)
        episodes += batch.episodes
        expert = batch.expert_actions[~batch.paused]
    return episodes


@pytest.mark.parametrize("num_envs", [1, 3, 4, 7, 16])
def test_evaluation_runs_every_episode_exactly_once(num_envs: int) -> None:
    seeds = list(range(100, 113))  # 13 episodes: uneven over 3, 4 and 7 envs, fewer than 16
    with SerialSampler(task=SMALL, num_envs=num_envs, episode_seeds=seeds) as sampler:
        episodes = run_expert(sampler)
        assert sampler.num_active == 0
    assert sorted(e.episode_seed for e in episodes) == seeds


def test_evaluation_results_do_not_depend_on_the_split() -> None:
    seeds = list(range(7))

    def results(n: int) -> dict:
        with SerialSampler(task={**SMALL, "max_steps": 50}, num_envs=n, episode_seeds=seeds) as s:
            _, expert = s.reset()
            out = {}
            while s.num_active:
                b = s.step(expert)  # the pure expert: deterministic per episode
                out.update({e.episode_seed: e.metrics for e in b.episodes})
                expert = b.expert_actions[~b.paused]
            return out

    one, three = results(1), results(3)
    assert one == three
    assert all(m["success"] == 1.0 and m["spl"] == 1.0 for m in one.values())


def test_truncation_reports_final_observation_and_resets() -> None:
    with SerialSampler(task=SMALL, num_envs=2, seed=3) as sampler:
        obs, _ = sampler.reset()
        turn_left = np.zeros(2, dtype=np.int64)  # never stops: every episode is truncated
        for step in range(1, 13):
            batch = sampler.step(turn_left)
            if step < 12:
                assert not batch.truncated.any() and not batch.final_obs_indices.size
        assert batch.truncated.all() and not batch.terminated.any()
        assert batch.final_obs_indices.tolist() == [0, 1]
        assert batch.final_obs["image"].shape == (2, 7, 7, 3)
        assert [e.metrics["length"] for e in batch.episodes] == [12.0, 12.0]
        # The returned obs already belongs to the next episode.
        assert not np.array_equal(batch.obs["goal"], batch.final_obs["goal"])


def test_training_seeds_differ_per_env_and_are_reproducible() -> None:
    def first_obs(seed: int) -> np.ndarray:
        with SerialSampler(task=SMALL, num_envs=4, seed=seed) as s:
            return s.reset()[0]["goal"]

    a, b, c = first_obs(0), first_obs(0), first_obs(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(row) for row in a}) > 1


def test_non_dict_observations_are_wrapped() -> None:
    with SerialSampler(task=CARTPOLE, num_envs=2, seed=0) as sampler:
        obs, expert = sampler.reset()
        assert list(obs) == ["obs"] and obs["obs"].shape == (2, 4)
        assert expert.tolist() == [-1, -1]
        batch = sampler.step(np.array([0, 1]))
        assert batch.rewards.tolist() == [1.0, 1.0]


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
        obs, expert = sampler.new_episodes()
        assert obs["image"].shape == (3, 7, 7, 3) and expert.shape == (3,)
        assert not np.array_equal(obs["goal"], batch.obs["goal"])
        # Lengths restart: the next episode end comes after the full max_steps.
        lengths = []
        for _ in range(50):
            lengths += [e.metrics["length"] for e in sampler.step(np.zeros(3, np.int64)).episodes]
        assert lengths == [50.0, 50.0, 50.0]


def test_new_episodes_is_refused_in_evaluation_mode() -> None:
    with SerialSampler(task=SMALL, num_envs=2, episode_seeds=[1, 2, 3]) as sampler:
        sampler.reset()
        with pytest.raises(RuntimeError, match="skip evaluation episodes"):
            sampler.new_episodes()
