"""The observation pipeline: resize and frame stacking as configured task transforms."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rl.engine.run
from rl.checkpoints.files import latest_checkpoint, load_checkpoint
from rl.tasks import build_env, task_spaces
from rl.tasks.observations import ResizeImages, StackFrames


class _Frames(gym.Env):
    """Observations whose frame t is filled with t (and a depth of t / 10)."""

    observation_space = gym.spaces.Dict(
        {
            "rgb": gym.spaces.Box(0, 255, (4, 6, 3), np.uint8),
            "depth": gym.spaces.Box(0.0, 100.0, (4, 6, 1), np.float32),
            "goal": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def _obs(self) -> dict:
        rgb = np.full((4, 6, 3), self.t, np.uint8)
        rgb[:, 3:] = 100 + self.t  # a right half apart from the left
        depth = np.arange(24, dtype=np.float32).reshape(4, 6, 1) + self.t / 10
        return {"rgb": rgb, "depth": depth, "goal": np.zeros(2, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, self.t == 5, False, {}


def test_resize_images_bilinear_for_pixels_nearest_for_depth() -> None:
    env = ResizeImages(_Frames(), size=[2, 3])
    obs, _ = env.reset()
    assert env.observation_space["rgb"].shape == (2, 3, 3)
    assert env.observation_space["depth"].shape == (2, 3, 1)
    assert env.observation_space.contains(obs)
    assert (obs["rgb"][:, 0] == 0).all() and (obs["rgb"][:, 2] == 100).all()
    # Nearest: every other row and column of the 4x6 depth image.
    assert obs["depth"][..., 0].tolist() == [[0.0, 2.0, 4.0], [12.0, 14.0, 16.0]]
    only_rgb = ResizeImages(_Frames(), size=[2, 3], keys=["rgb"])
    assert only_rgb.observation_space["depth"].shape == (4, 6, 1)
    with pytest.raises(ValueError, match=r"keys \['goal'\] are not image entries"):
        ResizeImages(_Frames(), size=[2, 3], keys=["goal"])


def test_stack_frames_oldest_first_refilled_at_reset() -> None:
    env = StackFrames(_Frames(), frames=3, keys=["rgb"])
    assert env.observation_space["rgb"].shape == (4, 6, 9)
    assert env.observation_space["depth"].shape == (4, 6, 1)
    obs, _ = env.reset()
    assert [int(obs["rgb"][0, 0, 3 * i]) for i in range(3)] == [0, 0, 0]
    for _ in range(4):
        obs, *_ = env.step(0)
    assert env.observation_space.contains(obs)
    assert [int(obs["rgb"][0, 0, 3 * i]) for i in range(3)] == [2, 3, 4]
    obs, _ = env.reset()
    assert [int(obs["rgb"][0, 0, 3 * i]) for i in range(3)] == [0, 0, 0]


def test_a_tasks_observations_list_is_applied_by_build_env() -> None:
    task = {
        "_target_": "rl_envs.pointnav.PointNavEnv",
        "size": 9,
        "rooms_per_side": 2,
        "max_steps": 30,
        "observations": [
            {"_target_": "rl.tasks.observations.StackFrames", "_partial_": True, "frames": 2}
        ],
    }
    space, _ = task_spaces(task)
    assert space["image"].shape[2] == 6  # two 3-channel views
    env = build_env(task)
    obs, _ = env.reset(seed=0)
    assert (obs["image"][..., :3] == obs["image"][..., 3:]).all()


@pytest.mark.slow
def test_stacked_frames_train_through_the_engine(compose_cfg, tmp_path: Path) -> None:
    """A memoryless CNN on two stacked views: the config check, rollouts and checkpoints."""
    stack = "{_target_:rl.tasks.observations.StackFrames,_partial_:true,frames:2}"
    cfg = compose_cfg(
        ["+experiment=ppo_nav", "task=nav_small", "model=nav_cnn", "+debug=smoke",
         f"task.observations=[{stack}]"]
    )  # fmt: skip
    rl.engine.run.train(cfg)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert saved["rollout"]["obs"]["image"].shape[-1] == 6
    bad = compose_cfg(
        ["+experiment=ppo_nav", "+debug=smoke",
         "task.observations=[{_target_:rl.tasks.observations.StackFrames,_partial_:true,framez:2}]"]
    )  # fmt: skip
    with pytest.raises(Exception, match=r"task.observations.0.framez: unknown key"):
        rl.engine.run.train(bad)
