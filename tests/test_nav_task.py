"""Tests for the PointNav minigrid task (rl_envs.pointnav.env)."""

from __future__ import annotations

import math
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from minigrid.minigrid_env import MiniGridEnv

from rl.tasks import make_gym_env
from rl_envs.pointnav import Actions, PointNavEnv

LAYOUTS = [
    pytest.param({"size": 19, "rooms_per_side": 2}, id="19x19"),
    pytest.param({"size": 9, "rooms_per_side": 2}, id="9x9"),
]


def _free_cells(env: PointNavEnv) -> np.ndarray:
    return np.argwhere(env.distance_field >= 0)


def _place(env: PointNavEnv, pos: tuple[int, int], direction: int) -> None:
    env.agent_pos = (int(pos[0]), int(pos[1]))
    env.agent_dir = int(direction)


def _run_expert(env: PointNavEnv, seed: int) -> tuple[dict[str, float], float, int]:
    _, info = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(info["expert_action"])
        total += reward
        steps += 1
        assert not (terminated and truncated)
        if terminated or truncated:
            return info["episode_metrics"], total, steps


@pytest.mark.parametrize("layout", LAYOUTS)
def test_check_env(layout: dict[str, int]) -> None:
    with warnings.catch_warnings():
        # The goal vector is unbounded by design; the checker cannot test other render modes.
        warnings.filterwarnings("ignore", message=".*infinity.*")
        warnings.filterwarnings("ignore", message=".*alternative render modes.*")
        check_env(PointNavEnv(**layout))
        check_env(PointNavEnv(**layout, render_mode="rgb_array"))


@pytest.mark.parametrize(
    ("layout", "max_steps"),
    [
        pytest.param({"size": 19, "rooms_per_side": 2}, 100, id="19x19"),
        pytest.param({"size": 9, "rooms_per_side": 2}, 50, id="9x9"),
        pytest.param({"size": 13, "rooms_per_side": 3}, 100, id="13x13-3x3"),
        pytest.param({"size": 7, "rooms_per_side": 1}, 50, id="7x7-1room"),
    ],
)
def test_expert_succeeds_with_spl_one(layout: dict[str, int], max_steps: int) -> None:
    env = PointNavEnv(**layout, max_steps=max_steps)
    for seed in range(100):
        metrics, total, steps = _run_expert(env, seed)
        length = metrics["shortest_path_length"]
        assert metrics["success"] == 1.0
        assert metrics["spl"] == 1.0
        assert metrics["final_distance"] == 0.0
        assert length >= 1
        # Every FORWARD gains exactly one cell; turns gain nothing.
        assert total == pytest.approx(length - 0.01 * steps + 2.5)


