"""Multi-stage pipelines through the real trainer: budgets, early stopping, overrides, teacher
forcing, off-policy updates, schedules across stage boundaries, imitation learning."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from pipelines import ppo_pipeline
from small import SMALL

from rl.checkpoints import list_checkpoints
from rl.collection import InProcessCollector, RolloutRequest
from rl.evaluation import episode_seed_list, evaluate_policy
from rl.loggers import MetricsLogger
from rl.losses import ImitationLoss, PPOLoss
from rl.models import ActorCritic
from rl.pipeline import (
    ConstantSchedule,
    EarlyStoppingCriterion,
    LinearDecay,
    MetricThresholdCriterion,
    MultiLinearDecay,
    OffPolicyPipelineComponent,
    PipelineStage,
    TrainingPipeline,
)
from rl.sampling import SerialSampler
from rl.storage import ExpertTrajectoryIterator
from rl.tasks import task_spaces
from rl.training import Callback, OnPolicyTrainer, RolloutInfo


class Recorder(Callback):
    """Callback recording every rollout and stage end."""

    def __init__(self) -> None:
        self.rollouts: list[RolloutInfo] = []
        self.stage_ends: list[tuple[int, int]] = []
        self.checkpoints: list[str] = []
        self.train_ends: list[str] = []
        self.lrs: list[float] = []
        self.actions_equal_expert: list[bool] = []

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        self.rollouts.append(info)
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])
        s = info.rollout.storage
        self.actions_equal_expert.append(
            bool((s["actions"][: s.step] == s["expert_actions"][: s.step]).all())
        )

    def on_stage_end(self, trainer: OnPolicyTrainer, stage_index: int) -> None:
        self.stage_ends.append((stage_index, trainer.pipeline.total_steps))

    def on_checkpoint(self, trainer: OnPolicyTrainer, path: Path) -> None:
        self.checkpoints.append(path.name)

    def on_train_end(self, trainer: OnPolicyTrainer, checkpoint: Path) -> None:
        self.train_ends.append(checkpoint.name)


def pipeline(stages: list[PipelineStage], lr_lambda=None, **settings) -> TrainingPipeline:
    defaults = dict(
        num_steps=16, num_mini_batch=2, update_repeats=1, metric_accumulate_interval=64
    )
    defaults.update(settings)
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss(), "imitation": ImitationLoss()},
        stages=stages,
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        lr_scheduler=None
        if lr_lambda is None
        else functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=lr_lambda),
        **defaults,
    )


def train(
    pipe: TrainingPipeline,
    tmp_path: Path,
    num_envs: int = 4,
    seed: int = 0,
    rnn: str | None = None,
    callbacks: typing.Sequence[Callback] = (),
):
    torch.manual_seed(seed)
    recorder = Recorder()
    with SerialSampler(task=SMALL, num_envs=num_envs, seed=seed) as sampler:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[16],
            trunk_layers=[64],
            rnn=rnn,
            rnn_hidden_size=64,
        )
        trainer = OnPolicyTrainer(
            model=model,
            pipeline=pipe,
            collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
            logger=MetricsLogger([]),
            output_dir=tmp_path,
            seed=seed,
            callbacks=[recorder, *callbacks],
            device="cpu",
        )
        trainer.train()
    return trainer, recorder


def stage_steps(recorder: Recorder, stage: int) -> int:
    return sum(r.env_steps for r in recorder.rollouts if r.stage_index == stage)


def test_stages_end_exactly_at_their_budgets_and_save_checkpoints(tmp_path: Path) -> None:
    # 4 envs x 16 steps = 64 per rollout: stage 0's last rollout is cut to 8 steps (96 = 64+32).
    pipe = pipeline(
        [
            PipelineStage(loss_names=["ppo"], max_stage_steps=96),
            PipelineStage(loss_names=["ppo"], max_stage_steps=64),
        ]
    )
    trainer, rec = train(pipe, tmp_path)
    assert stage_steps(rec, 0) == 96 and stage_steps(rec, 1) == 64
    assert [r.num_steps for r in rec.rollouts] == [16, 8, 16]
    assert rec.stage_ends == [(0, 96), (1, 160)]
    assert pipe.finished and pipe.total_steps == 160
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["ckpt_stage00_step000000000096.pt", "ckpt_stage01_step000000000160.pt"]
    # Every hook of the Callback protocol: each checkpoint once, the end once with the last.
    assert rec.checkpoints == names
    assert rec.train_ends == [names[-1]]


class StopAfter(EarlyStoppingCriterion):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, *, stage_steps, total_steps, training_metrics) -> bool:
        return stage_steps >= self.steps


def test_early_stopping_ends_the_stage_and_the_next_starts_at_once(tmp_path: Path) -> None:
    pipe = pipeline(
        [
            PipelineStage(
                loss_names=["ppo"], max_stage_steps=10_000, early_stopping_criterion=StopAfter(128)
            ),
            PipelineStage(
                loss_names=["ppo"],
                max_stage_steps=10_000,
                early_stopping_criterion=MetricThresholdCriterion(
                    metric="pipeline/stage_steps", threshold=192
                ),
            ),
            PipelineStage(loss_names=["ppo"], max_stage_steps=64),
        ]
    )
    _, rec = train(pipe, tmp_path)
    assert rec.stage_ends == [(0, 128), (1, 128 + 192), (2, 128 + 192 + 64)]
    assert [r.stage_index for r in rec.rollouts] == [0, 0, 1, 1, 1, 2]


class Seen(EarlyStoppingCriterion):
    """Records what it is shown at every check; never fires."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def __call__(self, *, stage_steps, total_steps, training_metrics) -> bool:
        self.seen.append(dict(training_metrics))
        return False


