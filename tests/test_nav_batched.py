"""BatchedPointNav (rl_envs.pointnav.batched) equals PointNavEnv stepped one environment at a time.

The reference is N PointNavEnv stepped in a Python loop: environment ``i`` reset with
``seeds[i]``, and after each episode with ``next_seeds[i]`` (evaluation) or unseeded. Every
field of every step is compared bit for bit: observations, expert actions, rewards (float32, as
the serial sampler records them), terminated/truncated, the truncated episodes' final
observations, and the ended episodes' metrics. Actions mix uniform random stretches,
FORWARD-heavy ones (bumping into walls: truncations) and the expert's (successes), so episodes
end by a failed STOP, by success and by truncation; the tests check each happened.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.utils import seeding

from rl.tasks.splits import _BUCKETS
from rl_envs.pointnav import PointNavEnv
from rl_envs.pointnav.batched import BatchedPointNav, _doors_in_split, _Streams
from rl_envs.pointnav.env import Actions
from rl_envs.pointnav.layout import RoomLayout
from rl_envs.pointnav.view import process_vis, process_vis_row

METRICS = ("success", "spl", "final_distance", "shortest_path_length")


class Reference:
    """``n`` PointNavEnv, stepped in a loop as a serial sampler steps them (auto-reset)."""

    def __init__(self, config: dict[str, Any], seeds: list[int | None]) -> None:
        self.envs = [PointNavEnv(**config) for _ in seeds]
        firsts = [env.reset(seed=seed) for env, seed in zip(self.envs, seeds, strict=True)]
        self.obs = [obs for obs, _ in firsts]
        self.expert = np.array([info["expert_action"] for _, info in firsts], dtype=np.int64)
        self.ended = {"success": 0, "failure": 0, "truncated": 0}

    def step(self, actions: np.ndarray, next_seeds: list[int | None] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"rewards": [], "terminated": [], "truncated": [], "metrics": {}}
        final_image = np.zeros((len(self.envs), *self.obs[0]["image"].shape), dtype=np.uint8)
        final_goal = np.zeros((len(self.envs), 3), dtype=np.float32)
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(int(actions[i]))
            out["rewards"].append(np.float32(reward))
            out["terminated"].append(terminated)
            out["truncated"].append(truncated and not terminated)
            if terminated or truncated:
                metrics = info["episode_metrics"]
                out["metrics"][i] = metrics
                if truncated:
                    final_image[i], final_goal[i] = obs["image"], obs["goal"]
                    self.ended["truncated"] += 1
                else:
                    self.ended["success" if metrics["success"] else "failure"] += 1
                obs, info = env.reset(seed=None if next_seeds is None else next_seeds[i])
            self.obs[i] = obs
            self.expert[i] = info["expert_action"]
        out["final_image"], out["final_goal"] = final_image, final_goal
        return out


def assert_first_equal(step: Any, ref: Reference) -> None:
    """The observations and expert actions (what a reset returns, and every step)."""
    np.testing.assert_array_equal(step["obs", "image"].numpy(), [o["image"] for o in ref.obs])
    np.testing.assert_array_equal(step["obs", "goal"].numpy(), [o["goal"] for o in ref.obs])
    assert step["obs", "image"].dtype == torch.uint8
    assert step["obs", "goal"].dtype == torch.float32
    np.testing.assert_array_equal(step["expert_actions"].numpy(), ref.expert)


def assert_step_equal(step: Any, want: dict[str, Any], ref: Reference, t: int) -> None:
    """Every field of a step."""
    assert_first_equal(step, ref)
    np.testing.assert_array_equal(step["rewards"].numpy(), want["rewards"], err_msg=f"step {t}")
    assert step["rewards"].dtype == torch.float32
    np.testing.assert_array_equal(step["terminated"].numpy(), want["terminated"])
    np.testing.assert_array_equal(step["truncated"].numpy(), want["truncated"])
    if "final_obs" in step.keys():  # (a step may leave it out where none was truncated)
        np.testing.assert_array_equal(step["final_obs", "image"].numpy(), want["final_image"])
        np.testing.assert_array_equal(step["final_obs", "goal"].numpy(), want["final_goal"])
    else:
        assert not any(want["truncated"]), f"step {t}: truncated, no final_obs"
    for i, metrics in want["metrics"].items():
        got = {k: step["episode", k][i].item() for k in METRICS}
        assert got == {k: float(np.float32(metrics[k])) for k in METRICS}, (t, i)


def policy(rng: np.random.Generator, t: int, expert: np.ndarray, phase: int) -> np.ndarray:
    """Uniform random, then mostly FORWARD (walls: truncations), then mostly the expert."""
    n = len(expert)
    stage = (t // phase) % 3
    if stage == 0:
        return rng.integers(0, 4, n)
    if stage == 1:
        return rng.choice(4, size=n, p=[0.1, 0.1, 0.798, 0.002])
    return np.where(rng.random(n) < 0.9, expert, rng.integers(0, 4, n))


def run(
    config: dict[str, Any],
    num_envs: int,
    steps: int,
    seed: int = 0,
    evaluation: bool = False,
    resume_at: int | None = None,
    records: bool = True,
    views: bool = True,
) -> Reference:
    """Step BatchedPointNav and the reference side by side, comparing every step."""
    rng = np.random.default_rng(seed)
    seeds = [int(s) for s in rng.integers(0, 2**31, num_envs)]
    ref = Reference(config, seeds)
    phase = ref.envs[0].max_steps + 10  # long enough to truncate an episode
    env = BatchedPointNav(**config, num_envs=num_envs, device="cpu")
    env._recorded &= records  # (False: each reset's draws as when that table is too large)
    if not views:  # views read from the grids, as where the table of views is too large
        env._view_keys = None
    assert_first_equal(env.reset(seeds), ref)
    for t in range(steps):
        if t == resume_at:  # a fresh environment restored from the saved episodes goes on
            buffer = io.BytesIO()
            torch.save(env.state_dict(), buffer)
            buffer.seek(0)
            env = BatchedPointNav(**config, num_envs=num_envs, device="cpu")
            assert_first_equal(env.load_state_dict(torch.load(buffer, weights_only=True)), ref)
        actions = policy(rng, t, ref.expert, phase)
        next_seeds = None
        if evaluation:  # a seed per environment, None for some (its own stream)
            next_seeds = [int(s) if s % 4 else None for s in rng.integers(0, 2**31, num_envs)]
        step = env.step(torch.from_numpy(actions), next_seeds)
        assert_step_equal(step, ref.step(actions, next_seeds), ref, t)
    return ref


NAV_SMALL = {"size": 9, "rooms_per_side": 2, "max_steps": 50, "split": "train"}


@pytest.mark.parametrize(
    ("config", "num_envs", "steps"),
    [
        pytest.param({}, 16, 240, id="nav-19x19"),
        pytest.param(NAV_SMALL, 16, 240, id="nav_small"),
        pytest.param({"split": "test", "max_steps": 40}, 8, 180, id="split-test"),
        pytest.param({"min_start_distance": 14, "max_steps": 60}, 8, 180, id="min-start-14"),
    ],
)
def test_steps_equal_pointnav(config: dict[str, Any], num_envs: int, steps: int) -> None:
    ref = run(config, num_envs, steps)
    assert all(ref.ended.values()), f"episodes did not end every way: {ref.ended}"


@pytest.mark.parametrize(
    "config",
    [
        # one packed draw above 2**32 (64-bit draws; a 32-bit half waiting across them), and
        # goals redrawn when no cell is far enough
        pytest.param({"size": 13, "rooms_per_side": 3, "min_start_distance": 13}, id="3x3-64bit"),
        # two packed draws per episode, doors split between them
        pytest.param({"size": 40, "rooms_per_side": 4, "split": "valid"}, id="4x4-two-draws"),
        # one room: the split is of (goal, direction, start)
        pytest.param({"size": 7, "rooms_per_side": 1, "split": "valid"}, id="one-room"),
        # views of 5 (a row per word) and 9 (two words per row, no row table for the image)
        pytest.param({"size": 11, "agent_view_size": 5, "max_steps": 20}, id="view-5"),
        pytest.param({"size": 11, "agent_view_size": 9, "max_steps": 20}, id="view-9"),
    ],
)
def test_other_layouts_and_views(config: dict[str, Any]) -> None:
    run(config, 4 if config["size"] > 20 else 6, 40 if config["size"] > 20 else 90, seed=1)


@pytest.mark.parametrize(
    "config", [{"max_steps": 40}, {"split": "test", "max_steps": 40}], ids=["nav", "split-test"]
)
def test_resets_without_tabled_episodes(config: dict[str, Any]) -> None:
    """Resets that draw and build each episode (more environments than _record tables)."""
    run(config, 8, 120, seed=4, records=False)


@pytest.mark.parametrize(
    "config", [{"max_steps": 40}, {**NAV_SMALL, "agent_view_size": 5}], ids=["nav", "9x9-view-5"]
)
def test_views_read_from_grids(config: dict[str, Any]) -> None:
    """Views read from the layouts' bit grids (where the table of views would be too large)."""
    run(config, 8, 120, seed=5, views=False)