def test_expert_action_not_in_observation() -> None:
    env = PointNavEnv()
    obs, info = env.reset(seed=0)
    assert set(obs) == {"image", "goal"}
    assert "expert_action" in info


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seeded_reset_reproducible(layout: dict[str, int]) -> None:
    actions = np.random.default_rng(123).integers(0, 3, size=60).tolist()

    def rollout(seed: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
        env = PointNavEnv(**layout, max_steps=1000)
        obs, _ = env.reset(seed=seed)
        out = [(obs["image"], obs["goal"], 0.0)]
        for a in actions:
            obs, reward, *_ = env.step(a)
            out.append((obs["image"], obs["goal"], reward))
        return out

    a, b, c = rollout(7), rollout(7), rollout(8)
    for (ia, ga, ra), (ib, gb, rb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ga, gb)
        assert ra == rb
    assert any(
        not np.array_equal(ia, ic) or not np.array_equal(ga, gc)
        for (ia, ga, _), (ic, gc, _) in zip(a, c, strict=True)
    )


def test_reset_without_seed_continues_rng() -> None:
    env = PointNavEnv()
    env.reset(seed=3)
    first = (env.goal_pos, env.agent_pos, env.grid.encode().tobytes())
    env.reset()
    second = (env.goal_pos, env.agent_pos, env.grid.encode().tobytes())
    assert first != second


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_image_matches_minigrid_gen_obs(layout: dict[str, int]) -> None:
    env = PointNavEnv(**layout)
    rng = np.random.default_rng(0)
    for seed in range(8):
        env.reset(seed=seed)
        free = _free_cells(env)
        for _ in range(120):
            _place(env, free[rng.integers(len(free))], int(rng.integers(4)))
            expected = MiniGridEnv.gen_obs(env)["image"]
            got = env._image()
            assert got.dtype == expected.dtype == np.uint8
            np.testing.assert_array_equal(got, expected)
        # Every cell and direction once (exercises cache hits and misses).
        for x, y in free:
            for d in range(4):
                _place(env, (x, y), d)
                np.testing.assert_array_equal(env._image(), MiniGridEnv.gen_obs(env)["image"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_step_observations_match_minigrid(layout: dict[str, int]) -> None:
    env = PointNavEnv(**layout, max_steps=10_000)
    obs, _ = env.reset(seed=5)
    np.testing.assert_array_equal(obs["image"], MiniGridEnv.gen_obs(env)["image"])
    for a in np.random.default_rng(1).integers(0, 3, size=300).tolist():
        obs, *_ = env.step(a)
        np.testing.assert_array_equal(obs["image"], MiniGridEnv.gen_obs(env)["image"])
        assert env.observation_space.contains(obs)


def test_returned_image_is_not_the_cache() -> None:
    env = PointNavEnv()
    obs, _ = env.reset(seed=0)
    obs["image"][...] = 0
    np.testing.assert_array_equal(env._image(), MiniGridEnv.gen_obs(env)["image"])


def test_one_bfs_per_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    env = PointNavEnv()
    calls = []
    original = env._bfs

    def counting_bfs(gx: int, gy: int) -> np.ndarray:
        calls.append((gx, gy))
        return original(gx, gy)

    monkeypatch.setattr(env, "_bfs", counting_bfs)
    _, info = env.reset(seed=0)
    for _ in range(50):
        _, _, terminated, truncated, info = env.step(info["expert_action"])
        if terminated or truncated:
            break
    assert len(calls) == 1


@pytest.mark.parametrize(("size", "rooms"), [(19, 2), (9, 2), (13, 3), (10, 3), (5, 1), (19, 1)])
def test_layout_rooms_doors_and_distances(size: int, rooms: int) -> None:
    env = PointNavEnv(size=size, rooms_per_side=rooms, min_start_distance=3)
    for seed in range(10):
        env.reset(seed=seed)
        free = env._free
        dist = env.distance_field
        assert dist.shape == (size, size)
        # Every free cell is reachable; walls have distance -1.
        assert np.all((dist >= 0) == free)
        assert not free[0, :].any() and not free[-1, :].any()
        assert not free[:, 0].any() and not free[:, -1].any()
        # One door per interior wall segment between two adjacent rooms.
        lines = env._walls_at
        doors = 0
        for p in lines[1:-1]:
            doors += int(free[p, :].sum()) + int(free[:, p].sum())
        assert doors == 2 * rooms * (rooms - 1)
        assert dist[env.goal_pos] == 0
        assert env.grid.get(*env.goal_pos).type == "goal"
        assert dist[env.agent_pos] >= 3
        # Distance field is a proper BFS field: neighbours differ by at most one.
        for x, y in np.argwhere(free):
            for dx, dy in ((1, 0), (0, 1)):
                if free[x + dx, y + dy]:
                    assert abs(dist[x, y] - dist[x + dx, y + dy]) <= 1


def test_reward_moving_closer_and_farther() -> None:
    env = PointNavEnv(step_penalty=0.05, distance_reward_scale=2.0)
    env.reset(seed=0)
    gx, gy = env.goal_pos
    free = env._free
    # Stand on a free neighbour of the goal, facing it.
    for d, (dx, dy) in enumerate(((1, 0), (0, 1), (-1, 0), (0, -1))):
        if free[gx - dx, gy - dy]:
            _place(env, (gx - dx, gy - dy), d)
            break
    _, reward, terminated, truncated, info = env.step(Actions.FORWARD)
    assert reward == pytest.approx(2.0 - 0.05)
    assert env.agent_pos == (gx, gy)
    assert not terminated and not truncated
    assert info["expert_action"] == Actions.STOP
    # Turning gives only the penalty; moving away gives -scale - penalty.
    env.agent_dir = (d + 2) % 4
    _, reward, *_ = env.step(Actions.FORWARD)
    assert reward == pytest.approx(-2.0 - 0.05)


def test_blocked_forward_is_noop() -> None:
    env = PointNavEnv()
    env.reset(seed=0)
    _place(env, (1, 1), 3)  # facing up into the outer wall
    before = env._cells_moved
    _, reward, terminated, truncated, _ = env.step(Actions.FORWARD)
    assert env.agent_pos == (1, 1)
    assert env._cells_moved == before
    assert reward == pytest.approx(-0.01)
    assert not terminated and not truncated


def test_stop_on_goal_gives_bonus_and_success() -> None:
    env = PointNavEnv()
    env.reset(seed=1)
    length = float(env.distance_field[env.agent_pos])
    _place(env, env.goal_pos, 0)
    obs, reward, terminated, truncated, info = env.step(Actions.STOP)
    assert terminated and not truncated
    assert reward == pytest.approx(2.5 - 0.01)
    metrics = info["episode_metrics"]
    assert metrics["success"] == 1.0
    assert metrics["final_distance"] == 0.0
    assert metrics["shortest_path_length"] == length
    # Teleported: 0 cells moved, so P < L and SPL is L / max(P, L) = 1.
    assert metrics["spl"] == 1.0
    assert obs["goal"].tolist() == [0.0, 0.0, 0.0]


def test_stop_elsewhere_terminates_without_success() -> None:
    env = PointNavEnv()
    obs, _ = env.reset(seed=2)
    assert obs["goal"][2] > 0
    d = float(env.distance_field[env.agent_pos])
    _, reward, terminated, truncated, info = env.step(Actions.STOP)
    assert terminated and not truncated
    assert reward == pytest.approx(-0.01)
    assert info["episode_metrics"] == {
        "success": 0.0,
        "spl": 0.0,
        "final_distance": d,
        "shortest_path_length": d,
    }


def test_spl_penalises_detours() -> None:
    env = PointNavEnv(size=9, max_steps=200)
    _, info = env.reset(seed=4)
    length = float(env.distance_field[env.agent_pos])
    # Detour: step off the path and back (if possible), then follow the expert.
    moved = 0
    for a in (Actions.LEFT, Actions.LEFT, Actions.FORWARD, Actions.LEFT, Actions.LEFT):
        pos = env.agent_pos
        _, _, _, _, info = env.step(a)
        moved += int(env.agent_pos != pos)
    while True:
        pos = env.agent_pos
        _, _, terminated, truncated, info = env.step(info["expert_action"])
        moved += int(env.agent_pos != pos)
        if terminated or truncated:
            break
    metrics = info["episode_metrics"]
    assert metrics["success"] == 1.0
    assert metrics["spl"] == pytest.approx(length / max(moved, length))


def test_truncation_at_max_steps() -> None:
    env = PointNavEnv(max_steps=5)
    env.reset(seed=0)
    for t in range(5):
        _, _, terminated, truncated, info = env.step(Actions.LEFT)
        assert not terminated
        assert truncated == (t == 4)
    assert "episode_metrics" in info
    assert info["episode_metrics"]["success"] == 0.0
    assert info["episode_metrics"]["spl"] == 0.0


def test_stop_on_last_step_is_terminated_not_truncated() -> None:
    env = PointNavEnv(max_steps=1)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(Actions.STOP)
    assert terminated and not truncated


def test_goal_vector_egocentric_signs() -> None:
    env = PointNavEnv()
    env.reset(seed=0)
    gx, gy = env.goal_pos
    vecs = ((1, 0), (0, 1), (-1, 0), (0, -1))
    # Goal straight ahead at 1 cell, for every direction where the cell behind is free.
    checked = 0
    for d, (dx, dy) in enumerate(vecs):
        if env._free[gx - dx, gy - dy]:
            _place(env, (gx - dx, gy - dy), d)
            assert env._goal_vector().tolist() == [1.0, 0.0, 1.0]
            # Turn right: the goal is now on the left (right < 0); turn left: on the right.
            env.agent_dir = (d + 1) % 4
            assert env._goal_vector().tolist() == [0.0, -1.0, 1.0]
            env.agent_dir = (d - 1) % 4
            assert env._goal_vector().tolist() == [0.0, 1.0, 1.0]
            env.agent_dir = (d + 2) % 4
            assert env._goal_vector().tolist() == [-1.0, 0.0, 1.0]
            checked += 1
    assert checked > 0
    # General offset: facing right (+x), goal at (+3, +2) world is forward 3, right 2.
    env.goal_pos = (10, 10)
    _place(env, (7, 8), 0)
    np.testing.assert_allclose(env._goal_vector(), [3.0, 2.0, np.hypot(3, 2)], rtol=1e-6)
    _place(env, (7, 8), 3)  # facing up (-y): right is +x
    np.testing.assert_allclose(env._goal_vector(), [-2.0, 3.0, np.hypot(3, 2)], rtol=1e-6)


def test_goal_visible_in_view() -> None:
    env = PointNavEnv()
    env.reset(seed=0)
    gx, gy = env.goal_pos
    for d, (dx, dy) in enumerate(((1, 0), (0, 1), (-1, 0), (0, -1))):
        if env._free[gx - dx, gy - dy]:
            _place(env, (gx - dx, gy - dy), d)
            image = env._image()
            n = env.agent_view_size
            assert image[n // 2, n - 2, 0] == 8  # goal, one cell ahead
            return
    pytest.fail("goal has no free neighbour")


def test_expert_turns_toward_path() -> None:
    env = PointNavEnv()
    env.reset(seed=0)
    gx, gy = env.goal_pos
    vecs = ((1, 0), (0, 1), (-1, 0), (0, -1))
    for d, (dx, dy) in enumerate(vecs):
        if env._free[gx - dx, gy - dy]:
            _place(env, (gx - dx, gy - dy), d)
            assert env.expert_action() == Actions.FORWARD
            env.agent_dir = (d + 1) % 4  # goal on the left
            assert env.expert_action() == Actions.LEFT
            env.agent_dir = (d + 2) % 4  # goal behind
            assert env.expert_action() in (Actions.LEFT, Actions.RIGHT)
            return


def test_render_rgb_array() -> None:
    env = PointNavEnv(size=9, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (9 * 32, 9 * 32, 3)
    env.step(Actions.FORWARD)
    assert env.render().shape == frame.shape


def test_gymnasium_make_registered_and_reproducible() -> None:
    for env_id, size in (("rl/PointNav-v0", 19), ("rl/PointNavSmall-v0", 9)):
        env = gymnasium.make(env_id)
        assert isinstance(env.unwrapped, PointNavEnv)
        assert env.unwrapped.width == size
        obs_a, _ = env.reset(seed=11)
        steps_a = [env.step(a)[0] for a in (0, 2, 2, 1, 2)]
        obs_b, _ = env.reset(seed=11)
        steps_b = [env.step(a)[0] for a in (0, 2, 2, 1, 2)]
        for x, y in zip([obs_a, *steps_a], [obs_b, *steps_b], strict=True):
            np.testing.assert_array_equal(x["image"], y["image"])
            np.testing.assert_array_equal(x["goal"], y["goal"])
    assert gymnasium.make("rl/PointNavSmall-v0").unwrapped.max_steps == 50
    assert gymnasium.make("rl/PointNav-v0").unwrapped.max_steps == 100
    env = make_gym_env(env_id="rl/PointNavSmall-v0")
    assert isinstance(env.unwrapped, PointNavEnv)


def test_registration_is_idempotent() -> None:
    import importlib

    import rl.tasks

    importlib.reload(rl.tasks)
    assert "rl/PointNav-v0" in gymnasium.registry


def test_make_nav_env_defaults() -> None:
    env = PointNavEnv()
    assert type(env) is PointNavEnv
    assert env.width == 19 and env.rooms_per_side == 2 and env.max_steps == 100
    assert env.action_space.n == 4
    assert env.observation_space["image"].shape == (7, 7, 3)
    assert env.observation_space["goal"].shape == (3,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 6, "rooms_per_side": 2}, "too small"),
        ({"size": 3, "rooms_per_side": 1}, "too small"),
        ({"rooms_per_side": 0}, "rooms_per_side"),
        ({"max_steps": 0}, "max_steps"),
        ({"min_start_distance": -1}, "min_start_distance"),
        ({"agent_view_size": 4}, "agent_view_size"),
        ({"agent_view_size": 1}, "agent_view_size"),
        ({"size": 9.5}, "size must be an int"),
        ({"step_penalty": float("nan")}, "step_penalty"),
        ({"render_mode": "ansi"}, "render_mode"),
    ],
)
def test_constructor_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PointNavEnv(**kwargs)  # type: ignore[arg-type]


def test_invalid_action_raises() -> None:
    env = PointNavEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="unknown action"):
        env.step(7)


def _reference_bfs(free: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """Plain breadth-first search over ``free`` (4-connected); -1 on unreachable cells."""
    from collections import deque

    dist = np.full(free.shape, -1, dtype=np.int64)
    dist[start] = 0
    queue = deque([start])
    while queue:
        x, y = queue.popleft()
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nx, ny = x + dx, y + dy
            if (
                0 <= nx < free.shape[0]
                and 0 <= ny < free.shape[1]
                and free[nx, ny]
                and dist[nx, ny] < 0
            ):
                dist[nx, ny] = dist[x, y] + 1
                queue.append((nx, ny))
    return dist


@pytest.mark.parametrize(
    ("size", "rooms"), [(19, 2), (9, 2), (13, 3), (10, 3), (17, 4), (5, 1), (19, 1), (24, 2)]
)
def test_distance_field_matches_reference_bfs(size: int, rooms: int) -> None:
    env = PointNavEnv(size=size, rooms_per_side=rooms)
    rng = np.random.default_rng(size * 10 + rooms)
    for seed in range(25):
        env.reset(seed=seed)
        free = env._free
        # Free cells are the room interiors plus one door per wall segment.
        expected_free = env._interior.copy()
        expected_free[env._door_x, env._door_y] = True
        np.testing.assert_array_equal(free, expected_free)
        assert len(env._door_x) == 2 * rooms * (rooms - 1)
        # The layout is what the minigrid Grid holds: walls exactly where not free.
        kinds = env.grid.encode()[:, :, 0]
        np.testing.assert_array_equal(kinds == 2, ~free)
        np.testing.assert_array_equal(env.distance_field, _reference_bfs(free, env.goal_pos))
        assert env._dist == env.distance_field.tolist()
        # From every door (the goal may be one) and from random free cells as the goal.
        cells = [*zip(env._door_x, env._door_y, strict=True)]
        cells += [tuple(c) for c in _free_cells(env)[rng.integers(len(free.nonzero()[0]), size=5)]]
        for gx, gy in cells:
            assert free[gx, gy]
            np.testing.assert_array_equal(
                env._bfs(int(gx), int(gy)), _reference_bfs(free, (int(gx), int(gy)))
            )


def test_goal_on_a_door_and_min_distance_fallback() -> None:
    # Over many seeds the goal lands on a door sometimes, and with a large minimum distance the
    # pre-drawn start is often rejected (fallback draw among candidates); both stay exact.
    env = PointNavEnv(size=9, min_start_distance=6)
    on_door = 0
    for seed in range(400):
        env.reset(seed=seed)
        on_door += env.goal_pos in set(zip(env._door_x, env._door_y, strict=True))
        np.testing.assert_array_equal(env.distance_field, _reference_bfs(env._free, env.goal_pos))
        assert env.distance_field[env.agent_pos] >= 6
    assert on_door > 0


def _chi2_ok(counts: np.ndarray, expected: np.ndarray) -> bool:
    """Loose chi-square goodness of fit (far beyond the 99.9% quantile for these sizes)."""
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return stat < df + 6 * math.sqrt(2 * df) + 10


def test_layout_distribution_is_uniform() -> None:
    # 9x9 with 2x2 rooms: 3 door positions per wall segment, 40 free cells.
    env = PointNavEnv(size=9, min_start_distance=4)
    env.reset(seed=0)
    episodes = 4000
    door_counts = np.zeros((4, 3))
    goal_counts: dict[tuple[int, int], int] = {}
    dir_counts = np.zeros(4)
    start_rank_bins = np.zeros(10)
    for _ in range(episodes):
        env.reset()
        for d, (slot, x, y) in enumerate(
            zip(env._door_slots, env._door_x, env._door_y, strict=True)
        ):
            x0, y0, ax, ay, _ = slot
            door_counts[d, (x - x0) * ax + (y - y0) * ay] += 1
        goal_counts[env.goal_pos] = goal_counts.get(env.goal_pos, 0) + 1
        dir_counts[env.agent_dir] += 1
        # The start is uniform among the cells at distance >= 4: its rank among them is too.
        candidates = [tuple(c) for c in np.argwhere(env.distance_field >= 4)]
        rank = candidates.index(env.agent_pos)
        start_rank_bins[int(10 * (rank + 0.5) / len(candidates))] += 1
    for row in door_counts:
        assert _chi2_ok(row, np.full(3, episodes / 3))
    assert _chi2_ok(dir_counts, np.full(4, episodes / 4))
    # Every interior cell can be the goal (doors only when their slot is drawn).
    interior = env._interior
    interior_goals = np.array([goal_counts.get(tuple(c), 0) for c in np.argwhere(interior)])
    assert len(interior_goals) == 36
    assert _chi2_ok(interior_goals, np.full(36, episodes / 40))
    door_goals = episodes - interior_goals.sum()
    assert abs(door_goals - episodes * 4 / 40) < 6 * math.sqrt(episodes * 4 / 40)
    # Rank bins are not exactly equal in expectation (candidate counts vary), but close.
    assert _chi2_ok(start_rank_bins, np.full(10, episodes / 10))


def test_grid_is_lazy_and_assignable() -> None:
    env = PointNavEnv(size=9)
    env.reset(seed=0)
    assert env._grid is None  # reset does not build minigrid objects
    grid = env.grid
    assert env.grid is grid  # built once per episode
    assert grid.get(*env.goal_pos).type == "goal"
    np.testing.assert_array_equal(MiniGridEnv.gen_obs(env)["image"], env._image())
    env.reset()
    assert env._grid is None and env.grid is not grid
    other = env.grid.copy()
    env.grid = other
    assert env.grid is other


# ------------------------------------------------------------------------ splits
def layouts_of(split: str | None, size: int, episodes: int = 300) -> set[tuple[int, ...]]:
    env = PointNavEnv(size=size, rooms_per_side=2, split=split)
    try:
        layouts = set()
        for seed in range(episodes):
            env.reset(seed=seed)
            layouts.add(tuple(env._door_v))
        return layouts
    finally:
        env.close()


@pytest.mark.parametrize("size", [9, 19])
def test_splits_share_no_layout(size: int) -> None:
    train, valid, test = (layouts_of(s, size) for s in ("train", "valid", "test"))
    assert train and valid and test
    assert not (train & valid) and not (train & test) and not (valid & test)
    every = layouts_of(None, size, episodes=600)  # no split: layouts of all three
    assert every & train and every & valid and every & test


def test_a_split_is_reproducible_from_the_seed() -> None:
    a, b = PointNavEnv(size=19, split="test"), PointNavEnv(size=19, split="test")
    for seed in range(20):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert np.array_equal(obs_a["image"], obs_b["image"]) and a._door_v == b._door_v


def test_an_unknown_split_is_a_clear_error(compose_cfg, resolve_cfg) -> None:
    from rl.engine.settings import verify_train_cfg
    from rl.utils.config import ConfigError

    with pytest.raises(ValueError, match="split must be one of train, valid, test"):
        PointNavEnv(size=9, split="tset")
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "task.split=tset", "eval.split=x"]))
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(plain)
    assert "task.split: expected one of train, valid, test" in str(info.value)
    assert "eval.split: expected one of train, valid, test" in str(info.value)


def test_evaluation_and_validation_use_their_splits(compose_cfg, resolve_cfg) -> None:
    from rl.evaluation import BackgroundValidation, ValidSettings
    from rl.loggers import MetricsLogger
    from rl.tasks import with_split

    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "valid.enabled=true"]))
    assert plain["task"]["split"] == "train"  # training draws training layouts only
    assert (plain["eval"]["split"], plain["valid"]["split"]) == ("test", "valid")
    validation = BackgroundValidation(
        ValidSettings(**plain["valid"]), task=plain["task"], model=plain["model"],
        logger=MetricsLogger([]),
        device="cpu",
    )  # fmt: skip
    assert validation.task["split"] == "valid"
    validation.close()
    cartpole = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"}
    assert with_split(cartpole, "test") == cartpole  # tasks without splits stay as they are
