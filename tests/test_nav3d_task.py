"""Tests for 3D PointNav on MiniWorld (rl_envs.pointnav3d: the env, its layout, grid and scene)."""

from __future__ import annotations

import heapq
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from gymnasium.utils.env_checker import check_env
from small import assert_same_step

from rl.collection.episodes import evaluate_expert
from rl.models import build_policy
from rl.tasks import task_spaces
from rl.tasks.factory import FRAMEWORK_KEYS
from rl.tasks.splits import SPLITS, split_of
from rl_envs.pointnav3d import PointNav3DEnv, RenderingUnavailableError
from rl_envs.pointnav3d.grid import NavGrid, point_clearance
from rl_envs.pointnav3d.layout import Door, Floorplan, FloorplanSpec, draw_floorplan

ROOT = Path(__file__).resolve().parents[1]
TASKS = {
    name: yaml.safe_load((ROOT / "conf" / "task" / f"{name}.yaml").read_text())
    for name in ("nav3d", "nav3d_small")
}
# nav3d_small's file extends nav3d's through its defaults list.
SMALL = {**TASKS["nav3d"], **{k: v for k, v in TASKS["nav3d_small"].items() if k != "defaults"}}
FULL = TASKS["nav3d"]
TEX = ("concrete", "floor_tiles_bw", "white")


def make_env(task: dict[str, Any] = SMALL, **overrides: Any) -> PointNav3DEnv:
    """The task's environment, built from its config file's arguments (the task's own keys)."""
    own = {k: v for k, v in task.items() if k != "_target_" and k not in FRAMEWORK_KEYS}
    return PointNav3DEnv(**{**own, **overrides})


@pytest.fixture(scope="module")
def small_env() -> Any:
    env = make_env()
    yield env
    env.close()


# ------------------------------------------------------------------------------ the expert
@pytest.mark.parametrize("task", [pytest.param(SMALL, id="small"), pytest.param(FULL, id="full")])
def test_expert_succeeds_on_100_episodes(task: dict[str, Any]) -> None:
    result = evaluate_expert(task=task, episode_seeds=range(1000, 1100), num_envs=4)
    assert len(result.episodes) == 100
    assert result.metrics["success"] == 1.0
    assert result.metrics["spl"] >= 0.95
    assert all(e["final_distance"] <= 0.2 + 0.1 for e in result.episodes)


# ------------------------------------------------------------------------ distance fields
def _reference_field(grid: NavGrid, goal: tuple[int, int]) -> np.ndarray:
    """A plain heapq Dijkstra over the same 16-neighbourhood (moves checked cell by cell)."""
    nx, nz = grid.shape
    free = grid.free
    moves = []
    for dx, dz in [(1, 0), (0, 1), (1, 1), (1, -1), (2, 1), (1, 2), (2, -1), (1, -2)]:
        for sx, sz in ((dx, dz), (-dx, -dz)):
            # The cells a move crosses: every cell square its segment passes through or touches
            # (a diagonal touches the two cells at its corner), besides the ends.
            crossed = set()
            for t in np.linspace(0.0, 1.0, 41):
                for ex in (-1e-9, 1e-9):
                    for ez in (-1e-9, 1e-9):
                        cell = (math.floor(0.5 + t * sx + ex), math.floor(0.5 + t * sz + ez))
                        if cell not in ((0, 0), (sx, sz)):
                            crossed.add(cell)
            moves.append((sx, sz, grid.resolution * math.hypot(sx, sz), crossed))
    dist = np.full((nx, nz), np.inf)
    dist[goal] = 0.0
    queue = [(0.0, goal)]
    while queue:
        d, (i, k) = heapq.heappop(queue)
        if d > dist[i, k]:
            continue
        for sx, sz, w, crossed in moves:
            j, m = i + sx, k + sz
            if not (0 <= j < nx and 0 <= m < nz) or not free[j, m]:
                continue
            if any(not free[i + cx, k + cz] for cx, cz in crossed):
                continue
            if d + w < dist[j, m]:
                dist[j, m] = d + w
                heapq.heappush(queue, (d + w, (j, m)))
    return dist