@pytest.mark.parametrize("config", [{}, NAV_SMALL], ids=["nav", "nav_small"])
def test_evaluation_next_seeds(config: dict[str, Any]) -> None:
    run(config, 12, 120, seed=2, evaluation=True)


@pytest.mark.parametrize(
    "config", [{}, {"size": 9, "split": "test"}], ids=["nav", "9x9-split-test"]
)
def test_an_episode_every_step(config: dict[str, Any]) -> None:
    """STOP on every step: each environment draws an episode a step, through many stream rows
    (their tabled draws and episodes read past, refilled, tabled again)."""
    seeds = [11, 12, 13]
    ref = Reference(config, seeds)
    env = BatchedPointNav(**config, num_envs=len(seeds), device="cpu")
    assert_first_equal(env.reset(seeds), ref)
    stop = np.full(len(seeds), int(Actions.STOP))
    for t in range(300):
        assert_step_equal(env.step(torch.from_numpy(stop)), ref.step(stop, None), ref, t)


@pytest.mark.parametrize(
    "config",
    [{"max_steps": 30}, {"size": 13, "rooms_per_side": 3, "min_start_distance": 13}],
    ids=["nav", "3x3-64bit"],
)
def test_state_dict_resumes_bitwise(config: dict[str, Any]) -> None:
    """A fresh environment loading the saved state gives the very next steps (the reference
    never stops: its steps after the resume are those the saved environment would give)."""
    run(config, 8, 150, seed=3, resume_at=70)


