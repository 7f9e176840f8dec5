"""``auto`` process counts: the cores this process may use, less the learner's (issue 49)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from rl.collection.hosts import ProcessHosts
from rl.engine import run
from rl.sampling import MultiprocessSampler
from rl.sampling.factory import sampler_num_envs
from rl.utils.config import ConfigError
from rl.utils.threads import CORES_ENV, auto_count, available_cores

SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0"]


@pytest.fixture
def cores() -> Iterator[Any]:
    """Sets this process's CPU affinity to the first ``n`` cores it may use (restored after)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    allowed = os.sched_getaffinity(0)

    def restrict(n: int) -> None:
        os.sched_setaffinity(0, sorted(allowed)[:n])

    yield restrict
    os.sched_setaffinity(0, allowed)


def test_auto_is_the_cores_this_process_may_use_less_the_learner_s(cores: Any) -> None:
    usable = len(os.sched_getaffinity(0))
    assert auto_count("auto") == max(1, usable - 1)
    assert auto_count("auto", cap=1) == 1  # (one environment: one worker)
    assert auto_count(3) == 3
    cores(1)
    assert auto_count("auto") == 1  # never none
    assert sampler_num_envs({"num_processes": "auto", "envs_per_process": 8}) == 8
    with pytest.raises(ValueError, match="collector.num_workers: expected an integer or auto"):
        auto_count("many", what="collector.num_workers")


def test_an_auto_multiprocess_sampler_starts_one_process_a_core(cores: Any) -> None:
    task = {"_target_": "rl_envs.pointnav.PointNavEnv", "size": 7, "rooms_per_side": 1}
    usable = len(os.sched_getaffinity(0))
    with MultiprocessSampler(task=task, num_envs=8, num_processes="auto") as sampler:
        assert sampler.num_processes == max(1, min(8, usable - 1))
        assert sampler.reset()["obs", "image"].shape[0] == 8


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["collector=process", "collector.num_workers=many"], "collector.num_workers"),
        (["sampler=multiprocess", "sampler.num_processes=many"], "sampler.num_processes"),
        (["collector=ray", "collector.num_workers=auto", "collector.address=auto"], "a number"),
    ],
)
def test_counts_other_than_numbers_and_auto_are_refused_by_name(
    compose_cfg: Any, overrides: list[str], problem: str
) -> None:
    with pytest.raises((ConfigError, ValueError), match=problem):
        run.train(compose_cfg([*SMOKE, *overrides]))


def test_learners_of_one_machine_share_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DDP each local rank's ``auto`` is its share: 4 ranks on 64 cores, 15 workers each."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert auto_count("auto") == 63
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert available_cores() == 16 and auto_count("auto") == 15
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "128")  # more ranks than cores: still one each
    assert available_cores() == 1 and auto_count("auto") == 1
    monkeypatch.setenv(CORES_ENV, "6")  # a share set by the framework wins
    assert available_cores() == 6 and auto_count("auto") == 5


class CoreCounts:
    """Served in a process collection worker: what ``auto`` means there."""

    def counts(self) -> tuple[int, int]:
        return available_cores(), auto_count("auto")


def test_a_process_collection_worker_counts_one_core() -> None:
    """A worker's ``auto`` (a multiprocess sampler inside it): one process, not one a core."""
    actors = ProcessHosts(CoreCounts, [{}], start_timeout=120)
    try:
        assert actors.get(actors.call(0, "counts"), 0) == (1, 1)
    finally:
        actors.close(timeout=5)