class RecordingLogger(MetricsLogger):
    def __init__(self) -> None:
        super().__init__([])
        self.records: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics) -> None:
        self.records.append((step, dict(metrics)))


def test_a_criterion_judges_every_logged_value_once(tmp_path: Path) -> None:
    # 64 env steps a rollout, a log point every 128: the checks after rollouts 2 and 4 see that
    # log point's values, the others nothing new; after rollout 6 the budget ends the stage
    # before the criterion is asked.
    seen = Seen()
    pipe = pipeline(
        [PipelineStage(loss_names=["ppo"], max_stage_steps=384, early_stopping_criterion=seen)],
        metric_accumulate_interval=128,
    )
    logger = RecordingLogger()
    with SerialSampler(task=SMALL, num_envs=4, seed=0) as sampler:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[8],
            rnn=None,
        )
        OnPolicyTrainer(
            model=model,
            pipeline=pipe,
            collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
            logger=logger,
            output_dir=tmp_path,
            device="cpu",
        ).train()
    logged = [metrics for step, metrics in logger.records if "charts/SPS" in metrics]
    assert [step for step, m in logger.records if "charts/SPS" in m] == [128, 256, 384]
    assert [bool(v) for v in seen.seen] == [False, True, False, True, False]
    assert [v for v in seen.seen if v] == logged[:2]  # each logged value once, unaveraged


def test_stage_overrides_take_effect_and_unset_values_fall_back(tmp_path: Path) -> None:
    pipe = pipeline(
        [
            PipelineStage(loss_names=["ppo"], max_stage_steps=64),
            PipelineStage(
                loss_names=["ppo"],
                max_stage_steps=64,
                num_steps=8,
                gamma=0.5,
                num_mini_batch=4,
                update_repeats=3,
            ),
        ],
        update_repeats=2,
    )
    _, rec = train(pipe, tmp_path)
    first, second = rec.rollouts[0], rec.rollouts[-1]
    assert (first.num_steps, first.settings.gamma, first.settings.num_mini_batch) == (16, 0.99, 2)
    assert first.settings.update_repeats == 2
    assert (second.num_steps, second.settings.gamma, second.settings.num_mini_batch) == (8, 0.5, 4)
    assert second.settings.update_repeats == 3
    assert second.settings.advantage is first.settings.advantage  # inherited, the same object
    assert [r.num_steps for r in rec.rollouts] == [16, 8, 8]


