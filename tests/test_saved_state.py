"""A checkpoint's saved state comes from a file, maybe anyone's: every value is checked first.

Each crafted state starts from a genuine one with episodes in flight and changes one value, as
an attacker would (through a re-signed checkpoint where a trainer resumes). It must be refused
with a ``ValueError`` naming the value, before anything is restored; the same sampler then
loads the genuine state. Before the check, a saved generator state named any attribute of
``numpy.random`` to call (``seed`` reseeded the process's global generator), and an action,
seed or generator value of another kind or range was replayed as is, or failed as a raw
``TypeError`` or ``OverflowError``.
"""

from __future__ import annotations

import copy
import functools
import io
import math
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from crafted import SMOKE, crafted, entries, resign
from small import assert_same_step
from test_nav3d_task import make_env as make_nav3d
from test_resume import StopAt, make_trainer

from rl.checkpoints.errors import CheckpointError, UntrustedCheckpointError
from rl.checkpoints.files import list_checkpoints, load_checkpoint, save_checkpoint, with_digest
from rl.collection.normalization import Normalizer, NormalizeSettings, RunningMeanStd
from rl.engine import run
from rl.sampling import BatchedSampler, MultiprocessSampler, SerialSampler
from rl.utils.saved import checked_weights, odd_values
from rl_envs.pointnav.batched import BatchedPointNav
from rl_envs.toys.corridor import BatchedCorridor

CORRIDOR = {"_target_": "rl_envs.toys.corridor.CorridorEnv", "length": 5, "max_steps": 6}
PENDULUM = {"_target_": "rl.tasks.make_gym_env", "env_id": "Pendulum-v1",
            "env_kwargs": {"max_episode_steps": 7}}  # fmt: skip
Craft = Callable[[dict[str, Any]], None]


def numpy_global_state() -> bytes:
    """NumPy's global generator, exactly (a file's ``np.random.seed`` would change it)."""
    return pickle.dumps(np.random.get_state())


def episode(i: int, key: str, value: Any) -> Craft:
    """Set ``episodes[i][key]``."""
    return lambda state: state["episodes"][i].__setitem__(key, value)


def generator(key: str, value: Any) -> Craft:
    """Set one entry of ``episodes[1]``'s saved generator state."""
    return lambda state: state["episodes"][1]["np_random"].__setitem__(key, value)


