"""Schedules, trackers, seeding/counting helpers and the TrainingPipeline's bookkeeping."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch
from pipelines import ppo_pipeline

from rl.losses import PPOLoss
from rl.pipeline import (
    ConstantSchedule,
    LinearDecay,
    MetricThresholdCriterion,
    MultiLinearDecay,
    PipelineStage,
    ScalarMeanTracker,
    TrainingPipeline,
    step_lr_scheduler_to,
)
from rl.utils import env_seeds, evenly_distribute_count_into_bins, set_seed

# ----------------------------------------------------------------- schedules


def test_linear_decay() -> None:
    s = LinearDecay(steps=200, startp=1.0, endp=0.2)
    assert s(0) == pytest.approx(1.0)
    assert s(100) == pytest.approx(0.6)
    assert s(200) == pytest.approx(0.2)
    assert s(10_000) == pytest.approx(0.2)
    assert s(-5) == pytest.approx(1.0)


def test_linear_decay_rejects_nonpositive_steps() -> None:
    with pytest.raises(ValueError):
        LinearDecay(steps=0)


STAGE_BUDGETS = (100, 50)


def _two_piece() -> MultiLinearDecay:
    return MultiLinearDecay(
        schedule=[
            LinearDecay(steps=STAGE_BUDGETS[0], startp=1.0, endp=0.5),
            LinearDecay(steps=STAGE_BUDGETS[1], startp=0.5, endp=0.0),
        ]
    )


@pytest.mark.parametrize(
    ("steps", "value"),
    [(0, 1.0), (50, 0.75), (100, 0.5), (125, 0.25), (150, 0.0), (10_000, 0.0)],
)
def test_multi_linear_decay_piecewise(steps: int, value: float) -> None:
    assert _two_piece()(steps) == pytest.approx(value)


def test_multi_linear_decay_continuous_at_boundaries() -> None:
    s = _two_piece()
    for bound in (100, 150):
        assert s(bound - 1) == pytest.approx(s(bound), abs=0.011)
        assert s(bound - 1) > s(bound)


def test_multi_linear_decay_follows_the_pipeline_across_its_stages() -> None:
    # Drive a pipeline in rollouts of 10 env steps and read the schedule at its env-step count:
    # each piece must end exactly where the pipeline ends the stage it belongs to.
    pipe, schedule = _pipeline(budgets=STAGE_BUDGETS), _two_piece()
    at_stage_end = []
    while not pipe.finished:
        pipe.add_steps(10)
        if pipe.should_advance({}):
            at_stage_end.append(
                (pipe.current_stage_index, pipe.total_steps, schedule(pipe.total_steps))
            )
            pipe.advance()
    assert at_stage_end == [(0, 100, 0.5), (1, 150, 0.0)]
    assert schedule(pipe.total_max_steps) == 0.0


def test_constant_schedule() -> None:
    s = ConstantSchedule(value=0.3)
    assert [s(0), s(10**9)] == [0.3, 0.3]


# ------------------------------------------------------------------ trackers
def test_scalar_mean_tracker_weighted_means() -> None:
    tr = ScalarMeanTracker()
    tr.add_scalars({"a": 1.0, "b": 10.0}, n=1)
    tr.add_scalars({"a": 4.0}, n=3)
    tr.add_scalars({"a": 0.0, "b": 20.0}, n={"a": 0, "b": 3})
    assert tr.means() == pytest.approx({"a": (1 + 12) / 4, "b": (10 + 60) / 4})
    assert tr.counts() == {"a": 4, "b": 4}
    assert len(tr) == 2


def test_scalar_mean_tracker_pop_and_reset() -> None:
    tr = ScalarMeanTracker()
    tr.add_scalars({"a": 2.0})
    assert tr.pop_and_reset() == {"a": 2.0}
    assert tr.pop_and_reset() == {}
    assert len(tr) == 0


# --------------------------------------------------------------- helpers
@pytest.mark.parametrize(("count", "nbins"), [(10, 4), (7, 7), (16, 1), (100, 7), (5, 3)])
def test_evenly_distribute(count: int, nbins: int) -> None:
    bins = evenly_distribute_count_into_bins(count, nbins)
    assert len(bins) == nbins
    assert sum(bins) == count
    assert max(bins) - min(bins) <= 1
    assert min(bins) >= 1


@pytest.mark.parametrize(("count", "nbins"), [(3, 4), (5, 0), (5, -1)])
def test_evenly_distribute_errors(count: int, nbins: int) -> None:
    with pytest.raises(ValueError):
        evenly_distribute_count_into_bins(count, nbins)


def test_env_seeds_deterministic_distinct_prefix_stable() -> None:
    seeds = env_seeds(64, 123)
    assert seeds == env_seeds(64, 123)
    assert len(set(seeds)) == 64
    assert all(0 <= s < 2**31 for s in seeds)
    assert env_seeds(5, 123) == seeds[:5]
    assert env_seeds(5, 124) != seeds[:5]


def test_env_seeds_leave_global_rngs_untouched() -> None:
    set_seed(7)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_seed(7)
    env_seeds(32, 0)
    env_seeds(4, None)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_set_seed_reproducible() -> None:
    def draw():
        return random.random(), np.random.rand(3).tolist(), torch.randn(3).tolist()

    set_seed(11)
    a = draw()
    set_seed(11)
    assert draw() == a
    set_seed(12)
    assert draw() != a


# ------------------------------------------------------------------ pipeline
def _pipeline(budgets=(100, 50), criterion=None, **defaults) -> TrainingPipeline:
    stages = [
        PipelineStage(loss_names=["ppo"], max_stage_steps=budgets[0], num_steps=16, gamma=0.9),
        PipelineStage(
            loss_names=["ppo"],
            max_stage_steps=budgets[1],
            loss_weights=[0.5],
            early_stopping_criterion=criterion,
        ),
    ]
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=stages,
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        **{"num_steps": 128, "gamma": 0.99, "num_mini_batch": 4, **defaults},
    )


def test_stage_settings_override_pipeline_defaults() -> None:
    pipe = _pipeline(update_repeats=3)
    first, second = pipe.settings_for(0), pipe.settings_for(1)
    assert (first.num_steps, first.gamma) == (16, 0.9)
    assert (second.num_steps, second.gamma) == (128, 0.99)
    assert first.update_repeats == second.update_repeats == 3
    assert first.num_mini_batch == second.num_mini_batch == 4
    assert pipe.current_settings == first
    assert pipe.stages[1].weighted_losses == {"ppo": 0.5}
    assert pipe.total_max_steps == 150


def test_should_advance_at_budget_and_finish() -> None:
    pipe = _pipeline()
    pipe.add_steps(64)
    assert not pipe.should_advance({})
    pipe.add_steps(64)  # 128 >= 100
    assert pipe.should_advance({})
    pipe.advance()
    assert pipe.current_stage_index == 1
    assert (pipe.stage_steps, pipe.total_steps) == (0, 128)
    assert pipe.stage_remaining_steps == 50
    pipe.add_steps(50)
    assert pipe.should_advance({})
    pipe.advance()
    assert pipe.finished
    with pytest.raises(RuntimeError):
        _ = pipe.current_stage


def test_should_advance_on_metric_threshold() -> None:
    crit = MetricThresholdCriterion(metric="charts/success", threshold=0.8, min_stage_steps=10)
    pipe = _pipeline(criterion=crit)
    pipe.add_steps(100)
    pipe.advance()
    pipe.add_steps(5)
    assert not pipe.should_advance({"charts/success": 0.9})  # before min_stage_steps
    pipe.add_steps(5)
    assert not pipe.should_advance({})
    assert not pipe.should_advance({"charts/success": 0.7})
    assert pipe.should_advance({"charts/success": 0.8})


def test_metric_threshold_min_mode() -> None:
    crit = MetricThresholdCriterion(metric="loss", threshold=0.1, mode="min")
    assert crit(stage_steps=1, total_steps=1, training_metrics={"loss": 0.05})
    assert not crit(stage_steps=1, total_steps=1, training_metrics={"loss": 0.5})
    with pytest.raises(ValueError):
        MetricThresholdCriterion(metric="x", threshold=0, mode="avg")


def test_state_dict_round_trip() -> None:
    pipe = _pipeline()
    pipe.add_steps(120)
    pipe.advance()
    pipe.add_steps(16)
    pipe.add_steps(16)
    state = pipe.state_dict()
    restored = _pipeline()
    restored.load_state_dict(state)
    assert (
        restored.state_dict()
        == state
        == {
            "current_stage_index": 1,
            "stage_steps": 32,
            "total_steps": 152,
            "rollout_count": 2,
        }
    )
    assert restored.current_stage is restored.stages[1]
    with pytest.raises(ValueError):
        restored.load_state_dict({**state, "current_stage_index": 3})


def test_unknown_loss_name_raises() -> None:
    with pytest.raises(ValueError, match="nope"):
        ppo_pipeline(
            named_losses={"ppo": PPOLoss()},
            stages=[PipelineStage(loss_names=["nope"], max_stage_steps=10)],
            optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        )


def test_lr_scheduler_reaches_zero_at_total_env_steps() -> None:
    total = 1000
    base_lr = 0.01
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=LinearDecay(steps=total))
    for steps, fraction in [
        (0, 1.0),
        (250, 0.75),
        (500, 0.5),
        (900, 0.1),
        (total, 0.0),
        (2 * total, 0.0),
    ]:
        step_lr_scheduler_to(sched, steps)
        assert opt.param_groups[0]["lr"] == pytest.approx(base_lr * fraction, abs=1e-12)
    assert opt.param_groups[0]["lr"] == 0.0
    # Stepping backwards (resuming from a checkpoint) sets the value too.
    step_lr_scheduler_to(sched, 500)
    assert opt.param_groups[0]["lr"] == pytest.approx(base_lr / 2)