HAND_LAYOUTS = {
    "one room": Floorplan((4.0,), (3.0,), (), (TEX,)),
    "two rooms, one door": Floorplan((3.0, 3.0), (3.0,), (Door(0, 1, 1.0, 2.0),), (TEX, TEX)),
    "2x2 rooms, three doors": Floorplan(
        (3.0, 3.5),
        (3.0, 3.0),
        (Door(0, 1, 0.25, 1.25), Door(1, 3, 4.5, 5.5), Door(2, 3, 4.0, 5.0)),
        (TEX,) * 4,
    ),
}


@pytest.mark.parametrize("name", list(HAND_LAYOUTS))
def test_distance_field_matches_reference_search(name: str) -> None:
    grid = NavGrid(HAND_LAYOUTS[name], resolution=0.1, radius=0.25)
    free = np.argwhere(grid.free)
    for g in free[np.random.default_rng(0).choice(len(free), 3, replace=False)]:
        goal = (int(g[0]), int(g[1]))
        field = grid.distance_field(goal)
        np.testing.assert_allclose(field, _reference_field(grid, goal), rtol=1e-12, atol=1e-12)
        assert np.isfinite(field[grid.free]).all()  # every free cell is reachable
        assert np.isinf(field[~grid.free]).all()


def test_distance_field_hand_checked_values() -> None:
    # One 4 x 3 m room: the field is the straight-line distance, over by at most 2.75%.
    grid = NavGrid(HAND_LAYOUTS["one room"], resolution=0.1, radius=0.25)
    goal = (5, 5)
    field = grid.distance_field(goal)
    centres = grid.cell_centre(*np.nonzero(grid.free))
    euclid = np.hypot(*(centres - grid.cell_centre(*goal)).T)
    ratio = field[grid.free][euclid > 0] / euclid[euclid > 0]
    assert ratio.min() >= 1.0 - 1e-12
    assert ratio.max() <= 1.0 / math.cos(math.radians(13.3)) + 1e-9
    # Two 3 x 3 m rooms, a door at z 1.0-2.0 in the wall x = 3: through the door on one row,
    # the path is straight (exact); around the wall it is at least the path via the gap.
    grid = NavGrid(HAND_LAYOUTS["two rooms, one door"], resolution=0.1, radius=0.25)
    field = grid.distance_field((10, 14))  # (1.05, 1.45): level with the door
    assert field[50, 14] == pytest.approx(4.0, abs=1e-9)  # (5.05, 1.45), straight through
    assert math.isinf(field[30, 5])  # on the wall itself: not free
    # (5.05, 0.35) is hidden behind the wall: going round the jamb (3, 1.0) costs more than
    # the straight line, and no more than via the gap's corner point (3, 1.25) + 2.75%.
    via_corner = math.hypot(3.0 - 1.05, 1.25 - 1.45) + math.hypot(5.05 - 3.0, 0.35 - 1.25)
    assert math.hypot(4.0, 1.1) < field[50, 3] <= via_corner * 1.0275


def test_free_space_is_miniworlds_collision_rule(small_env: PointNav3DEnv) -> None:
    rng = np.random.default_rng(0)
    for seed in range(3):
        small_env.reset(seed=seed)
        world, grid = small_env.world, small_env.grid
        width, depth = small_env.plan.extent
        points = rng.uniform([0.0, 0.0], [width, depth], size=(300, 2))
        ours = point_clearance(points, grid.segments) >= grid.radius
        theirs = [
            not world.intersect(world.agent, np.array([x, 0.0, z]), world.agent.radius)
            for x, z in points
        ]
        assert ours.tolist() == theirs
        # And the grid's free cells are exactly the clear cell centres.
        centres = grid.cell_centre(*np.indices(grid.shape)).reshape(-1, 2)
        clear = point_clearance(centres, grid.segments) >= grid.radius
        assert (clear.reshape(grid.shape) == grid.free).all()


# ----------------------------------------------------------------------- determinism, splits
def _episode(env: PointNav3DEnv, seed: int) -> list[Any]:
    obs, info = env.reset(seed=seed)
    trace = [obs["rgb"].copy(), obs["goal"].copy()]
    for _ in range(60):
        obs, reward, terminated, truncated, info = env.step(info["expert_action"])
        trace += [obs["rgb"].copy(), obs["goal"].copy(), reward]
        if terminated or truncated:
            break
    return trace


