"""A task's own per-step field reaches a researcher's loss, touching no framework file.

``TwiceEnv`` below is a researcher's task: its observation is the step of the episode (over
10), and its ``info`` reports a value the policy does not see (``double``: twice the
observation), declared once as a step field (:mod:`rl.tasks.fields`), on the class or in the
task config. ``TwiceLoss`` is a researcher's loss reading ``batch["twice"]``: it checks every
minibatch's field against the observation it was recorded with (so the field lines up with its
steps, the first observation of each episode included). Both go through the real engine, in
process and through a collection worker process (the field crosses the process boundary as any
rollout entry does).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import open_dict
from tensordict import TensorDict

import rl.engine.run
from rl.collection.episodes import evaluate_expert
from rl.losses import Loss, LossOutput
from rl.models import PolicyOutput
from rl.sampling import MultiprocessSampler, SerialSampler, finished_episodes
from rl.tasks.fields import StepField, step_fields_of


class TwiceEnv(gym.Env):
    """Observation ``[t / 10]``; ``info["double"] = 2 t / 10``; 7 steps an episode.

    Action 1 at an even step gives reward 1 (a little to learn); truncated after 7 steps.
    ``info["paid"]`` is the step's reward: a transition field, recorded beside the reward.
    """

    step_fields: ClassVar[dict[str, StepField]] = {
        "twice": StepField("double"),
        "paid": StepField("paid", transition=True),
    }

    def __init__(self, *, max_steps: int = 7) -> None:
        self.observation_space = gym.spaces.Box(0.0, 10.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.max_steps = max_steps
        self._t = 0

    def _out(self) -> tuple[np.ndarray, dict[str, Any]]:
        return np.array([self._t / 10], dtype=np.float32), {"double": 2 * self._t / 10}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return self._out()

    def step(self, action: Any) -> Any:
        reward = float(int(action) == 1 and self._t % 2 == 0)
        self._t += 1
        obs, info = self._out()
        return obs, reward, False, self._t >= self.max_steps, {**info, "paid": reward}


class UndeclaredTwiceEnv(TwiceEnv):
    """The same task with no declaration on the class (a task config declares it)."""

    step_fields: ClassVar[dict[str, StepField]] = {}


class TwiceLoss(Loss):
    """Check ``batch["twice"]`` against the observation it came with, ``batch["paid"]``
    against the reward of its step."""

    def __call__(self, *, batch: TensorDict, output: PolicyOutput, step_count: int) -> LossOutput:
        """Zero loss with the policy's graph; raises if a field does not line up."""
        twice, obs = batch["twice"], batch["obs", "obs"][..., 0]
        if twice.shape != obs.shape or not torch.allclose(twice, 2 * obs):
            raise AssertionError("the step field does not line up with its observations")
        # The reward of every step, episodes' last included (a reset followed those).
        if not torch.equal(batch["paid"], batch["rewards"]) or not batch["paid"].any():
            raise AssertionError("the transition field does not line up with its rewards")
        return LossOutput(total=output.values.sum() * 0.0, terms={"fields_checked": 1.0})


TASK = {"_target_": "tests.test_step_fields.TwiceEnv"}


@pytest.mark.parametrize(
    "collector",
    [[], ["collector=process", "collector.mode=sync"]],
    ids=["in-process", "process-worker"],
)
@pytest.mark.parametrize("declared", ["class", "config"])
def test_a_tasks_own_field_reaches_a_users_loss(compose_cfg, collector, declared) -> None:
    cfg = compose_cfg(
        [
            "+experiment=ppo_cartpole",
            "total_env_steps=2048",
            "eval.num_episodes=2",
            "logger.sinks.console.progress_bar=false",
            "torch_threads=1",
            "+pipeline.named_losses.twice={_target_: tests.test_step_fields.TwiceLoss}",
            "pipeline.stages.0.loss_names=[ppo,twice]",
            "trusted_targets=[tests.test_step_fields.*]",
            *collector,
        ]  # fmt: skip
    )
    task: dict[str, Any] = dict(TASK)
    if declared == "config":
        task = {
            "_target_": "tests.test_step_fields.UndeclaredTwiceEnv",
            "step_fields": {
                "twice": {"info": "double", "dtype": "float32"},
                "paid": {"info": "paid", "transition": True},
            },
        }
    with open_dict(cfg):
        cfg.task = task
    metrics = rl.engine.run.train(cfg)
    assert metrics["losses/twice/fields_checked"] == 1.0, metrics  # it ran, and every check held


@pytest.mark.parametrize("sampler", ["serial", "multiprocess"])
def test_samplers_carry_a_field_with_its_observation(sampler) -> None:
    kwargs: dict[str, Any] = {"task": TASK, "num_envs": 3, "seed": 1}
    if sampler == "multiprocess":
        kwargs.update(num_processes=2, mp_start_method="fork")
    cls = SerialSampler if sampler == "serial" else MultiprocessSampler
    with cls(**kwargs) as s:
        assert set(s.step_fields) == {"twice", "paid"}
        step = s.reset()
        assert torch.equal(step["twice"], 2 * step["obs", "obs"][:, 0]), step
        truncations = 0
        for _ in range(9):
            step = s.step(np.ones(3, dtype=np.int64))
            assert step["twice"].dtype == torch.float32
            assert torch.allclose(step["twice"], 2 * step["obs", "obs"][:, 0])
            if step["truncated"].any():  # the first observation of the next episode's
                truncations += 1
                assert (step["twice"][step["truncated"]] == 0).all()
                assert torch.allclose(
                    step["final_obs", "obs"][step["truncated"], 0], torch.tensor(0.7)
                )
                assert len(finished_episodes(step)) == 3
        assert truncations == 1


def test_a_field_missing_from_info_is_recorded_as_its_missing_value() -> None:
    env = TwiceEnv()
    fields = step_fields_of(
        {"step_fields": {"gone": {"info": "nope", "shape": [2], "dtype": "int64", "missing": -7}}},
        env,
        "twice",
    )
    with SerialSampler(task={**TASK, "step_fields": {"gone": fields["gone"]}}, num_envs=2) as s:
        step = s.reset()
        assert step["gone"].shape == (2, 2) and step["gone"].dtype == torch.int64
        assert (step["gone"] == -7).all()


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ({"rewards": {"info": "double"}}, "'rewards' is a name the framework uses"),
        ({"x": {"dtype": "float32"}}, "with an 'info' key"),
        ({"x": {"info": "double", "shap": [2]}}, "unknown key(s) ['shap']"),
        ({"x": {"info": "double", "dtype": "floaty"}}, "step field 'x'"),
    ],
)
def test_a_bad_declaration_names_the_task_and_the_field(declaration, message) -> None:
    with pytest.raises(ValueError, match="task 'twice'") as e:
        step_fields_of({"step_fields": declaration}, TwiceEnv(), "twice")
    assert message in str(e.value)


def test_a_task_without_an_expert_says_so_to_imitation() -> None:
    from rl.collection import NoExpertError

    with pytest.raises(NoExpertError, match="declares no expert"):
        evaluate_expert(task=TASK, episode_seeds=[0, 1], num_envs=2)
