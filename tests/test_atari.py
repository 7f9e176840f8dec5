"""Atari (``task=atari``): both forms of the task alike, CleanRL's preprocessing, training.

The per-environment form (:func:`~rl_envs.atari.make_atari_env`, what the serial sampler and
evaluation step) and its batched twin (ale-py's ``AtariVectorEnv`` through
:class:`~rl_envs.atari.AtariGames`, what ``sampler=batched`` steps) have the same spaces and
the same semantics under random play: a lost life ends an engine episode while the game goes
on, the game's unclipped score arrives where the game ends, rewards are clipped to their sign.
Then ``+experiment=ppo_atari +debug=smoke`` trains end to end and evaluates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ale_py.vector_env import AtariVectorEnv

from rl.collection.episodes import summarise_episodes
from rl.engine.run import train
from rl.sampling.batched import build_batched_env
from rl.tasks.factory import build_env, task_layout
from rl.tasks.gym_vector import GymVectorEnv
from rl_envs.atari import AreaResize, AtariGames, gym_id, make_atari_env, rom_name

TASK: dict[str, Any] = {"_target_": "rl_envs.atari.make_atari_env", "game": "breakout"}
MAX_STEPS = 5_000  # of random play, for a game to end (Breakout's take a few hundred)


def random_actions(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=size)


def play_one_game(env: Any, seed: int = 1) -> list[dict[str, Any]]:
    """Engine episodes of one game of random play of the per-env form, until the game ends."""
    env.reset(seed=seed)
    episodes: list[dict[str, Any]] = []
    rewards: list[float] = []
    for action in random_actions(env.action_space.n, MAX_STEPS, seed).tolist():
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            episodes.append(
                {
                    "lives": info["lives"],
                    "metrics": info.get("episode_metrics"),
                    "rewards": rewards,
                    "goes_on": env.unwrapped.reset_state(),
                }
            )
            if "episode_metrics" in info:
                return episodes
            rewards = []
            env.reset()
    raise AssertionError(f"no game ended in {MAX_STEPS} steps")


def test_both_forms_have_the_same_spaces() -> None:
    layout = task_layout(TASK)
    batched = build_batched_env(TASK, 2, device="cpu")  # (the twin: make_atari_env.batched_env)
    try:
        assert isinstance(batched, GymVectorEnv) and isinstance(batched.env, AtariGames)
        assert batched.name == layout_name() == "ALE/Breakout-v5"
        assert batched.observation_space == layout.observation_space
        assert batched.action_space == layout.action_space
        space = layout.observation_space["obs"]
        assert (space.shape, space.dtype) == ((84, 84, 4), np.uint8)
        first = batched.reset([1, 2])["obs", "obs"]
        assert (first.shape, first.dtype) == ((2, 84, 84, 4), torch.uint8)
    finally:
        batched.close()
    env = build_env(TASK)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8 and obs in env.observation_space
    # zeros before the first frame, as the twin's stack; the newest frame last
    assert not obs[..., :3].any() and obs[..., 3].any()
    env.close()


def layout_name() -> str:
    return gym_id("Breakout")  # (CamelCase accepted: its ROM name is breakout)


def test_a_game_name_that_is_no_rom_is_refused() -> None:
    assert rom_name("MsPacman") == "ms_pacman"
    with pytest.raises(ValueError, match="task.game='tetris2'"):
        rom_name("tetris2")


def test_per_env_form_ends_lives_then_reports_the_game() -> None:
    env = build_env(TASK)
    episodes = play_one_game(env)
    env.close()
    *lives, last = episodes
    assert len(lives) == 4  # Breakout: 5 lives, each lost one an episode of its own
    assert [e["lives"] for e in lives] == [4, 3, 2, 1]  # the game went on between them
    assert all(e["metrics"] is None and e["goes_on"] for e in lives)
    assert last["lives"] == 0 and last["goes_on"] is None
    rewards = [r for e in episodes for r in e["rewards"]]
    assert set(rewards) <= {-1.0, 0.0, 1.0}
    assert last["metrics"]["game_return"] >= sum(rewards)  # unclipped, the whole game's
    assert last["metrics"]["game_length"] > 4 * (sum(len(e["rewards"]) for e in episodes) - 1)
    with pytest.raises(NotImplementedError, match="after a lost life"):
        env.unwrapped.set_reset_state(lives[0]["goes_on"])


def test_rewards_are_clipped_and_the_game_return_is_not() -> None:
    # Space Invaders pays 5 to 30 points an alien: clipping shows.
    clipped = play_one_game(make_atari_env(game="space_invaders"), seed=3)
    raw = play_one_game(make_atari_env(game="space_invaders", clip_rewards=False), seed=3)
    assert set(r for e in clipped for r in e["rewards"]) <= {-1.0, 0.0, 1.0}
    assert max(r for e in raw for r in e["rewards"]) >= 5
    score = clipped[-1]["metrics"]["game_return"]
    assert score > sum(r for e in clipped for r in e["rewards"]) > 0


def test_twin_ends_lives_then_reports_the_games() -> None:
    n = 3
    env = build_batched_env(TASK, n, device="cpu")
    games = env.env
    assert isinstance(games, AtariGames)
    env.reset([1, 2, 3])
    lives_lost = np.zeros(n, dtype=int)
    fired = 0
    scores: list[float] = []
    clipped_sums = np.zeros(n)
    try:
        for action in random_actions(4, (MAX_STEPS, n)).tolist():
            before = games._lives.copy()
            fire_next = games._fire_next.copy()
            step = env.step(torch.tensor(action))
            fired += int(fire_next.sum())
            rewards = step["rewards"].numpy()
            assert set(rewards.tolist()) <= {-1.0, 0.0, 1.0}
            clipped_sums += rewards
            done = (step["terminated"] | step["truncated"]).numpy()
            metrics = step.get(("episode", "game_return"), None)
            ended = np.zeros(n, dtype=bool) if metrics is None else ~torch.isnan(metrics).numpy()
            assert not (ended & ~done).any()  # a game's score only where an episode ends
            lost = done & ~ended
            # A lost life: the game goes on (its lives counter keeps going down, no new game)
            assert (games._lives[lost] == before[lost] - 1).all()
            assert (games._lives[lost] > 0).all()
            lives_lost += lost
            for i in np.flatnonzero(ended):
                score = float(metrics[i])
                assert score >= clipped_sums[i]
                assert step["episode", "game_length"][i] > 4 * 50
                scores.append(score)
                assert games._lives[i] == 5  # a new game
            clipped_sums[ended] = 0.0
            if len(scores) >= 2:
                break
        assert len(scores) >= 2, f"{len(scores)} games ended in {MAX_STEPS} steps"
        assert lives_lost.sum() >= 4 * len(scores)
        assert fired >= lives_lost.sum() - n  # FIRE after each (the last ones: next step)
    finally:
        env.close()


def test_frames_are_resized_as_ale_pys_vector_env_resizes_them() -> None:
    """The per-env form's NumPy area resize is within one grey level of ale-py's OpenCV one."""
    vector = AtariVectorEnv("breakout", 1, frameskip=1, noop_max=0, use_fire_reset=False,
                            stack_num=1, maxpool=False, reward_clipping=False)  # fmt: skip
    env = make_atari_env(noop_max=0, frame_skip=1, fire_reset=False)
    base = env.unwrapped
    env.reset(seed=0)
    frames, _ = vector.reset(seed=np.array([0]))
    resize = AreaResize((210, 160), (84, 84))
    for action in random_actions(4, 60).tolist():
        ours = resize(base.ale.getScreenGrayscale()).astype(int)
        assert np.abs(ours - frames[0, 0]).max() <= 1
        assert (ours != frames[0, 0]).sum() <= 20  # of 7,056 pixels (rounding ties)
        frames, *_ = vector.step(np.array([action]))
        base.step(action)
    vector.close()
    env.close()


def test_evaluation_means_a_metric_over_the_episodes_that_have_it() -> None:
    records = {1: {"episode_seed": 1, "return": 1.0},
               2: {"episode_seed": 2, "return": 3.0, "game_return": 12.0}}  # fmt: skip
    result = summarise_episodes(records, [1, 2])
    assert result.metrics == {"return": 2.0, "game_return": 12.0}


def test_ppo_atari_smoke_trains_and_evaluates(compose_cfg) -> None:
    cfg = compose_cfg(["+experiment=ppo_atari", "+debug=smoke"])
    assert cfg.sampler._target_ == "rl.sampling.BatchedSampler"
    metrics = train(cfg)
    assert metrics["charts/SPS"] > 0
    assert "eval/episodic_return" in metrics and "eval/episodic_length" in metrics