def test_16_bit_products_give_the_same_draws() -> None:
    """Where int64 products would not wrap, the 32-bit draws take 16-bit pieces: same draws."""
    seeds = list(range(8))
    wrapping = BatchedPointNav(num_envs=8, split="train", device="cpu")
    pieces = BatchedPointNav(num_envs=8, split="train", device="cpu")
    pieces._streams.wraps = False
    first = wrapping.reset(seeds)
    assert torch.equal(first["obs", "image"], pieces.reset(seeds)["obs", "image"])
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 4, (30, 8)))
    for a in actions:
        assert torch.equal(wrapping.step(a)["obs", "image"], pieces.step(a)["obs", "image"])


def test_streams_draw_as_numpy_with_a_half_waiting_across_many_64_bit_draws() -> None:
    """A 32-bit draw leaves a half waiting; 64-bit draws go on past a whole row (a refill
    drops the outputs they took, keeps the waiting one), then 32-bit draws take it."""
    seeds = [3, 4, 5]
    streams = _Streams(3, torch.device("cpu"), 16)
    streams.seed([0, 1, 2], seeds)
    refs = [seeding.np_random(s)[0] for s in seeds]
    plan = [(7, 1), (3 << 40, 140), (1000, 3), (5 << 33, 20), (9, 150)]
    for bound, times in plan:
        draw = streams.draw32 if bound <= 1 << 32 else streams.draw64
        for _ in range(times):
            want = [int(r.integers(bound)) for r in refs]
            assert draw(torch.arange(3), bound).tolist() == want, bound


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "config",
    [{}, {"size": 13, "rooms_per_side": 3, "min_start_distance": 13}, {"agent_view_size": 9}],
    ids=["nav", "3x3-64bit", "view-9"],
)
def test_on_cuda_every_step_equals_the_cpu_s(config: dict[str, Any]) -> None:
    seeds = list(range(8))
    cpu = BatchedPointNav(**config, num_envs=8, device="cpu")
    cuda = BatchedPointNav(**config, num_envs=8, device="cuda")

    def same(want: Any, got: Any) -> None:
        keys = sorted(want.keys(include_nested=True, leaves_only=True), key=str)
        assert keys == sorted(got.keys(include_nested=True, leaves_only=True), key=str)
        for key in keys:
            assert got[key].is_cuda and torch.equal(want[key], got[key].cpu()), key

    same(cpu.reset(seeds), cuda.reset(seeds))
    for a in torch.from_numpy(np.random.default_rng(0).integers(0, 4, (300, 8))):
        same(cpu.step(a), cuda.step(a.cuda()))
    with pytest.raises(ValueError, match="unknown action 4"):
        cuda.step(torch.full((8,), 4, device="cuda"))


