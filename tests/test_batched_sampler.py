"""The batched sampler returns what the serial sampler does, over every kind of batched env.

Each comparison steps a :class:`SerialSampler` and a :class:`BatchedSampler` built with the
same arguments with the same actions and checks every step bitwise (every entry, dtype and
shape; the finished episodes with their metrics and seeds), resets included, in training and
in evaluation (episode lists, environments pausing and leaving the batch). Rows that pause
are compared except for what the contract calls meaningless there: their observation and the
fields that come with it (the serial sampler leaves the ended episode's last one, a batched
environment has already reset). Environments: gymnasium's CartPole and PointNav through the
gymnasium adapter (sync and async), a researcher's vector environment in each of Gymnasium's
autoreset modes (``gymnasium.make_vec``), and a batched environment written in torch
(:class:`~rl_envs.toys.corridor.BatchedCorridor`, the twin of a gymnasium one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from small import assert_same_step, small_nav
from tensordict import TensorDict
from test_resume import StopAt, make_trainer

from rl.checkpoints.files import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl.sampling import BatchedSampler, SerialSampler, finished_episodes
from rl.tasks.batched import BatchedEnv
from rl.tasks.gym_vector import GymVectorEnv
from rl.utils.finite import NonFiniteError
from rl.utils.seeding import env_seeds
from rl_envs.toys.corridor import BatchedCorridor, CorridorEnv

# CartPole cut at 12 steps: episodes end by termination and by truncation.
CARTPOLE = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1",
            "env_kwargs": {"max_episode_steps": 12}}  # fmt: skip
NAV = small_nav(max_steps=6)
CORRIDOR = {"_target_": "rl_envs.toys.corridor.CorridorEnv", "length": 5, "max_steps": 6}
CORRIDOR_ID = "rl/CorridorTest-v0"
if CORRIDOR_ID not in gym.registry:
    gym.register(CORRIDOR_ID, entry_point="rl_envs.toys.corridor:CorridorEnv")
EPISODES = list(range(100, 107))  # 7 episodes over 3 environments: shares of 3, 2 and 2
ASYNC = {"vectorization_mode": "async", "mp_start_method": "fork"}  # (fork: fast in tests)


def user_vector(autoreset_mode: str) -> dict[str, Any]:
    """A researcher's own vector environment of the corridor (``gymnasium.make_vec``)."""
    return {"_target_": "gymnasium.make_vec", "id": CORRIDOR_ID, "vectorization_mode": "sync",
            "vector_kwargs": {"autoreset_mode": autoreset_mode}, "length": 5,
            "max_steps": 6}  # fmt: skip


def blank_paused(step: TensorDict, sampler: Any) -> TensorDict:
    """A copy of ``step`` with the observations and observed fields of its pausing rows
    zeroed (and no episodes: they are compared before)."""
    paused = step.get("paused")
    step = step.clone()
    step["obs"][paused] = 0
    for key, field in sampler.step_fields.items():
        if not field.transition:
            step[key][paused] = 0
    return step


def assert_same_run(
    serial: SerialSampler, batched: BatchedSampler, steps: int = 40, tensors: bool = False
) -> list:
    """Step both with the same random actions (all of an evaluation list when it has one),
    checking every step; ``tensors``: the batched sampler gets torch actions. Returns the
    finished episodes."""
    rng = np.random.default_rng(0)
    assert_same_step(serial.reset(), batched.reset())
    episodes: list = []
    for _ in range(10_000 if serial.eval_mode else steps):
        if not serial.num_active:
            break
        actions = rng.integers(0, serial.action_space.n, serial.num_active)
        a = serial.step(actions)
        b = batched.step(torch.as_tensor(actions) if tensors else actions)
        assert finished_episodes(a) == finished_episodes(b)
        episodes += finished_episodes(a)
        assert_same_step(blank_paused(a, serial), blank_paused(b, batched))
        assert batched.active_indices == serial.active_indices
    assert batched.num_active == serial.num_active
    return episodes


def both(task: dict[str, Any], num_envs: int = 3, evaluation: bool = False, **kwargs: Any):
    """A serial and a batched sampler of ``task`` with the same arguments."""
    common: dict[str, Any] = {"task": task, "num_envs": num_envs, "seed": 0}
    if evaluation:
        common["episode_seeds"] = EPISODES
    serial_task = kwargs.pop("serial_task", task)
    return (
        SerialSampler(**{**common, "task": serial_task}),
        BatchedSampler(**common, **{"device": "cpu", **kwargs}),
    )