CRAFTED: list[tuple[str, Craft, str]] = [
    ("short", lambda s: s["episodes"].pop(), r"'episodes': expected a list of 4 episodes"),
    ("not-a-dict", lambda s: s["episodes"].__setitem__(1, "x"), r"'episodes'\[1\]: expected a"),
    ("extra-key", episode(2, "code", "print"), r"'episodes'\[2\]: expected a dict of seed"),
    ("bool-seed", episode(0, "seed", True), r"'episodes'\[0\]\['seed'\]: expected None or"),
    ("huge-seed", episode(3, "seed", 2**64), r"'episodes'\[3\]\['seed'\]"),
    (
        "generator-by-name",
        generator("bit_generator", "seed"),
        r"\['np_random'\]: expected a PCG64",
    ),
    ("float-state", generator("has_uint32", 0.5), r"'episodes'\[1\]\['np_random'\]"),
    ("generator-extra", generator("extra", 1), r"'episodes'\[1\]\['np_random'\]"),
    ("action-range", episode(0, "actions", [1, 7]), r"\['actions'\]\[1\]: expected an action of"),
    ("action-string", episode(0, "actions", ["1"]), r"\['actions'\]\[0\]: .* got '1'"),
    ("action-bool", episode(0, "actions", [True]), r"\['actions'\]\[0\]: .* got True"),
    ("actions-string", episode(0, "actions", "0,1"), r"'episodes'\[0\]\['actions'\]: expected a"),
    ("env-state-list", episode(2, "env_state", [1]), r"'episodes'\[2\]\['env_state'\]: expected"),
    ("env-state-value", episode(2, "env_state", {"rng": "x"}), r"'env_state' was refused.*'rng'"),
    ("string-layout", lambda s: s.__setitem__("num_envs", "4"), r"sampler state for .4. envs"),
]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A checkpoint of a corridor run on a serial sampler, with episodes in flight."""
    folder = tmp_path_factory.mktemp("genuine")
    with SerialSampler(task=CORRIDOR, num_envs=4, seed=3) as sampler:
        make_trainer(folder, sampler, [StopAt(64)]).train()
    state = load_checkpoint(list_checkpoints(folder)[-1])
    assert all(ep["np_random"] and "env_state" in ep for ep in state["sampler"]["episodes"])
    return state


@pytest.mark.parametrize(
    ("craft", "message"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED]
)
def test_a_crafted_episode_in_a_resigned_checkpoint_is_refused_by_name(
    genuine: dict[str, Any], tmp_path: Path, craft: Craft, message: str
) -> None:
    sampler_state = copy.deepcopy(genuine["sampler"])
    craft(sampler_state)
    path = save_checkpoint(tmp_path / "crafted", {**genuine, "sampler": sampler_state}, 0, 64)
    before = numpy_global_state()
    make = functools.partial(SerialSampler, task=CORRIDOR, num_envs=4, seed=3)
    with make() as sampler, make() as reference:
        with pytest.raises(ValueError, match=message):
            make_trainer(tmp_path / "resumed", sampler).load_state_dict(load_checkpoint(path))
        # Nothing ran that the file chose: NumPy's global generator is as it was.
        assert numpy_global_state() == before
        # Refused before anything changed: the genuine state loads on the same sampler.
        assert_same_step(
            sampler.load_state_dict(genuine["sampler"]),
            reference.load_state_dict(genuine["sampler"]),
        )


def in_flight(sampler: Any, actions: np.ndarray) -> dict[str, Any]:
    """``sampler``'s state after ``actions`` from a reset."""
    sampler.reset()
    for a in actions:
        sampler.step(a)
    return sampler.state_dict()


@pytest.mark.parametrize(
    "make",
    [
        functools.partial(MultiprocessSampler, num_processes=2, mp_start_method="fork"),
        functools.partial(BatchedSampler, device="cpu", vectorization_mode="sync"),
    ],
    ids=["multiprocess", "batched-gym-vector"],
)
def test_every_sampler_that_replays_episodes_checks_them(make: Callable[..., Any]) -> None:
    actions = np.random.default_rng(0).integers(0, 3, size=(9, 4))
    with make(task=CORRIDOR, num_envs=4, seed=3) as sampler:
        state = in_flight(sampler, actions)
        episodes = state["env"]["episodes"] if "env" in state else state["episodes"]
        genuine = copy.deepcopy(state)
        episodes[1]["np_random"]["bit_generator"] = "seed"
        with pytest.raises(ValueError, match=r"'episodes'\[1\]\['np_random'\]: expected a PCG64"):
            sampler.load_state_dict(state)
        episodes[1]["np_random"]["bit_generator"] = "PCG64"
        episodes[3]["actions"][-1] = 3
        with pytest.raises(ValueError, match=r"'episodes'\[3\]\['actions'\]\[\d+\]: .* got 3"):
            sampler.load_state_dict(state)
        sampler.load_state_dict(genuine)


