"""Learning with collection workers: 2 DDP learners x 2 workers each (process workers in async,
Ray workers in sync), and V-trace on barrier-free asynchronous data, each on the learning test's
nav_small budget (an upper bound: the stage ends once training success reaches 0.97,
``STOP_ONCE_LEARNED``).

In a module of their own so that the test processes run them beside the other worker tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_learning import STOP_ONCE_LEARNED

from rl.engine import run

pytestmark = pytest.mark.learning

TWO_BY_TWO = [
    "+experiment=ppo_nav",
    "task=nav_small",
    "total_env_steps=200_000",
    "sampler.num_envs=8",  # per rank: 2 ranks x 8 = ppo_nav's 16 in all
    "torch_threads=1",
    "eval.num_episodes=100",
    STOP_ONCE_LEARNED,
    # The criterion judges each log point: one every 4096 env steps (not ppo's 20k) stops the
    # run within a few updates of learning, not up to 20k steps after.
    "pipeline.metric_accumulate_interval=4096",
    # 2 minibatches of 4 environments a rank: half the optimizer steps (and DDP all-reduces,
    # each a wait for both ranks on a busy machine) of ppo_nav's 4, the same 4 epochs.
    "pipeline.num_mini_batch=2",
    "distributed=ddp",
    "distributed.world_size=2",
    "collector.num_workers=2",
    "logger.sinks.console.progress_bar=false",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("collector", "mode", "lag"), [("process", "async", 1.0), ("ray", "sync", 0.0)]
)
def test_two_learners_with_two_workers_each_learn_small_pointnav(
    collector: str, mode: str, lag: float, compose_cfg: Any
) -> None:
    """2 DDP learners x 2 collection workers each: process workers collecting while their
    learner updates (policy lag 1), Ray workers with every rollout on the current weights."""
    cfg = compose_cfg([*TWO_BY_TWO, f"collector={collector}", f"collector.mode={mode}"])
    metrics = run.train(cfg)
    assert metrics["collection/policy_lag"] == lag, metrics
    assert metrics["eval/success"] >= 0.9, metrics
    assert metrics["eval/spl"] >= 0.7, metrics


@pytest.mark.slow
def test_vtrace_with_barrier_free_async_learns_small_pointnav(compose_cfg: Any) -> None:
    """V-trace advantages on data up to 4 versions old (2 workers, one rollout per update)."""
    cfg = compose_cfg(
        [
            "+experiment=ppo_nav",
            "task=nav_small",
            "total_env_steps=200_000",
            "torch_threads=1",
            "eval.num_episodes=100",
            STOP_ONCE_LEARNED,
            "pipeline.metric_accumulate_interval=4096",  # (judged every 4096 steps, as above)
            "collector=process",
            "collector.num_workers=2",
            "collector.rollouts_per_update=1",
            "collector.max_policy_lag=4",
            "pipeline/advantage=vtrace",
            "pipeline.num_mini_batch=2",  # 8 environments per update
            "logger.sinks.console.progress_bar=false",
        ]
    )
    metrics = run.train(cfg)
    assert metrics["collection/policy_lag_max"] <= 4, metrics
    assert metrics["eval/success"] >= 0.9, metrics
