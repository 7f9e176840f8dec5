"""Any registered gymnasium environment as a task: kwargs, wrappers, clear errors."""

from __future__ import annotations

import gymnasium as gym
import hydra.utils
import numpy as np
import pytest

from rl.tasks import make_gym_env


def test_env_kwargs_and_wrappers_from_a_config() -> None:
    env = hydra.utils.instantiate(
        {
            "_target_": "rl.tasks.make_gym_env",
            "env_id": "CartPole-v1",
            "env_kwargs": {"sutton_barto_reward": True},
            "wrappers": [
                {
                    "_target_": "gymnasium.wrappers.TimeLimit",
                    "_partial_": True,
                    "max_episode_steps": 7,
                },
            ],
        }
    )
    env.reset(seed=0)
    assert env.unwrapped._sutton_barto_reward is True
    for step in range(1, 8):
        _, reward, terminated, truncated, _ = env.step(step % 2)
        if terminated:
            break
    assert truncated or terminated
    assert step <= 7


def test_registered_pointnav_through_the_gym_task() -> None:
    env = make_gym_env(env_id="rl/PointNavSmall-v0", env_kwargs={"max_steps": 5})
    obs, info = env.reset(seed=1)
    assert set(obs) == {"image", "goal"} and "expert_action" in info


def test_unknown_env_id_names_the_key() -> None:
    with pytest.raises(ValueError, match="task.env_id='NoSuchEnv-v0'"):
        make_gym_env(env_id="NoSuchEnv-v0")


def test_continuous_actions_are_accepted_and_unsupported_spaces_named() -> None:
    from rl.tasks import SpaceError, task_spaces

    _, actions = task_spaces({"_target_": "rl.tasks.make_gym_env", "env_id": "Pendulum-v1"})
    assert isinstance(actions, gym.spaces.Box)
    with pytest.raises(SpaceError, match="task Blackjack-v1: observation entry '0' is"):
        # A Tuple of Discrete entries is fine; a Text entry is not (see tests/test_spaces.py).
        task_spaces({"_target_": "rl.tasks.make_gym_env", "env_id": "Blackjack-v1",
                     "wrappers": ["rl_envs.toys.spaces.TextObservation"]})  # fmt: skip


def test_image_observation_env_builds_a_cnn_model() -> None:
    from rl.models import ActorCritic
    from rl.tasks import dict_space

    space = dict_space(gym.spaces.Box(0, 255, (16, 16, 3), "uint8"))
    model = ActorCritic(
        observation_space=space,
        action_space=gym.spaces.Discrete(3),
        image_encoding="scale",
        rnn=None,
    )
    assert model._kinds == {"obs": "image"}


def test_a_wrapper_given_as_a_dotted_path(compose_cfg, resolve_cfg) -> None:
    from rl.engine.settings import verify_train_cfg
    from rl.tasks import build_env

    overrides = ["task=gym", "task.env_id=MiniGrid-Empty-5x5-v0",
                 "task.wrappers=[minigrid.wrappers.ImgObsWrapper]"]  # fmt: skip
    plain = resolve_cfg(compose_cfg(overrides))
    verify_train_cfg(plain)
    env = build_env(plain["task"])
    try:
        assert isinstance(
            env.observation_space, gym.spaces.Box
        )  # the image, unwrapped from the dict
        assert env.observation_space.shape == (7, 7, 3)
    finally:
        env.close()


class _Goal(gym.Env):
    """Three-step episodes that succeed when action 1 is taken at the last step."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        info = {"is_success": bool(action == 1)} if done else {}
        return self.observation_space.sample() * 0, 0.0, done, False, info


def make_goal_env() -> gym.Env:
    """A researcher's own task function (``task._target_``), not ``task=gym``."""
    return _Goal()


@pytest.mark.parametrize(
    "task",
    [
        {"_target_": "rl.tasks.make_gym_env", "env_id": "rl_test/Goal-v0"},
        {"_target_": "tests.test_gym_task.make_goal_env"},  # add-a-task.md's recipe
    ],
    ids=["task=gym", "own-target"],
)
def test_success_is_taken_from_is_success_for_every_task(task: dict) -> None:
    from rl.sampling import SerialSampler, finished_episodes

    if "rl_test/Goal-v0" not in gym.registry:
        gym.register(id="rl_test/Goal-v0", entry_point=_Goal)
    with SerialSampler(task=task, num_envs=2, seed=0) as sampler:
        sampler.reset()
        finished = []
        for action in ([1, 0], [1, 0], [1, 0]):
            finished += finished_episodes(sampler.step(np.array(action)))
    assert sorted(e.metrics["success"] for e in finished) == [0.0, 1.0]


def test_episode_metrics_of_a_task_come_before_is_success() -> None:
    from rl.tasks.factory import episode_metrics

    assert episode_metrics({}) == {}
    assert episode_metrics({"is_success": True}) == {"success": 1.0}
    own = {"episode_metrics": {"success": 0.0, "spl": 0.5}, "is_success": True}
    assert episode_metrics(own) == {"success": 0.0, "spl": 0.5}


def test_minigrid_task_declares_channel_maxima_and_logs_success() -> None:
    from rl_envs.minigrid import make_minigrid_env

    env = make_minigrid_env(env_id="MiniGrid-Empty-5x5-v0")
    assert set(env.observation_space.spaces) == {"image", "direction"}
    assert env.observation_space["image"].high[0, 0].tolist() == [10, 5, 2]
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    # Empty-5x5: the agent starts at (1, 1) facing east, the goal is at (3, 3).
    for action in (2, 2, 1, 2, 2):  # forward, forward, turn right, forward, forward
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward > 0 and info["episode_metrics"] == {"success": 1.0}
    with pytest.raises(ValueError, match="not a minigrid environment"):
        make_minigrid_env(env_id="CartPole-v1")