@pytest.mark.parametrize(
    ("action", "shown"),
    [
        ([5.0], r"\[5.0\]"),
        ([np.nan], r"\[nan\]"),
        ([[1.0]], r"\[\[1.0\]\]"),
        ([1], None),
        ("1", "'1'"),
    ],
    ids=["out-of-bounds", "nan", "shape", "int-is-a-number", "string"],
)
def test_continuous_actions_are_checked_against_the_box(action: Any, shown: str | None) -> None:
    actions = np.random.default_rng(0).uniform(-2, 2, size=(4, 2, 1)).astype(np.float32)
    with SerialSampler(task=PENDULUM, num_envs=2, seed=1) as sampler:
        state = in_flight(sampler, actions)
        state["episodes"][0]["actions"][2] = action
        if shown is None:  # an integer is a number in the box: replayed as the float it is
            sampler.load_state_dict(state)
            return
        with pytest.raises(ValueError, match=rf"\['actions'\]\[2\]: .*Box.* got {shown}"):
            sampler.load_state_dict(state)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"plan_rng": {"bit_generator": "seed"}, "plan_episodes": 1}, "expected a PCG64"),
        ({"plan_rng": None, "plan_episodes": True}, "'plan_episodes': expected an int"),
        ({"plan_rng": None, "plan_episodes": 10**9}, "'plan_episodes': expected an int"),
    ],
    ids=["generator-by-name", "bool", "out-of-range"],
)
def test_a_nav3d_reset_state_from_a_file_is_checked(state: dict, message: str) -> None:
    env = make_nav3d(episodes_per_floorplan=3)
    before = numpy_global_state()
    try:
        with pytest.raises(ValueError, match=message):
            env.set_reset_state(state)
        assert numpy_global_state() == before
    finally:
        env.close()


# ------------------------------------------------ batched environments' own saved states
NAV_SMALL = {"size": 9, "rooms_per_side": 2, "max_steps": 50, "split": "train"}
Tensors = dict[str, Any]


def nav_in_flight(config: dict[str, Any], steps: int = 23) -> BatchedPointNav:
    """A BatchedPointNav of 4 environments after ``steps`` random actions."""
    env = BatchedPointNav(**config, num_envs=4, device="cpu")
    env.reset([11, 12, 13, 14])
    rng = np.random.default_rng(5)
    for _ in range(steps):
        env.step(torch.from_numpy(rng.integers(0, 4, 4)))
    return env


def at(key: str, index: tuple[int, ...], value: Callable[[int], int]) -> Craft:
    """Set ``state[key][index]`` (a key path with ``/``) to ``value(old)``."""

    def craft(state: Tensors) -> None:
        *path, last = key.split("/")
        for part in path:
            state = state[part]
        state[last][index] = value(int(state[last][index]))

    return craft


def replaced(key: str, value: Callable[[Any], Any]) -> Craft:
    """Replace ``state[key]`` by ``value(old)``."""
    return lambda state: state.__setitem__(key, value(state[key]))


DOORS = 4  # NAV_SMALL's 2x2 rooms: the rows are 2 D + 2 of distances, D door offsets, a goal
NAV_CRAFTED: list[tuple[str, Craft, str]] = [
    ("float-rows", replaced("state", lambda t: t.double()), r"'state': expected a torch.int64"),
    ("short-rows", replaced("state", lambda t: t[:, :3]), r"'state': expected .* shape \(8, 4\)"),
    ("position", at("state", (0, 1), lambda v: 10**6), r"position out of \[0, "),
    ("negative-position", at("state", (0, 1), lambda v: -1), r"position out of"),
    ("direction", at("state", (1, 0), lambda v: 4), r"direction out of \[0, 4\)"),
    ("steps", at("state", (3, 2), lambda v: 50), r"steps out of \[0, 50\)"),
    ("moved", at("state", (4, 0), lambda v: 10**3), r"moved out of \[0, steps\]"),
    ("start-distance", at("state", (5, 0), lambda v: 10**4), r"start distance out of"),
    ("goal", at("state", (2, 3), lambda v: v + 1), r"goals are not the episodes' goals"),
    ("distance", at("state", (6, 0), lambda v: v + 1), r"distances are not the agents' cells'"),
    ("ahead", at("state", (7, 1), lambda v: v - 1), r"distances are not the agents' cells'"),
    ("door-offset", at("episode", (2 * DOORS + 2, 0), lambda v: 10**3), "door or goal out of"),
    ("goal-index", at("episode", (-1, 0), lambda v: 10**6), "a door or goal out of range"),
    ("door-moved", at("episode", (2 * DOORS + 2, 1), lambda v: v ^ 1), r"inconsistent state"),
    ("addend", at("episode", (DOORS + 2, 0), lambda v: v + 1), r"episodes are not their layouts'"),
    ("stream-pos", at("streams/pos", (0,), lambda v: -1), r"'pos': expected values in"),
    ("stream-skip", at("streams/skip", (2,), lambda v: 10**6), r"'skip': expected values in"),
    ("stream-limb", at("streams/pcg64", (1, 0), lambda v: 1 << 40), r"'pcg64': expected values"),
    ("stream-kind", lambda s: s["streams"].__setitem__("raw", s["streams"]["raw"].int()), "'raw'"),
    ("bool-envs", replaced("num_envs", lambda v: True), r"state of True environments"),
    ("config-string", replaced("config", lambda v: "x"), r"state of a PointNav configured 'x'"),
    ("extra-key", lambda s: s.__setitem__("code", "print"), r"a BatchedPointNav state is a dict"),
]