def check(task: dict[str, Any], evaluation: bool, tensors: bool = False, **kwargs: Any) -> list:
    serial, batched = both(task, evaluation=evaluation, **kwargs)
    with serial, batched:
        episodes = assert_same_run(serial, batched, tensors=tensors)
    if evaluation:
        assert sorted(e.episode_seed for e in episodes) == EPISODES
    assert episodes, "no episode ended: the comparison saw no reset"
    return episodes


# ------------------------------------------------------------- gymnasium adapter
@pytest.mark.parametrize("evaluation", [False, True], ids=["train", "eval"])
@pytest.mark.parametrize("mode", [{}, ASYNC], ids=["sync", "async"])
def test_a_gymnasium_task_steps_as_in_the_serial_sampler(mode: dict, evaluation: bool) -> None:
    episodes = check(CARTPOLE, evaluation, **mode)
    assert {e.metrics["length"] for e in episodes} & {12.0}  # truncations among them


@pytest.mark.parametrize("evaluation", [False, True], ids=["train", "eval"])
def test_pointnav_without_its_twin_steps_as_in_the_serial_sampler(evaluation: bool) -> None:
    # vectorization_mode=sync: gymnasium's vector env even where the task has a batched twin
    episodes = check(NAV, evaluation, vectorization_mode="sync")
    assert all({"success", "spl"} <= e.metrics.keys() for e in episodes)


@pytest.mark.parametrize("evaluation", [False, True], ids=["train", "eval"])
@pytest.mark.parametrize("autoreset", ["NextStep", "SameStep"])
def test_a_users_vector_env_in_either_autoreset_mode(autoreset: str, evaluation: bool) -> None:
    # Every step equal to the serial sampler's: no transition across an episode boundary, no
    # step spent or counted on NEXT_STEP's reset, final_obs the true last observation, the
    # transition field (moved) and the episode metrics from the step's own infos.
    with BatchedSampler(task=user_vector(autoreset), num_envs=3, device="cpu") as sampler:
        assert isinstance(sampler.env, GymVectorEnv)
        assert sampler.env.mode.value == autoreset
    episodes = check(user_vector(autoreset), evaluation, serial_task=CORRIDOR)
    assert {e.metrics["success"] for e in episodes} == {0.0, 1.0}


# ------------------------------------------------------------ a torch batched env
@pytest.mark.parametrize("evaluation", [False, True], ids=["train", "eval"])
@pytest.mark.parametrize("form", ["twin", "target"])
def test_a_torch_batched_env_steps_as_its_per_env_twin(form: str, evaluation: bool) -> None:
    batched_task = {**CORRIDOR, "_target_": "rl_envs.toys.corridor.BatchedCorridor"}
    task = CORRIDOR if form == "twin" else batched_task
    with BatchedSampler(task=task, num_envs=3, device="cpu") as sampler:
        assert isinstance(sampler.env, BatchedCorridor)
    check(task, evaluation, tensors=True, serial_task=CORRIDOR)


def test_actions_on_the_device_are_not_copied() -> None:
    seen = []

    class Spy(BatchedCorridor):
        def step(self, actions: torch.Tensor, next_seeds: Any = None) -> TensorDict:
            seen.append(actions)
            return super().step(actions, next_seeds)

    with BatchedSampler(task=CORRIDOR, num_envs=2, device="cpu") as sampler:
        sampler.env = Spy(num_envs=2, length=5, max_steps=6, device="cpu")
        sampler.reset()
        actions = torch.tensor([2, 0])
        step = sampler.step(actions)
    assert seen[0] is actions
    assert step["obs", "cell"].device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_every_step_stays_on_the_device() -> None:
    serial, batched = both(CORRIDOR, evaluation=True, device="cuda")
    with serial, batched:
        first = batched.reset()
        assert_same_step(serial.reset(), first.cpu())
        rng = np.random.default_rng(0)
        while serial.num_active:
            actions = rng.integers(0, 3, serial.num_active)
            a = serial.step(actions)
            b = batched.step(torch.as_tensor(actions, device="cuda"))
            assert all(v.is_cuda for v in b.values(include_nested=True, leaves_only=True))
            assert finished_episodes(a) == finished_episodes(b)
            assert_same_step(blank_paused(a, serial), blank_paused(b.cpu(), batched))