def test_teacher_forcing_frequency_follows_its_schedule(tmp_path: Path) -> None:
    num_envs, decay = 8, 8 * 16 * 40  # 40 rollouts of decay, then 20 without forcing
    pipe = pipeline(
        [
            PipelineStage(
                loss_names=["imitation"],
                max_stage_steps=decay + decay // 2,
                teacher_forcing=LinearDecay(steps=decay, startp=0.6, endp=0.0),
            )
        ],
        num_mini_batch=1,
        metric_accumulate_interval=10**9,
    )
    _, rec = train(pipe, tmp_path, num_envs=num_envs)
    during = [r for r in rec.rollouts if r.total_steps <= decay]
    after = [r for r in rec.rollouts if r.total_steps > decay]
    forced = sum(r.teacher_forced for r in during) / sum(r.env_steps for r in during)
    assert forced == pytest.approx(0.3, abs=0.03)  # mean of 0.6 -> 0
    # Per rollout, the frequency tracks the schedule at that point.
    early = sum(r.teacher_forced for r in during[:10]) / sum(r.env_steps for r in during[:10])
    assert early == pytest.approx(0.6 * (1 - 5 / 40), abs=0.06)
    assert after and all(r.teacher_forced == 0 for r in after)


def test_full_teacher_forcing_records_the_expert_actions(tmp_path: Path) -> None:
    pipe = pipeline(
        [
            PipelineStage(
                loss_names=["imitation"],
                max_stage_steps=128,
                teacher_forcing=ConstantSchedule(value=1.0),
            )
        ]
    )
    _, rec = train(pipe, tmp_path)
    assert all(rec.actions_equal_expert)
    assert sum(r.teacher_forced for r in rec.rollouts) == 128


def test_each_loss_is_logged_with_its_weight_and_its_total(tmp_path: Path) -> None:
    """losses/<name>/{weight,total} per loss; losses/total is the sum of weight x total."""
    stages = [
        PipelineStage(
            loss_names=["ppo", "imitation"], loss_weights=[1.0, 0.25], max_stage_steps=64
        ),
        PipelineStage(
            loss_names=["ppo", "imitation"], loss_weights=[0.5, 2.0], max_stage_steps=64
        ),
    ]
    pipe = pipeline(stages)
    logged: list[dict[str, float]] = []

    class Metrics(Callback):
        def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
            if trainer.last_metrics:
                logged.append(dict(trainer.last_metrics))

        def on_train_end(self, trainer: OnPolicyTrainer, checkpoint: Path) -> None:
            logged.append(dict(trainer.last_metrics))

    train(pipe, tmp_path, callbacks=[Metrics()])
    weights = [(m["losses/ppo/weight"], m["losses/imitation/weight"]) for m in logged]
    assert (1.0, 0.25) in weights and (0.5, 2.0) in weights, weights
    for m in logged:
        parts = sum(m[f"losses/{n}/weight"] * m[f"losses/{n}/total"] for n in ("ppo", "imitation"))
        assert parts == pytest.approx(m["losses/total"], rel=1e-5, abs=1e-6)


def test_offpolicy_component_runs_exactly_its_updates(tmp_path: Path) -> None:
    data = ExpertTrajectoryIterator(
        path=str(tmp_path / "expert.npz"),
        batch_size=4,
        seq_len=8,
        generate={"task": SMALL, "num_episodes": 20, "seed": 0},
    )
    component = OffPolicyPipelineComponent(data_iterator=data, loss_names=["imitation"], updates=3)
    pipe = pipeline(
        [
            PipelineStage(loss_names=[], max_stage_steps=192, offpolicy_component=component),
            PipelineStage(loss_names=["ppo"], max_stage_steps=64),
        ]
    )
    trainer, rec = train(pipe, tmp_path)
    assert [r.offpolicy_updates for r in rec.rollouts] == [3, 3, 3, 0]
    assert trainer.learner.offpolicy_update_count == 9