@pytest.mark.parametrize(
    ("craft", "message"), [c[1:] for c in NAV_CRAFTED], ids=[c[0] for c in NAV_CRAFTED]
)
def test_a_crafted_batched_pointnav_state_is_refused_before_anything_changes(
    craft: Craft, message: str
) -> None:
    # ppo_nav's default environment. Unchecked, a position or distance past its tables was an
    # IndexError on the CPU and would be a device-side assert on a GPU; a shorter row, a float
    # tensor or a negative stream position was broadcast or read as is.
    genuine = nav_in_flight(NAV_SMALL).state_dict()
    assert genuine["episode"].shape[0] == 3 * DOORS + 3
    state = copy.deepcopy(genuine)
    craft(state)
    env = BatchedPointNav(**NAV_SMALL, num_envs=4, device="cpu")
    fresh = BatchedPointNav(**NAV_SMALL, num_envs=4, device="cpu")
    with pytest.raises(ValueError, match=message):
        env.load_state_dict(state)
    assert_same_step(env.load_state_dict(genuine), fresh.load_state_dict(genuine))
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 4, 4))
    assert_same_step(env.step(actions), fresh.step(actions))


@pytest.mark.parametrize(
    "config",
    [
        {},
        NAV_SMALL,
        {"size": 13, "rooms_per_side": 3, "min_start_distance": 13},
        {"size": 7, "rooms_per_side": 1, "split": "test"},
    ],  # fmt: skip
    ids=["nav", "nav_small", "3x3-64bit", "one-room"],
)
def test_every_genuine_batched_pointnav_state_passes_the_checks(config: dict[str, Any]) -> None:
    env = nav_in_flight(config, steps=0)
    rng = np.random.default_rng(2)
    for _ in range(4):
        for _ in range(17):
            env.step(torch.from_numpy(rng.integers(0, 4, 4)))
        fresh = BatchedPointNav(**config, num_envs=4, device="cpu")
        fresh.load_state_dict(env.state_dict())
        actions = torch.from_numpy(rng.integers(0, 4, 4))
        assert_same_step(env.step(actions), fresh.step(actions))


@pytest.mark.parametrize(
    ("craft", "message"),
    [
        (at("cell", (0,), lambda v: 9), r"'cell': expected values in \[0, 5\)"),
        (at("t", (1,), lambda v: -3), r"'t': expected values in \[0, 6\)"),
        (replaced("rng", lambda t: t[:1]), r"'rng': expected a torch.int64 tensor of shape \(3,"),
        (replaced("start", lambda t: t.float()), r"'start': expected a torch.int64"),
    ],
    ids=["cell", "negative-step", "broadcast", "float"],
)
def test_a_crafted_batched_corridor_state_is_refused(craft: Craft, message: str) -> None:
    env = BatchedCorridor(num_envs=3, length=5, max_steps=6, device="cpu")
    env.reset([1, 2, 3])
    env.step(torch.tensor([2, 2, 0]))
    state = copy.deepcopy(env.state_dict())
    craft(state)
    with pytest.raises(ValueError, match=message):
        env.load_state_dict(state)