# ------------------------------------------------------------------ finite checks
@pytest.mark.parametrize("form", ["twin", "sync"])
def test_a_nan_reward_is_named_as_the_serial_sampler_names_it(form: str) -> None:
    task = {**CORRIDOR, "nan_start": 1}
    mode = "auto" if form == "twin" else "sync"
    errors = []
    for sampler in both(task, evaluation=True, vectorization_mode=mode):
        with sampler, pytest.raises(NonFiniteError) as info:
            sampler.reset()
            while sampler.num_active:
                sampler.step(np.ones(sampler.num_active, dtype=np.int64))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "returned a non-finite reward (nan) at step 2 of its episode" in errors[0]


def test_a_nan_observation_is_named_as_the_serial_sampler_names_it() -> None:
    task = {"_target_": "rl_envs.toys.debug.FaultyEnv", "mode": "nan_obs", "fail_at_step": 3,
            "fail_seed": env_seeds(2, 0)[1]}  # fmt: skip
    errors = []
    for sampler in both(task, num_envs=2):
        with sampler, pytest.raises(NonFiniteError) as info:
            sampler.reset()
            for _ in range(5):
                sampler.step(np.zeros(2, dtype=np.int64))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "environment 1 returned a non-finite observation (nan) at step 3" in errors[0]


# ----------------------------------------------------------------- exact resume
@pytest.mark.parametrize(
    ("task", "kwargs"),
    [(CORRIDOR, {}), (CORRIDOR, {"vectorization_mode": "sync"}), (NAV, ASYNC)],
    ids=["torch", "sync", "async-nav"],
)
def test_state_dict_resumes_bitwise(task: dict, kwargs: dict, tmp_path: Path) -> None:
    make = functools.partial(BatchedSampler, task=task, num_envs=3, seed=2, device="cpu", **kwargs)
    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 3, 3) for _ in range(30)]
    with make() as sampler:
        sampler.reset()
        for a in actions[:13]:
            sampler.step(a)
        torch.save(sampler.state_dict(), tmp_path / "state.pt")
        reference = [sampler.step(a) for a in actions[13:]]
    with make() as sampler:
        sampler.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        for a, expected in zip(actions[13:], reference, strict=True):
            assert_same_step(sampler.step(a), expected)
    assert any(finished_episodes(s) for s in reference)


@pytest.mark.parametrize(
    ("crafted", "message"),
    [
        ({"start_seeds": [5]}, "'start_seeds': expected a list of 4 seeds"),
        ({"start_seeds": ["x", None, None, None]}, "'start_seeds': .* got 'x'"),
        ({"start_seeds": [True, None, None, None]}, "'start_seeds': .* got True"),
        ({"start_seeds": [10**400, None, None, None]}, "'start_seeds': .* got 1000"),
        ({"returns": torch.zeros(9, dtype=torch.float64)}, "'returns': expected 4 finite"),
        ({"returns": torch.full((4,), torch.nan, dtype=torch.float64)}, "'returns'"),
        ({"lengths": torch.tensor([-5, 0, 0, 0])}, "'lengths': expected 4 int64 counts"),
        ({"lengths": [0, 0, 0, 0]}, "'lengths'"),
    ],
)
def test_a_crafted_sampler_state_in_a_resigned_checkpoint_is_refused_by_name(
    tmp_path: Path, crafted: dict, message: str
) -> None:
    # As an attacker would: a genuine checkpoint with episodes in flight, one sampler entry
    # changed, signed as the project signs. Before the check, a short list was an IndexError
    # at the first episode's end, and a bool, a float or a NaN return was taken as is.
    make = functools.partial(BatchedSampler, task=CORRIDOR, num_envs=4, seed=3, device="cpu")
    with make() as sampler:
        make_trainer(tmp_path / "run", sampler, [StopAt(64)]).train()
    genuine = load_checkpoint(list_checkpoints(tmp_path / "run")[-1])
    assert genuine["sampler"] is not None
    state = {**genuine, "sampler": {**genuine["sampler"], **crafted}}
    path = save_checkpoint(tmp_path / "crafted", state, 0, 64)
    with make() as sampler:
        with pytest.raises(ValueError, match=f"sampler state {message}"):
            make_trainer(tmp_path / "resumed", sampler).load_state_dict(load_checkpoint(path))
        # Refused before anything changed: the genuine state loads on the same sampler.
        sampler.load_state_dict(genuine["sampler"])