def test_same_seed_same_frames_and_episode(small_env: PointNav3DEnv) -> None:
    other = make_env()
    try:
        first = _episode(small_env, 7)
        _episode(other, 8)  # a different scene built in between, in the same process
        again = _episode(other, 7)
    finally:
        other.close()
    assert len(first) == len(again)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(_episode(small_env, 9)[0], first[0])


def test_scenes_in_one_process_do_not_share_geometry() -> None:
    # MiniWorld compiles every env's scene into GL display list 1, shared by the contexts of a
    # process; ours keep their own, so building B leaves A's camera image unchanged.
    a, b = make_env(), make_env()
    try:
        a.reset(seed=0)
        before = a.world.render_obs()
        b.reset(seed=1)
        after = a.world.render_obs()
    finally:
        a.close()
        b.close()
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("task", [pytest.param(SMALL, id="small"), pytest.param(FULL, id="full")])
def test_splits_hold_disjoint_floorplans(task: dict[str, Any]) -> None:
    spec = FloorplanSpec(
        rows=task["rooms"][0],
        cols=task["rooms"][1],
        room_size=tuple(task["room_size"]),
        door_width=task["door_width"],
        extra_door_prob=task["extra_door_prob"],
    )
    keys: dict[str, set[int]] = {}
    for split in SPLITS:
        env = make_env(task, split=split)
        try:
            keys[split] = set()
            for seed in range(40):
                env.reset(seed=seed)
                keys[split].add(env.plan.key())
                assert split_of(env.plan.key()) == split
        finally:
            env.close()
    assert not keys["train"] & keys["valid"]
    assert not keys["train"] & keys["test"]
    assert not keys["valid"] & keys["test"]
    # The key is the geometry: equal keys <=> equal rooms and doors (textures aside).
    rng = np.random.default_rng(0)
    plans = [draw_floorplan(spec, rng) for _ in range(300)]
    by_key: dict[int, tuple[Any, ...]] = {}
    for p in plans:
        geometry = (p.col_widths, p.row_depths, p.doors)
        assert by_key.setdefault(p.key(), geometry) == geometry


# ------------------------------------------------------------------------- gymnasium, errors
# ------------------------------------------------------------------------- floorplan reuse
def test_floorplans_are_kept_for_episodes_per_floorplan_unseeded_episodes() -> None:
    env = make_env(episodes_per_floorplan=3)
    try:
        env.reset(seed=5)
        keys, goals = [Floorplan.key(env.plan)], [env.goal.copy()]
        for _ in range(6):
            env.reset()
            keys.append(Floorplan.key(env.plan))
            goals.append(env.goal.copy())
        assert keys[0] == keys[1] == keys[2] != keys[3]  # three episodes on each floorplan
        assert keys[3] == keys[4] == keys[5] != keys[6]
        assert len({tuple(g) for g in goals}) > 1  # new goals on the same floorplan
        env.reset()
        env.reset(seed=5)  # a seeded reset draws a floorplan at once: the same as the first
        assert Floorplan.key(env.plan) == keys[0]
        np.testing.assert_array_equal(env.goal, goals[0])
    finally:
        env.close()


def test_a_reused_scene_renders_what_a_fresh_build_renders() -> None:
    # The first frame of an episode on a kept floorplan (the agent moved, nothing rebuilt)
    # equals the frame of the same plan and pose built from scratch in another env.
    kept, fresh = make_env(episodes_per_floorplan=2), make_env()
    try:
        kept.reset(seed=3)
        for _ in range(4):
            kept.step(2)
        obs, _ = kept.reset()  # second episode, same floorplan
        assert kept.plan is not None
        start, heading = kept.world.position(), kept.world.heading()
        rebuilt = fresh.world.build(kept.plan, start, heading)
        np.testing.assert_array_equal(obs["rgb"], rebuilt)
    finally:
        kept.close()
        fresh.close()