# ------------------------------------------ the learner's state and the carried rollout
def entry(path: str, value: Callable[[Any], Any]) -> Craft:
    """Set the entry at ``path`` (keys and list indices, by ``/``) to ``value(old)``."""

    def craft(state: dict[str, Any]) -> None:
        *parents, last = (int(k) if k.isdigit() else k for k in path.split("/"))
        node: Any = state
        for key in parents:
            node = node[key]
        node[last] = value(node[last])

    return craft


def shorter(t: torch.Tensor) -> torch.Tensor:
    return t.flatten()[:-1].clone()


TRAINING_CRAFTED: list[tuple[str, Craft, str]] = [
    # a flag the file would flip: Adam then maximises the loss, silently
    ("maximize", entry("optimizer/param_groups/0/maximize", lambda v: "yes"), r"\.maximize"),
    (
        "foreach",
        entry("optimizer/param_groups/0/foreach", lambda v: True),
        r"foreach: expected a None",
    ),
    ("negative-eps", entry("optimizer/param_groups/0/eps", lambda v: -1.0), r"\.eps: -1.0"),
    ("nan-lr", entry("optimizer/param_groups/0/lr", lambda v: math.nan), r"\[0\]\.lr: nan"),
    ("huge-decay", entry("optimizer/param_groups/0/weight_decay", lambda v: 10**30), "decay"),
    (
        "extra-hyper",
        entry("optimizer/param_groups/0", lambda g: {**g, "x": 1}),
        "unexpected keys .x.",
    ),
    ("same-param", entry("optimizer/param_groups/0/params", lambda p: [0] * len(p)), "distinct"),
    ("moment-shape", entry("optimizer/state/0/exp_avg", shorter), r"optimizer\.state\.0"),
    ("moment-none", entry("optimizer/state/1/exp_avg_sq", lambda v: None), r"state\.1: expected"),
    ("step-negative", entry("optimizer/state/0/step", lambda v: v - 99), r"optimizer\.state\.0"),
    ("step-tensor", entry("optimizer/state/1/step", lambda v: torch.ones(32)), r"state\.1"),
    # each passed the check and failed in Adam's first step, raw, or as a NaN loss
    ("moments-missing", entry("optimizer/state/1", lambda v: {"step": v["step"]}), "Adam keeps"),
    ("moment-scalar", entry("optimizer/state/0/exp_avg", lambda v: torch.tensor(3.0)), "Adam"),
    ("second-moment-negative", entry("optimizer/state/0/exp_avg_sq", lambda v: -v - 1), ">= 0"),
    # `state.get(key) or {}` asked a tensor for its truth: a raw RuntimeError
    ("trainer-tensor", entry("trainer", lambda v: torch.zeros(2)), "entry trainer: expected a"),
    ("trainer-list", entry("trainer", lambda v: [1]), "entry trainer: expected a mapping"),
    ("losses-tensor", entry("losses", lambda v: torch.zeros(2)), "entry losses: expected a"),
    # the learning rate is the config's: 1e30 became a NaN loss at the first update
    ("base-lr", entry("lr_scheduler/base_lrs", lambda v: [1e30]), r"base_lrs: \[1e\+30\]"),
    ("initial-lr", entry("optimizer/param_groups/0/initial_lr", lambda v: 1e30), "initial_lr"),
    ("scheduler-key", entry("lr_scheduler", lambda s: {**s, "optimizer": {}}), "lr_scheduler:"),
    ("epoch-string", entry("lr_scheduler/last_epoch", lambda v: "x"), r"lr_scheduler\.last_epoch"),
    ("epoch-huge", entry("lr_scheduler/_step_count", lambda v: 10**30), r"_step_count"),
    ("stage-bool", entry("pipeline/current_stage_index", lambda v: True), r"current_stage_index"),
    ("steps-negative", entry("pipeline/stage_steps", lambda v: -64), r"pipeline\.stage_steps"),
    ("steps-float", entry("pipeline/total_steps", lambda v: 64.5), r"pipeline\.total_steps"),
    ("log-step", entry("trainer/last_log_step", lambda v: 1.5), r"trainer\.last_log_step"),
    ("skips-bool", entry("trainer/nonfinite_skips", lambda v: True), r"trainer\.nonfinite_skips"),
    ("metric-string", entry("trainer/last_metrics", lambda m: {**m, "x": "y"}), "last_metrics"),
    ("offpolicy-stage", entry("rng/offpolicy", lambda v: {"7": torch.zeros(3)}), "rng.offpolicy"),
    ("nan-gaussian", entry("rng/python", lambda p: (*p[:2], math.nan)), "cached Gaussian"),
    ("state-shape", entry("rollout/state/h", shorter), r"rollout\.state\.h: expected"),
    ("state-kind", entry("rollout/state/h", lambda h: h.long()), r"rollout\.state\.h"),
    (
        "state-keys",
        entry("rollout/state", lambda s: {"c": s["h"]}),
        r"rollout\.state: missing keys 'h'",
    ),
    ("starts-kind", entry("rollout/episode_starts", lambda v: v.float()), "episode_starts"),
    ("obs-string", entry("rollout/obs", lambda o: {k: "x" for k in o}), r"rollout\.obs"),
]


