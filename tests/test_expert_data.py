"""Expert trajectories are recorded with the observation entries policies are given."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np

from rl.storage import ExpertTrajectoryIterator, generate_expert_trajectories
from rl.tasks.fields import StepField, expert_field
from rl.tasks.spaces import dict_space


class NestedCorridor(gym.Env):
    """A corridor whose observation is nested (a Dict holding a Tuple), with an expert."""

    step_fields: ClassVar[dict[str, StepField]] = {"expert_actions": expert_field()}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(0.0, 4.0, (1,), np.float32),
                "sensors": gym.spaces.Tuple(
                    (gym.spaces.Box(0.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3))
                ),
            }
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> dict:
        return {
            "position": np.array([self.pos], np.float32),
            "sensors": (np.full(2, self.pos / 4, np.float32), self.pos % 3),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, 3))
        return self._obs(), {"expert_action": 1}

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        done = self.pos >= 4
        return self._obs(), float(done), done, False, {"expert_action": 1}


def test_nested_observations_are_flattened_as_samplers_flatten_them(tmp_path: Path) -> None:
    task = {"_target_": "test_expert_data.NestedCorridor"}
    path = generate_expert_trajectories(task=task, num_episodes=3, seed=0, path=tmp_path / "e.npz")
    with np.load(path) as data:
        keys = sorted(k.removeprefix("obs/") for k in data.files if k.startswith("obs/"))
        assert keys == sorted(dict_space(NestedCorridor().observation_space).spaces)
        assert (data["expert_action"] == 1).all() and data["episode_start"].sum() == 3
    batch = next(iter(ExpertTrajectoryIterator(path=str(path), batch_size=2, seq_len=2, seed=0)))
    assert set(batch["obs"].keys()) == set(keys)
