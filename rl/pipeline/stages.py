"""Training pipelines as data: stages of named losses run in order (AllenAct's semantics).

A :class:`TrainingPipeline` holds the named losses, the optimizer and LR-scheduler builders,
default :class:`TrainingSettings`, and a list of :class:`PipelineStage`. Each stage names the
losses it optimises (with weights), its budget in env steps, optional teacher forcing, an
optional early-stopping criterion, and overrides of any training setting; unset values fall back
to the pipeline's. The pipeline tracks where training is (stage index, stage and total env
steps) and round-trips that position through :meth:`TrainingPipeline.state_dict`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import torch

from rl.pipeline.early_stopping import EarlyStoppingCriterion, NeverEarlyStoppingCriterion
from rl.pipeline.offpolicy import OffPolicyPipelineComponent
from rl.pipeline.schedules import Schedule
from rl.utils.config import Check

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """Settings of the rollout/update loop; in a stage, ``None`` means "use the pipeline's".

    Attributes:
        num_steps: Rollout length per environment (T).
        num_mini_batch: Minibatches per update epoch (split by sequence: see ``recurrence``).
        update_repeats: Update epochs over each rollout.
        recurrence: Length of the sequences a recurrent policy is re-run over in the update
            (truncated BPTT, Sample Factory's ``recurrence``): the rollout is cut into chunks of
            this many steps, each starting from the recurrent state stored when it was
            collected. ``0``: whole rollouts from the rollout's first state (exact
            full-sequence BPTT). Must divide ``num_steps``.
        max_grad_norm: Gradient-norm clipping threshold.
        gamma: Discount factor.
        use_gae: Generalised advantage estimation (False: discounted returns); with
            ``advantage: gae`` only.
        gae_lambda: GAE's lambda (with ``advantage: gae`` only).
        advantage: The advantage estimator: ``gae`` (the on-policy estimator ``use_gae``
            picks, from the rollout's values) or ``vtrace`` (V-trace's off-policy correction
            between the behaviour log-probabilities stored with the rollout and the learner's
            current ones, with the learner's current values:
            :func:`~rl.storage.compute_vtrace`).
        vtrace_rho_bar: V-trace's truncation of the importance weights in its TD errors and
            policy-gradient advantages (rho bar).
        vtrace_c_bar: V-trace's truncation of its trace coefficients (c bar).
        vtrace_lambda: V-trace's lambda in its trace coefficients (1: the paper's V-trace).
        advance_scene_rollout_period: Reserved for samplers that switch scenes every k rollouts.
        save_interval: Save a checkpoint every this many env steps (0: only at stage ends).
        metric_accumulate_interval: Log every this many env steps.
    """

    num_steps: int | None = None
    num_mini_batch: int | None = None
    update_repeats: int | None = None
    recurrence: int | None = None
    max_grad_norm: float | None = None
    gamma: float | None = None
    use_gae: bool | None = None
    gae_lambda: float | None = None
    advantage: str | None = None
    vtrace_rho_bar: float | None = None
    vtrace_c_bar: float | None = None
    vtrace_lambda: float | None = None
    advance_scene_rollout_period: int | None = None
    save_interval: int | None = None
    metric_accumulate_interval: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainingSettings:
        """The settings found in ``values`` (e.g. a constructor's ``locals()``)."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})

    def overridden_by(self, other: TrainingSettings) -> TrainingSettings:
        """These settings with every non-None value of ``other`` replacing ours."""
        updates = {k: v for k, v in dataclasses.asdict(other).items() if v is not None}
        return dataclasses.replace(self, **updates)

    def set_fields(self) -> dict[str, Any]:
        """The settings that are not None."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# What a non-finite loss or gradient norm does (TrainingPipeline's ``on_nonfinite``).
NONFINITE_POLICIES = ("error", "skip")
# The advantage estimators (the ``advantage`` training setting).
ADVANTAGE_ESTIMATORS = ("gae", "vtrace")
# Settings that may stay None even in the merged result.
_OPTIONAL_SETTINGS = frozenset({"advance_scene_rollout_period"})


def _check_advantage(advantage: str | None, key: str) -> None:
    """A ValueError naming ``key`` for an unknown advantage estimator (None: not set)."""
    if advantage is not None and advantage not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"{key}: expected one of {', '.join(ADVANTAGE_ESTIMATORS)}, got {advantage!r}"
        )


class PipelineStage:
    """One stage of a pipeline.

    Args:
        loss_names: Names of the losses (keys of the pipeline's ``named_losses``) to optimise.
        max_stage_steps: Budget of the stage in env steps (summed over all environments); None
            (one stage at most): what the other stages leave of the pipeline's
            ``total_env_steps``.
        loss_weights: One weight per loss name (default: all 1).
        teacher_forcing: Schedule over the stage's env steps giving the probability that the
            expert's action is taken instead of the policy's (None: never).
        early_stopping_criterion: Ends the stage before its budget (None: never).
        offpolicy_component: Off-policy losses run after every rollout's update (None: none).
            A stage with a component may have no on-policy losses (``loss_names: []``).
        num_steps: Override of :attr:`TrainingSettings.num_steps` (likewise the rest).
        num_mini_batch: Override.
        update_repeats: Override.
        recurrence: Override.
        max_grad_norm: Override.
        gamma: Override.
        use_gae: Override.
        gae_lambda: Override.
        advantage: Override.
        vtrace_rho_bar: Override.
        vtrace_c_bar: Override.
        vtrace_lambda: Override.
        advance_scene_rollout_period: Override.
        save_interval: Override.
        metric_accumulate_interval: Override.
    """

    def __init__(
        self,
        *,
        loss_names: Sequence[str],
        max_stage_steps: Annotated[int | None, Check(gt=0)] = None,
        loss_weights: Sequence[float] | None = None,
        teacher_forcing: Schedule | None = None,
        early_stopping_criterion: EarlyStoppingCriterion | None = None,
        offpolicy_component: OffPolicyPipelineComponent | None = None,
        num_steps: Annotated[int | None, Check(ge=1)] = None,
        num_mini_batch: Annotated[int | None, Check(ge=1)] = None,
        update_repeats: Annotated[int | None, Check(ge=1)] = None,
        recurrence: Annotated[int | None, Check(ge=0)] = None,
        max_grad_norm: Annotated[float | None, Check(gt=0)] = None,
        gamma: Annotated[float | None, Check(ge=0, le=1)] = None,
        use_gae: bool | None = None,
        gae_lambda: Annotated[float | None, Check(ge=0, le=1)] = None,
        advantage: Annotated[str | None, Check(choices=ADVANTAGE_ESTIMATORS)] = None,
        vtrace_rho_bar: Annotated[float | None, Check(gt=0)] = None,
        vtrace_c_bar: Annotated[float | None, Check(gt=0)] = None,
        vtrace_lambda: Annotated[float | None, Check(ge=0, le=1)] = None,
        advance_scene_rollout_period: Annotated[int | None, Check(ge=1)] = None,
        save_interval: Annotated[int | None, Check(ge=0)] = None,
        metric_accumulate_interval: Annotated[int | None, Check(ge=0)] = None,
    ) -> None:
        _check_advantage(advantage, "PipelineStage.advantage")
        self.loss_names = list(loss_names)
        self.offpolicy_component = offpolicy_component
        if not self.loss_names and offpolicy_component is None:
            raise ValueError("a pipeline stage needs loss names or an off-policy component")
        self.loss_weights = (
            [1.0] * len(self.loss_names) if loss_weights is None else list(loss_weights)
        )
        if len(self.loss_weights) != len(self.loss_names):
            raise ValueError(
                f"loss_weights has {len(self.loss_weights)} entries for "
                f"{len(self.loss_names)} loss_names {self.loss_names}"
            )
        if max_stage_steps is not None and int(max_stage_steps) <= 0:
            raise ValueError(f"max_stage_steps must be positive, got {max_stage_steps}")
        # None until the pipeline gives it the rest of its total (TrainingPipeline).
        self.max_stage_steps: int = None if max_stage_steps is None else int(max_stage_steps)  # type: ignore[assignment]
        self.teacher_forcing = teacher_forcing
        self.early_stopping_criterion = early_stopping_criterion or NeverEarlyStoppingCriterion()
        self.training_settings = TrainingSettings.from_mapping(locals())

    @property
    def weighted_losses(self) -> dict[str, float]:
        """``{loss_name: weight}`` for this stage."""
        return dict(zip(self.loss_names, self.loss_weights, strict=True))

    def __repr__(self) -> str:
        return (
            f"PipelineStage(loss_names={self.loss_names}, max_stage_steps={self.max_stage_steps},"
            f" overrides={self.training_settings.set_fields()})"
        )


def _fill_open_budget(stages: Sequence[PipelineStage], total_env_steps: int | None) -> None:
    """Give the stage without ``max_stage_steps`` (if any) the rest of ``total_env_steps``."""
    open_ = [i for i, stage in enumerate(stages) if stage.max_stage_steps is None]
    if not open_:
        return
    if len(open_) > 1:
        raise ValueError(
            f"pipeline.stages {open_}: only one stage may leave max_stage_steps unset (it gets "
            "what the others leave of total_env_steps)"
        )
    if total_env_steps is None:
        raise ValueError(
            f"pipeline.stages.{open_[0]}.max_stage_steps is unset: it takes the rest of "
            "pipeline.total_env_steps, which is not set either"
        )
    rest = int(total_env_steps) - sum(s.max_stage_steps for s in stages if s.max_stage_steps)
    if rest <= 0:
        raise ValueError(
            f"pipeline.stages.{open_[0]}.max_stage_steps is unset, but the other stages take "
            f"all of total_env_steps={int(total_env_steps):,}"
        )
    stages[open_[0]].max_stage_steps = rest


class TrainingPipeline:
    """Stages of training run in order, with named losses and default settings.

    Args:
        named_losses: Losses by name; stages refer to them by these names.
        stages: The stages, in order.
        total_env_steps: The run's budget (``${total_env_steps}`` in ``conf/pipeline``): a stage
            without ``max_stage_steps`` gets what the others leave of it. Needed only then.
        optimizer: Builder of the optimizer, called as ``optimizer(params=...)`` (a Hydra
            ``_partial_``).
        lr_scheduler: Builder of the LR scheduler, called as ``lr_scheduler(optimizer=...)``
            (e.g. a partial ``LambdaLR`` with ``lr_lambda: LinearDecay``); stepped with env steps.
            None keeps the LR constant.
        num_steps: Default rollout length (see :class:`TrainingSettings` for all settings).
        num_mini_batch: Default.
        update_repeats: Default.
        recurrence: Default.
        max_grad_norm: Default.
        gamma: Default.
        use_gae: Default.
        gae_lambda: Default.
        advantage: Default.
        vtrace_rho_bar: Default.
        vtrace_c_bar: Default.
        vtrace_lambda: Default.
        advance_scene_rollout_period: Default.
        save_interval: Default.
        metric_accumulate_interval: Default.
        on_nonfinite: What a NaN or infinite loss or gradient norm does: ``error`` stops the
            run naming the loss term (the default), ``skip`` drops that optimisation step
            (counted as ``losses/nonfinite_skipped``, with a warning).
    """

    def __init__(
        self,
        *,
        named_losses: Mapping[str, Callable[..., Any]],
        stages: Sequence[PipelineStage],
        optimizer: Callable[..., torch.optim.Optimizer],
        lr_scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        total_env_steps: Annotated[int | None, Check(gt=0)] = None,
        num_steps: Annotated[int, Check(ge=1)] = 128,
        num_mini_batch: Annotated[int, Check(ge=1)] = 4,
        update_repeats: Annotated[int, Check(ge=1)] = 4,
        recurrence: Annotated[int, Check(ge=0)] = 0,
        max_grad_norm: Annotated[float, Check(gt=0)] = 0.5,
        gamma: Annotated[float, Check(ge=0, le=1)] = 0.99,
        use_gae: bool = True,
        gae_lambda: Annotated[float, Check(ge=0, le=1)] = 0.95,
        advantage: Annotated[str, Check(choices=ADVANTAGE_ESTIMATORS)] = "gae",
        vtrace_rho_bar: Annotated[float, Check(gt=0)] = 1.0,
        vtrace_c_bar: Annotated[float, Check(gt=0)] = 1.0,
        vtrace_lambda: Annotated[float, Check(ge=0, le=1)] = 1.0,
        advance_scene_rollout_period: Annotated[int | None, Check(ge=1)] = None,
        save_interval: Annotated[int, Check(ge=0)] = 0,
        metric_accumulate_interval: Annotated[int, Check(ge=0)] = 10_000,
        on_nonfinite: Annotated[str, Check(choices=NONFINITE_POLICIES)] = "error",
    ) -> None:
        if on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"pipeline.on_nonfinite: expected one of {', '.join(NONFINITE_POLICIES)}, "
                f"got {on_nonfinite!r}"
            )
        _check_advantage(advantage, "pipeline.advantage")
        self.on_nonfinite = on_nonfinite
        self.named_losses = dict(named_losses)
        self.stages = list(stages)
        if not self.stages:
            raise ValueError("a training pipeline needs at least one stage")
        for i, stage in enumerate(self.stages):
            names = list(stage.loss_names)
            if stage.offpolicy_component is not None:
                names += stage.offpolicy_component.loss_names
            unknown = [n for n in names if n not in self.named_losses]
            if unknown:
                raise ValueError(
                    f"pipeline.stages.{i}.loss_names: unknown loss name(s) {unknown}; "
                    f"pipeline.named_losses defines {sorted(self.named_losses)}"
                )
        _fill_open_budget(self.stages, total_env_steps)
        self.optimizer_builder = optimizer
        self.lr_scheduler_builder = lr_scheduler
        self.defaults = TrainingSettings.from_mapping(locals())
        missing = [
            k
            for k, v in dataclasses.asdict(self.defaults).items()
            if v is None and k not in _OPTIONAL_SETTINGS
        ]
        if missing:
            raise ValueError(f"pipeline settings must not be null: {missing}")
        self.current_stage_index = 0
        self.stage_steps = 0
        self.total_steps = 0
        self.rollout_count = 0

    @property
    def used_losses(self) -> dict[str, Any]:
        """The named losses some stage (or its off-policy component) optimises."""
        used: set[str] = set()
        for stage in self.stages:
            used.update(stage.loss_names)
            if stage.offpolicy_component is not None:
                used.update(stage.offpolicy_component.loss_names)
        return {name: loss for name, loss in self.named_losses.items() if name in used}

    # ---------------------------------------------------------------- position
    @property
    def finished(self) -> bool:
        """True once every stage has run."""
        return self.current_stage_index >= len(self.stages)

    @property
    def current_stage(self) -> PipelineStage:
        """The stage being trained."""
        if self.finished:
            raise RuntimeError("the training pipeline has finished; there is no current stage")
        return self.stages[self.current_stage_index]

    @property
    def current_settings(self) -> TrainingSettings:
        """The pipeline's settings overridden by the current stage's."""
        return self.settings_for(self.current_stage_index)

    def settings_for(self, stage_index: int) -> TrainingSettings:
        """Merged settings of stage ``stage_index``."""
        return self.defaults.overridden_by(self.stages[stage_index].training_settings)

    @property
    def total_max_steps(self) -> int:
        """Sum of the stages' budgets."""
        return sum(s.max_stage_steps for s in self.stages)

    @property
    def stage_remaining_steps(self) -> int:
        """Env steps left in the current stage's budget."""
        return self.current_stage.max_stage_steps - self.stage_steps

    def teacher_forcing_probability(self, extra_steps: int = 0) -> float:
        """Probability of taking the expert's action ``extra_steps`` env steps from now.

        The stage's schedule is a function of the env steps taken in the stage (0 when the
        stage has no teacher forcing).
        """
        tf = self.current_stage.teacher_forcing
        return 0.0 if tf is None else float(tf(self.stage_steps + extra_steps))

    def add_steps(self, env_steps: int) -> None:
        """Count ``env_steps`` env steps (one finished rollout) towards the current stage."""
        self.stage_steps += env_steps
        self.total_steps += env_steps
        self.rollout_count += 1

    def should_advance(self, training_metrics: Mapping[str, float]) -> bool:
        """True if the current stage's budget is spent or its criterion fires.

        Args:
            training_metrics: What the criterion judges: the values logged since its last check.
        """
        stage = self.current_stage
        if self.stage_steps >= stage.max_stage_steps:
            return True
        return bool(
            stage.early_stopping_criterion(
                stage_steps=self.stage_steps,
                total_steps=self.total_steps,
                training_metrics=training_metrics,
            )
        )

    def advance(self) -> None:
        """Move to the next stage."""
        self.current_stage_index += 1
        self.stage_steps = 0
        self.rollout_count = 0

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, int]:
        """Position of training (plain ints; safe for ``torch.load(weights_only=True)``)."""
        return {
            "current_stage_index": self.current_stage_index,
            "stage_steps": self.stage_steps,
            "total_steps": self.total_steps,
            "rollout_count": self.rollout_count,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        A finished pipeline whose budget has since been extended (a resume with a larger
        ``total_env_steps``) reopens its last stage at the matching stage step.
        """
        index = int(state["current_stage_index"])
        if not 0 <= index <= len(self.stages):
            raise ValueError(
                f"checkpoint stage index {index} but the pipeline has {len(self.stages)} stages"
            )
        self.current_stage_index = index
        self.stage_steps = int(state["stage_steps"])
        self.total_steps = int(state["total_steps"])
        self.rollout_count = int(state["rollout_count"])
        if self.finished and self.total_steps < self.total_max_steps:
            last = len(self.stages) - 1
            self.current_stage_index = last
            self.stage_steps = self.total_steps - sum(
                s.max_stage_steps for s in self.stages[:last]
            )
            log.info(
                "budget extended: stage %d continues at its env step %d", last, self.stage_steps
            )