@pytest.mark.parametrize(
    ("craft", "message"),
    [c[1:] for c in TRAINING_CRAFTED],
    ids=[c[0] for c in TRAINING_CRAFTED],
)
def test_a_crafted_training_state_is_refused_by_name(
    genuine: dict[str, Any], tmp_path: Path, craft: Craft, message: str
) -> None:
    # Before the checks, each of these was read as is (a flag, a count, a NaN, a broadcast
    # state) or failed in the middle of training with a raw error from torch.
    state = copy.deepcopy(genuine)
    craft(state)
    path = save_checkpoint(tmp_path / "crafted", state, 0, 64)
    with SerialSampler(task=CORRIDOR, num_envs=4, seed=3) as sampler:
        trainer = make_trainer(tmp_path / "resumed", sampler)
        with pytest.raises((CheckpointError, ValueError), match=message):
            trainer.load_state_dict(load_checkpoint(path))


def test_the_genuine_training_state_resumes(genuine: dict[str, Any], tmp_path: Path) -> None:
    with SerialSampler(task=CORRIDOR, num_envs=4, seed=3) as sampler:
        trainer = make_trainer(tmp_path, sampler)
        trainer.load_state_dict(copy.deepcopy(genuine))
        assert trainer.pipeline.total_steps == 64


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("wandb_run_id", "../../elsewhere", "is not a wandb run id"),
        ("wandb_run_id", ["x"], "is not a wandb run id"),
        ("optimizer", "maximize", r"optimizer\.param_groups\[0\]\.maximize"),
    ],
    ids=["run-id-path", "run-id-list", "maximize"],
)
def test_a_resume_names_what_a_crafted_checkpoint_holds(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, key: str, value: Any, message: str
) -> None:
    # Through train.py's resume=: the wandb run id names a folder of the run's wandb/.
    folder, path, state = crafted(smoke_run, tmp_path)
    if key == "optimizer":
        state["optimizer"]["param_groups"][0]["maximize"] = "yes"
    else:
        state[key] = value
    resign(path, state)
    before = list_checkpoints(folder)
    with pytest.raises(CheckpointError, match=message):
        run.train(compose_cfg([*SMOKE, f"resume={folder}", "total_env_steps=384"]))
    assert list_checkpoints(folder) == before


def test_normalisation_statistics_of_another_kind_are_refused() -> None:
    stats = RunningMeanStd((2,))
    genuine = stats.state_dict()
    for crafted_state in (
        {**genuine, "count": math.nan},
        {**genuine, "count": -3.0},
        {**genuine, "count": "7"},
        {**genuine, "var": -genuine["var"] - 1},
    ):
        with pytest.raises(ValueError, match="negative, or the count not a number"):
            stats.load_state_dict(crafted_state)
    stats.load_state_dict(genuine)