def test_each_distributed_worker_draws_its_own_offpolicy_data(tmp_path: Path) -> None:
    from rl.distributed import DistContext
    from rl.training import Learner

    drawn = []
    for rank in (0, 1):
        data = ExpertTrajectoryIterator(
            path=str(tmp_path / "expert.npz"),
            batch_size=8,
            seq_len=4,
            seed=7,
            generate={"task": SMALL, "num_episodes": 10, "seed": 0},
        )
        component = OffPolicyPipelineComponent(
            data_iterator=data, loss_names=["imitation"], updates=1
        )
        pipe = pipeline([PipelineStage(loss_names=[], max_stage_steps=64,
                                       offpolicy_component=component)])  # fmt: skip
        space, actions = task_spaces(SMALL)
        model = ActorCritic(observation_space=space, action_space=actions, cnn_channels=[8])
        Learner(
            model=model,
            pipeline=pipe,
            dist=DistContext(rank=rank, world_size=2, device=torch.device("cpu")),
            device="cpu",
        )
        drawn.append([component.next_batch()["steps"] for _ in range(400)])
    a, b = (torch.cat([s.flatten() for s in d]) for d in drawn)
    assert not torch.equal(drawn[0][0], drawn[1][0])  # different batches
    assert a.max() < b.min()  # disjoint shares ...
    covered = set(a.tolist()) | set(b.tolist())
    assert covered == set(range(data.num_steps))  # ... that cover the data set between them


def test_lr_multi_linear_decay_across_stage_boundaries(tmp_path: Path) -> None:
    schedule = MultiLinearDecay(
        schedule=[
            LinearDecay(steps=128, startp=1.0, endp=0.5),
            LinearDecay(steps=128, startp=0.5, endp=0.0),
        ]
    )
    pipe = pipeline(
        [
            PipelineStage(loss_names=["ppo"], max_stage_steps=128),
            PipelineStage(loss_names=["ppo"], max_stage_steps=128),
        ],
        lr_lambda=schedule,
    )
    _, rec = train(pipe, tmp_path)
    steps = [r.total_steps for r in rec.rollouts]
    assert steps == [64, 128, 192, 256]
    np.testing.assert_allclose(rec.lrs, [1e-3 * f for f in (0.75, 0.5, 0.25, 0.0)], atol=1e-12)


@pytest.mark.slow
@pytest.mark.learning
def test_imitation_with_teacher_forcing_learns_the_expert(
    tmp_path: Path, seed_offset: int
) -> None:
    torch.set_num_threads(1)  # the result must not depend on what ran before in this process
    pipe = pipeline(
        [
            PipelineStage(
                loss_names=["imitation"],
                max_stage_steps=60_000,
                teacher_forcing=LinearDecay(steps=30_000, startp=1.0, endp=0.0),
            )
        ],
        num_steps=32,
        num_mini_batch=4,
        update_repeats=2,
        metric_accumulate_interval=10**9,
    )
    trainer, _ = train(pipe, tmp_path, num_envs=16, seed=seed_offset, rnn="gru")
    result = evaluate_policy(
        model=trainer.model,
        task=SMALL,
        episode_seeds=episode_seed_list(100, 1_000_000 + 100_000 * seed_offset),
        deterministic=False,
        action_seed=seed_offset,
        device="cpu",
    )
    assert result.metrics["success"] >= 0.9, result.metrics


def test_teacher_forcing_without_an_expert_field_is_an_error() -> None:
    """CartPole declares no ``expert_actions`` step field: teacher forcing says so instead of
    taking no expert action (before: every step's expert was -1, silently never forced)."""
    cartpole = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"}
    with SerialSampler(task=cartpole, num_envs=2, seed=0) as sampler:
        assert "expert_actions" not in sampler.step_fields
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[],
            trunk_layers=[],
            rnn=None,
            head_layers=[16],
        )
        collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
        collector.collect(RolloutRequest(num_steps=4))  # without teacher forcing: fine
        with pytest.raises(ValueError, match="teacher forcing .* declares no such field"):
            collector.collect(
                RolloutRequest(num_steps=4, teacher_forcing=ConstantSchedule(value=1.0))
            )