def test_a_sampler_resumes_episodes_on_kept_floorplans_exactly() -> None:
    from rl.sampling import SerialSampler

    task = {**SMALL, "episodes_per_floorplan": 3, "max_steps": 12}
    actions = np.random.default_rng(0).integers(0, 4, size=(400, 2))
    a = SerialSampler(task=task, num_envs=2, seed=4)
    b = SerialSampler(task=task, num_envs=2, seed=4)

    def on_a_kept_floorplan(episode: dict[str, Any]) -> bool:  # its reset reused the floorplan
        return episode["seed"] is None and 0 < episode["env_state"]["plan_episodes"] < 3

    try:
        a.reset()
        t = 0
        while not all(map(on_a_kept_floorplan, a.state_dict()["episodes"])):
            a.step(actions[t])
            t += 1
        a.step(actions[t])  # an action into the episode, replayed on restore
        state = a.state_dict()
        b.load_state_dict(state)
        for u in range(t + 1, t + 60):
            assert_same_step(a.step(actions[u]), b.step(actions[u]))
    finally:
        a.close()
        b.close()


def test_gymnasium_env_checker() -> None:
    env = make_env(render_mode="rgb_array")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*infinity.*")
            warnings.filterwarnings("ignore", message=".*alternative render modes.*")
            check_env(env, skip_render_check=False)
    finally:
        env.close()


def test_registered_ids_build() -> None:
    import gymnasium

    env = gymnasium.make("rl/PointNav3DSmall-v0")
    try:
        obs, info = env.reset(seed=0)
        assert obs["rgb"].shape == (60, 80, 3)
        assert info["expert_action"] in range(4)
    finally:
        env.close()


def test_render_shows_camera_and_map() -> None:
    env = make_env(render_mode="rgb_array")
    try:
        _, info = env.reset(seed=3)
        while len(env.path) < 4:  # three forward steps: a path to draw
            _, *_, info = env.step(info["expert_action"])
        frame = env.render()
    finally:
        env.close()
    assert frame.dtype == np.uint8 and frame.shape[0] == 240 and frame.shape[1] > 320 + 100
    map_part = frame[:, 328:]
    assert (map_part == [40, 170, 60]).all(-1).any()  # the goal
    assert (map_part == [220, 40, 40]).all(-1).any()  # the path walked


def test_depth_observation() -> None:
    env = make_env(depth=True)
    try:
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    assert obs["depth"].shape == (60, 80, 1) and obs["depth"].dtype == np.float32
    assert 0.0 < obs["depth"].min() and obs["depth"].max() <= 10.0
    assert env.observation_space["depth"].contains(obs["depth"])
    env = make_env(depth=True, normalize_depth=True, max_depth=4.0)
    try:
        normalized, _ = env.reset(seed=0)
    finally:
        env.close()
    assert np.allclose(normalized["depth"], np.minimum(obs["depth"], 4.0) / 4.0)
    assert normalized["depth"].max() == 1.0  # the far wall of two 3-4 m rooms is beyond 4 m
    assert env.observation_space["depth"].contains(normalized["depth"])