@pytest.mark.parametrize("n", [3, 5, 7, 9])
def test_row_by_row_occlusion_is_process_vis(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(300):
        see = rng.random((n, n)) < rng.random()
        want = np.asarray(process_vis(see.tolist(), n))
        incoming, got = 1 << (n // 2), np.zeros((n, n), dtype=bool)
        for j in range(n - 1, -1, -1):
            bits = sum(int(see[i, j]) << i for i in range(n))
            mask, incoming = process_vis_row(incoming, bits, n)
            got[:, j] = [(mask >> i) & 1 for i in range(n)]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("size", "rooms"), [(19, 2), (13, 3)])
def test_split_of_doors_is_the_layouts(size: int, rooms: int) -> None:
    layout = RoomLayout(size, rooms)
    lengths = [slot[4] for slot in layout.door_slots]
    rng = np.random.default_rng(0)
    door_v = np.stack([rng.integers(0, length, 500) for length in lengths], 1)
    for split in ("train", "valid", "test"):
        buckets = torch.tensor([b == split for b in _BUCKETS])
        got = _doors_in_split(torch.from_numpy(door_v), lengths, buckets).tolist()
        want = [layout.split_of(v.tolist(), ()) == split for v in door_v]
        assert got == want


def test_the_serial_task_names_its_batched_twin() -> None:
    module, name = PointNavEnv.batched_env.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is BatchedPointNav


def test_render_draws_the_environment_in_its_episode() -> None:
    env = BatchedPointNav(size=9, num_envs=2, render_mode="rgb_array", device="cpu")
    ref = PointNavEnv(size=9, render_mode="rgb_array")
    env.reset([5, 6])
    ref.reset(seed=6)
    for a in (2, 0, 2):
        env.step(torch.tensor([1, a]))
        ref.step(a)
    np.testing.assert_array_equal(env.render(1), ref.render())
    assert BatchedPointNav(num_envs=1, device="cpu").render() is None
    env.close()


def test_bad_calls_are_refused() -> None:
    env = BatchedPointNav(size=9, num_envs=3, device="cpu")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="3 seeds"):
        env.reset([1, 2])
    env.reset([1, 2, 3])
    with pytest.raises(ValueError, match="unknown action 4"):
        env.step(torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="configured"):
        BatchedPointNav(size=9, num_envs=3, max_steps=7, device="cpu").load_state_dict(
            env.state_dict()
        )
    with pytest.raises(ValueError, match="environments"):
        BatchedPointNav(size=9, num_envs=4, device="cpu").load_state_dict(env.state_dict())
    with pytest.raises(ValueError, match="num_envs"):
        BatchedPointNav(num_envs=0, device="cpu")
    with pytest.raises(ValueError, match="split"):
        BatchedPointNav(num_envs=1, split="nope", device="cpu")