class FirstStepStarts(Callback):
    """Records whether every env began an episode at each rollout's first step."""

    def __init__(self) -> None:
        self.all_start: list[bool] = []

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        self.all_start.append(bool(info.rollout.storage["episode_starts"][0].all()))


def test_advance_scene_rollout_period_starts_new_episodes(tmp_path: Path) -> None:
    pipe = pipeline(
        [
            PipelineStage(loss_names=["ppo"], max_stage_steps=64 * 3),
            PipelineStage(
                loss_names=["ppo"], max_stage_steps=64 * 5, advance_scene_rollout_period=2
            ),
        ],
        num_steps=16,
    )
    probe = FirstStepStarts()
    with SerialSampler(task={**SMALL, "max_steps": 100}, num_envs=4, seed=0) as sampler:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[8],
            rnn=None,
        )
        OnPolicyTrainer(
            model=model,
            pipeline=pipe,
            collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
            logger=MetricsLogger([]),
            output_dir=tmp_path,
            callbacks=[probe],
            device="cpu",
        ).train()
    # Rollout 0 starts from reset; in stage 1 (rollouts 3..7) every 2nd rollout forces new
    # episodes, so rollouts 5 and 7 start with all envs at an episode start.
    assert probe.all_start[0] and probe.all_start[5] and probe.all_start[7]
    assert not any(probe.all_start[i] for i in (1, 2, 3, 4, 6))


# ------------------------------------------------------- settings, declared once
def test_the_constructors_take_the_settings_as_declared() -> None:
    """Names, types and ranges come from TrainingSettings alone (what the config check reads)."""
    from rl.pipeline import TrainingSettings
    from rl.utils.config import _hints, split_hint

    names = TrainingSettings.names()
    for cls, optional in ((TrainingPipeline, False), (PipelineStage, True)):
        params = inspect.signature(cls).parameters
        assert set(names) <= set(params), cls
        hints = _hints(cls)
        for name in names:
            declared = typing.get_type_hints(TrainingSettings, include_extras=True)[name]
            assert split_hint(hints[name])[1] == split_hint(declared)[1], (cls, name)
            assert (params[name].default is None) == (
                optional or name == "advance_scene_rollout_period"
            ), (cls, name)


def test_a_settings_mistake_names_the_key() -> None:
    with pytest.raises(TypeError, match=r"\['gama'\] are not training settings"):
        PipelineStage(loss_names=["ppo"], gama=0.9)
    with pytest.raises(ValueError, match=r"pipeline stage.gamma: must be <= 1, got 2"):
        PipelineStage(loss_names=["ppo"], gamma=2)
    parts = {"named_losses": {"ppo": PPOLoss()}, "stages": [PipelineStage(loss_names=["ppo"])]}
    with pytest.raises(TypeError, match=r"settings missing \(or null\): \['num_steps'\]"):
        ppo_pipeline(**parts, total_env_steps=8, num_steps=None)
    with pytest.raises(ValueError, match=r"pipeline.num_mini_batch: must be >= 1, got 0"):
        ppo_pipeline(**parts, total_env_steps=8, num_mini_batch=0)


def test_the_pipeline_and_the_config_check_apply_the_same_rules(compose_cfg, resolve_cfg) -> None:
    """Each cross-field rule is written once (rl.pipeline.verify) and both apply it."""
    from rl.engine.settings import verify_train_cfg
    from rl.utils.config import ConfigError

    message = "loss_weights: one weight per loss name is required (2 for 1)"
    with pytest.raises(ValueError, match=re.escape(f"pipeline stage.{message}")):
        PipelineStage(loss_names=["ppo"], loss_weights=[1.0, 2.0])
    overrides = ["+experiment=ppo_nav", "+pipeline.stages.0.loss_weights=[1,2]"]
    with pytest.raises(ConfigError, match=re.escape(f"pipeline.stages.0.{message}")):
        verify_train_cfg(resolve_cfg(compose_cfg(overrides)))