def test_gps_compass_points_at_the_goal(small_env: PointNav3DEnv) -> None:
    obs, _ = small_env.reset(seed=5)
    distance, cos_b, sin_b = obs["goal"]
    position, heading = small_env.world.position(), small_env.world.heading()
    assert distance == pytest.approx(float(np.hypot(*(small_env.goal - position))), rel=1e-6)
    # Walking `distance` along heading + bearing from the agent lands on the goal.
    angle = heading + math.atan2(sin_b, cos_b)
    landing = position + distance * np.array([math.cos(angle), -math.sin(angle)])
    np.testing.assert_allclose(landing, small_env.goal, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"agent_radius": 0.6}, "door_width"),
        ({"room_size": [1.0, 2.0]}, "room_size min"),
        ({"forward_step": 0.0}, "forward_step"),
        ({"split": "validation"}, "split"),
        ({"rooms": [0, 2]}, "rooms"),
        ({"episodes_per_floorplan": 0}, "episodes_per_floorplan"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PointNav3DEnv(**kwargs)


def test_no_egl_gives_a_clear_error() -> None:
    # libglvnd finds no EGL vendor library here: what a machine without Mesa's EGL looks like.
    code = (
        "from rl_envs.pointnav3d import PointNav3DEnv\n"
        "PointNav3DEnv(rooms=[1, 2], room_size=[3.0, 4.0])\n"
    )
    env = {**os.environ, "__EGL_VENDOR_LIBRARY_DIRS": "/nonexistent"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr[-2000:]  # an exception, not a signal (segfault)
    assert RenderingUnavailableError.__name__ in proc.stderr
    assert "apt-get install libegl1 libegl-mesa0" in proc.stderr


def test_llvmpipe_renders_in_the_calling_thread_unless_the_user_says_otherwise() -> None:
    # Mesa's llvmpipe starts LP_NUM_THREADS rasteriser threads with the first GL context (one
    # per core by default); the task sets 0 (none) unless the environment gives a value.
    code = (
        "import os\nfrom rl_envs.pointnav3d import PointNav3DEnv\n"
        "env = PointNav3DEnv(rooms=[1, 2], room_size=[3.0, 4.0])\nenv.reset(seed=0)\n"
        "env.step(2)\n"
        "threads = open('/proc/self/status').read().split('Threads:')[1].split()[0]\n"
        "print(os.environ['LP_NUM_THREADS'], threads)\n"
    )
    seen = {}
    for setting in (None, "3"):
        env = {k: v for k, v in os.environ.items() if k != "LP_NUM_THREADS"}
        if setting is not None:
            env["LP_NUM_THREADS"] = setting
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        value, threads = proc.stdout.split()
        seen[setting] = (value, int(threads))
    assert seen[None][0] == "0"
    assert seen["3"][0] == "3"  # the user's value is kept, and llvmpipe starts its threads
    assert seen["3"][1] >= seen[None][1] + 3, seen


# --------------------------------------------------------------------------------- the model
def test_pixel_model_builds_for_the_task() -> None:
    cfg = yaml.safe_load((ROOT / "conf" / "model" / "nav3d_cnn_gru.yaml").read_text())
    model = build_policy(cfg, *task_spaces(SMALL))
    assert model.encoders["rgb"].out_size == 32 * 4 * 6
    obs = {"rgb": torch.zeros(1, 2, 60, 80, 3, dtype=torch.uint8), "goal": torch.zeros(1, 2, 3)}
    out, state = model(obs, torch.ones(1, 2, dtype=torch.bool), model.initial_state(2, "cpu"))
    assert out.dist.logits.shape == (1, 2, 4) and state["h"].shape == (2, 1, 256)
    with pytest.raises(ValueError, match="one value per cnn_channels"):
        build_policy({**cfg, "cnn_kernels": [8, 4]}, *task_spaces(SMALL))
    with pytest.raises(ValueError, match="does not fit"):
        build_policy({**cfg, "cnn_strides": [8, 8, 1]}, *task_spaces(SMALL))


# ---------------------------------------------------------------------------- training smoke
@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["dagger_ppo_nav3d"])  # ppo_nav3d: its +debug=smoke run
def test_training_smoke_run(compose_cfg, experiment: str) -> None:
    """A shipped experiment trains on the small task (its collection worker process too) and
    evaluates with nav3d's metrics; every experiment's +debug=smoke run is in
    tests/test_experiment_smoke.py."""
    import rl.engine.run

    cfg = compose_cfg(
        [
            f"+experiment={experiment}",
            "task=nav3d_small",
            "total_env_steps=1024",
            "sampler.num_envs=4",
            "pipeline.num_steps=64",
            "pipeline.num_mini_batch=2",
            "pipeline.save_interval=0",
            "eval.num_episodes=4",
            "eval.num_envs=2",
            "logger.sinks.console.progress_bar=false",
            *(
                ["pipeline.stages.0.max_stage_steps=512", "pipeline.stages.1.max_stage_steps=512"]
                if experiment.startswith("dagger")
                else []
            ),
        ]
    )
    metrics = rl.engine.run.train(cfg)
    assert 0.0 <= metrics["eval/success"] <= 1.0
    assert {"eval/spl", "eval/final_distance", "eval/path_length"} <= set(metrics)
    run = Path(cfg.output_dir)
    assert list((run / "checkpoints").glob("*.pt"))