# ------------------------------------------------ tensors and weights of another kind
def written(path: Path, state: dict[str, Any]) -> None:
    """``state`` over the checkpoint ``path``, signed as this project signs its files, as is
    (``save_checkpoint`` refuses some of these states before writing them)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(with_digest(buffer.getvalue()))


def nested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


ODD_TENSORS: list[tuple[str, Callable[[torch.Tensor], Any], str]] = [
    ("meta", lambda t: torch.empty_like(t, device="meta"), "meta Tensor of torch"),
    ("sparse", lambda t: t.to_sparse(), "sparse_coo"),
    ("nested", lambda t: nested(t, 100), "nested deeper than 32"),
]
ODD_PLACES = [
    "model/trunk.0.weight",
    "optimizer/state/0/exp_avg",
    "sampler/env/state",
    "rollout/episode_starts",
]


@pytest.mark.parametrize(
    ("odd", "named"), [o[1:] for o in ODD_TENSORS], ids=[o[0] for o in ODD_TENSORS]
)
def test_meta_sparse_and_nested_tensors_are_refused_when_loaded_and_never_saved(
    smoke_run: Path, tmp_path: Path, odd: Callable[[torch.Tensor], Any], named: str
) -> None:
    # Before the check each failed in whatever read it first, as a raw error from torch (a
    # meta or sparse tensor in the finiteness check, evaluation included), a RecursionError,
    # or was restored as is (a meta or sparse tensor in a batched sampler's state).
    for place in ODD_PLACES:
        folder, path, state = crafted(smoke_run, tmp_path, place.replace("/", "_"))
        entry(place, odd)(state)
        written(path, state)
        at = re.escape(place.replace("/", "."))  # (nesting: the place, then its list indices)
        with pytest.raises(UntrustedCheckpointError, match=rf": {at}[ .].*{named}.*no checkpoint"):
            load_checkpoint(path)
        # Saving one is refused too, rather than writing a file no run could load.
        before = list_checkpoints(folder)
        with pytest.raises(CheckpointError, match=rf"not written: it would hold {at}[ .]"):
            save_checkpoint(folder, state, 0, 512)
        assert list_checkpoints(folder) == before


def test_complex_and_quantized_tensors_a_policy_may_hold_save_and_load(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)
    model = {"phase": torch.randn(3, dtype=torch.complex64), "quantized": q}
    path = save_checkpoint(tmp_path, {"model": model, "config": {"seed": 0}}, 0, 64)
    loaded = load_checkpoint(path)["model"]
    assert torch.equal(loaded["phase"], model["phase"]) and torch.equal(loaded["quantized"], q)


def test_any_depth_of_nesting_is_named_not_a_recursion_error() -> None:
    # torch.save cannot write this (pickle recurses), but a hand-written pickle loads as it:
    # weights_only's unpickler keeps no Python stack.
    deep = {"optimizer": {"state": nested(torch.zeros(2), 100_000)}}
    [odd] = odd_values(deep)
    assert odd.startswith("optimizer.state.0.0.") and odd.endswith(
        "(containers nested deeper than 32)"
    )
    assert odd_values({"model": {"w": torch.zeros(2)}, "steps": [1, [2, (3,)]]}) == []


WEIGHTS_CRAFTED: list[tuple[str, Craft, str]] = [
    ("float64", entry("model/trunk.0.weight", lambda w: w.double()), r"model\.trunk\.0\.weight"),
    ("bool", entry("model/trunk.0.weight", lambda w: w > 0), r"model\.trunk\.0\.weight"),
    (
        "list",
        entry("model", lambda m: list(m.values())),
        "model: expected a mapping|'model' entry is .* not a dict",
    ),
    ("int-key", entry("model", lambda m: {**m, 3: m["trunk.0.bias"]}), "unexpected keys 3"),
]


@pytest.mark.parametrize(
    ("craft", "message"), [c[1:] for c in WEIGHTS_CRAFTED], ids=[c[0] for c in WEIGHTS_CRAFTED]
)
def test_weights_of_another_kind_are_refused_by_name_through_every_entry(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, craft: Craft, message: str
) -> None:
    # Before the check a weight of another dtype was cast as it loaded, and a list of weights
    # or a key not a string was a raw TypeError or AttributeError from torch (but on resume=).
    folder, path, state = crafted(smoke_run, tmp_path)
    craft(state)
    written(path, state)
    ways = entries(folder, compose_cfg, tmp_path / "out")
    init = [*SMOKE, f"init_from={path}", f"output_dir={tmp_path / 'init'}"]
    ways.append(("init_from", lambda: run.train(compose_cfg(init, set_output_dir=False))))
    for name, way in ways:
        with pytest.raises(CheckpointError, match=message):
            way()
        assert not (tmp_path / "init" / "checkpoints").exists(), name


def test_a_reference_bomb_is_refused_at_once(smoke_run: Path, tmp_path: Path) -> None:
    # Pickle stores a list once however often it is referenced: this 2 MB file stands for 10**9
    # values, and walking them (the kind check did) took hours, in evaluate.py as in resume=.
    folder, path, state = crafted(smoke_run, tmp_path)
    row = [[0.0] * 1000] * 1000
    state["finished_episodes"] = [row] * 1000
    written(path, state)
    with pytest.raises(UntrustedCheckpointError, match=r"episodes\S* \(more than 8388608"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not written: it would hold finished_episodes"):
        save_checkpoint(folder, state, 0, 512)


def test_the_file_s_module_metadata_is_never_taken(
    genuine: dict[str, Any], tmp_path: Path
) -> None:
    # A state dict's _metadata holds torch's per-module load flags. The file's asked the load to
    # assign its tensors in place of the parameters: the resumed run then trained nothing (the
    # optimizer kept the old ones), with no error. Another kind was a raw AttributeError.
    state = copy.deepcopy(genuine)
    weights = state["model"]
    weights._metadata = {
        k: {"version": 1, "assign_to_params_buffers": True} for k in weights._metadata
    }
    path = save_checkpoint(tmp_path / "crafted", state, 0, 64)
    with SerialSampler(task=CORRIDOR, num_envs=4, seed=3) as sampler:
        trainer = make_trainer(tmp_path / "resumed", sampler)
        trainer.load_state_dict(load_checkpoint(path))
        optimized = [p for group in trainer.optimizer.param_groups for p in group["params"]]
        assert [id(p) for p in trainer.model.parameters()] == [id(p) for p in optimized]
        for key, value in trainer.model.state_dict().items():
            assert torch.equal(value, weights[key])
    weights._metadata = 5
    with pytest.raises(AttributeError):  # (what torch's own load does with it)
        trainer.model.load_state_dict(weights)
    assert not isinstance(checked_weights(weights, trainer.model, "model")._metadata, int)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"clip": "1"}, "clip"),
        ({"clip": -1.0}, "clip"),  # every observation clipped to -1, silently
        ({"epsilon": 0.0}, "epsilon"),  # with a variance of 0: infinite observations
        ({"observations": "yes"}, "observations"),
    ],
    ids=["clip-string", "clip-negative", "epsilon-zero", "flag-string"],
)
def test_saved_normalisation_settings_are_typed_and_ranged(settings: dict, named: str) -> None:
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (3,))})
    genuine = Normalizer(space, NormalizeSettings(True, False, 10.0, None, 1e-8)).state_dict()
    assert Normalizer.from_state(space, genuine) is not None
    crafted_state = {**genuine, "settings": {**genuine["settings"], **settings}}
    with pytest.raises(ValueError, match=rf"normalizer\.settings\.{named}"):
        Normalizer.from_state(space, crafted_state)
    stats = {**genuine["obs"]["x"], "var": torch.ones(3, dtype=torch.complex128)}
    with pytest.raises(ValueError, match="not floating tensors"):
        Normalizer.from_state(space, {**genuine, "obs": {"x": stats}})