def test_evaluation_mode_cannot_be_saved() -> None:
    with BatchedSampler(task=CORRIDOR, num_envs=2, episode_seeds=[1, 2], device="cpu") as sampler:
        with pytest.raises(NotImplementedError, match="evaluation mode"):
            sampler.state_dict()


@pytest.mark.parametrize(
    ("task", "kwargs"),
    [(NAV, {"vectorization_mode": "sync"}), (NAV, {}), (CORRIDOR, {})],
    ids=["nav-sync", "nav-torch", "torch"],  # nav-torch: BatchedPointNav, ppo_nav's default
)
def test_an_interrupted_and_resumed_run_is_bitwise_equal_to_uninterrupted(
    task: dict, kwargs: dict, tmp_path: Path
) -> None:
    # test_resume's trainer (imitation then PPO, a GRU), its sampler a batched one
    make = functools.partial(BatchedSampler, task=task, num_envs=4, seed=3, device="cpu", **kwargs)
    with make() as sampler:
        reference = make_trainer(tmp_path / "a", sampler)
        reference.train()
    for stop in (64, None):  # mid-stage, episodes in flight
        with make() as sampler:
            trainer = make_trainer(tmp_path / "b", sampler, [StopAt(stop)] if stop else [])
            found = list_checkpoints(tmp_path / "b")
            if found:
                trainer.load_state_dict(load_checkpoint(found[-1]))
            trainer.train()
    assert trainer.pipeline.finished and reference.pipeline.finished
    for (name, a), b in zip(
        reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    for key in ("losses/ppo/policy_loss", "charts/episodic_return"):
        assert reference.last_metrics[key] == trainer.last_metrics[key], key


def test_a_stop_before_the_first_rollout_saves_nothing_in_flight_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    # A SIGTERM during start-up: the checkpoint is written before the environments were ever
    # reset (a batched task cannot save episodes it has not started), and the resume starts
    # where the run would have.
    make = functools.partial(BatchedSampler, task=NAV, num_envs=4, seed=3, device="cpu")
    with make() as sampler:
        reference = make_trainer(tmp_path / "a", sampler)
        reference.train()
    with make() as sampler:
        trainer = make_trainer(tmp_path / "b", sampler)
        trainer.request_stop("test")
        trainer.train()
    first = load_checkpoint(list_checkpoints(tmp_path / "b")[-1])
    assert first["sampler"] is None and first["rollout"] is None
    with make() as sampler:
        trainer = make_trainer(tmp_path / "b", sampler)
        trainer.load_state_dict(first)
        trainer.train()
    for (name, a), b in zip(
        reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


# -------------------------------------------------------------------- the engine
@pytest.mark.parametrize("collector", ["local", "process"])
def test_a_training_run_with_sampler_batched(
    compose_cfg: Callable, tmp_path: Path, collector: str
) -> None:
    # collector=process: each collection worker builds a batched sampler from the config
    from rl.engine import run

    overrides = ["+experiment=ppo_cartpole", "+debug=smoke", "sampler=batched",
                 f"collector={collector}", "eval.num_episodes=2",
                 "total_env_steps=128"]  # fmt: skip
    metrics = run.train(compose_cfg(overrides))
    assert metrics["charts/episodic_return"] > 0
    saved = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert saved["config"]["sampler"]["_target_"] == "rl.sampling.BatchedSampler"
    if collector == "local":
        assert len(saved["sampler"]["env"]["episodes"]) == 4  # the episodes in flight


def test_the_config_forms_of_a_batched_env_are_checked() -> None:
    batched_task = {**CORRIDOR, "_target_": "rl_envs.toys.corridor.BatchedCorridor"}
    with pytest.raises(ValueError, match="nothing to vectorise"):
        BatchedSampler(task=batched_task, num_envs=2, vectorization_mode="sync", device="cpu")
    with pytest.raises(ValueError, match="task.observations acts on"):
        BatchedSampler(
            task={**batched_task, "observations": [{"_target_": "x"}]}, num_envs=2, device="cpu"
        )
    with pytest.raises(ValueError, match="nothing to choose"):
        BatchedSampler(
            task=user_vector("NextStep"), num_envs=2, vectorization_mode="async", device="cpu"
        )
    assert issubclass(BatchedCorridor, BatchedEnv) and CorridorEnv.batched_env
