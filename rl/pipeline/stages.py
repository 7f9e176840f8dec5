"""Training pipelines as data: stages of named losses run in order (AllenAct's semantics).

Each :class:`PipelineStage` names its weighted losses and env-step budget and may override any
:class:`TrainingSettings`; the :class:`TrainingPipeline` holds the defaults and where training is.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import torch

from rl.pipeline.early_stopping import EarlyStoppingCriterion, NeverEarlyStoppingCriterion
from rl.pipeline.offpolicy import OffPolicyPipelineComponent
from rl.pipeline.schedules import Schedule
from rl.pipeline.verify import budget_errors, stage_errors
from rl.utils.config import Check, split_hint
from rl.utils.finite import as_count

log = logging.getLogger(__name__)

# rl.storage.AdvantageEstimator (that protocol lives above this layer).
AdvantageEstimator = Callable[..., Mapping[str, float]]
NONFINITE_POLICIES = ("error", "skip")  # TrainingPipeline's on_nonfinite
BEST_MODES = ("max", "min")  # TrainingPipeline's best_mode


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """Settings of the rollout/update loop: the one place each is declared, typed and ranged.

    :class:`TrainingPipeline` and :class:`PipelineStage` take these fields as keyword arguments
    with these annotations (what the config check reads); defaults live in ``conf/pipeline/``.

    Attributes:
        num_steps: Rollout length per environment (T).
        num_mini_batch: Minibatches per update epoch (split by sequence: see ``recurrence``).
        update_repeats: Update epochs over each rollout.
        recurrence: Truncated-BPTT length (Sample Factory's ``recurrence``): the update re-runs
            chunks of this many steps from the recurrent states stored at their starts. ``0``:
            whole rollouts from their first state (exact BPTT). Must divide ``num_steps``.
        max_grad_norm: Gradient-norm clipping threshold.
        gamma: Discount factor.
        advantage: An :class:`~rl.storage.AdvantageEstimator` built from its ``_target_``
            (``conf/pipeline/advantage/``: GAE, discounted returns, V-trace, or one's own).
        advance_scene_rollout_period: Every this many rollouts, ask the sampler to move its
            environments to their next scenes (None: never).
        save_interval: Save a checkpoint every this many env steps (0: only at stage ends).
        metric_accumulate_interval: Log every this many env steps.
    """

    num_steps: Annotated[int, Check(ge=1)]
    num_mini_batch: Annotated[int, Check(ge=1)]
    update_repeats: Annotated[int, Check(ge=1)]
    recurrence: Annotated[int, Check(ge=0)]
    max_grad_norm: Annotated[float, Check(gt=0)]
    gamma: Annotated[float, Check(ge=0, le=1)]
    advantage: AdvantageEstimator
    advance_scene_rollout_period: Annotated[int | None, Check(ge=1)] = None
    save_interval: Annotated[int, Check(ge=0)]
    metric_accumulate_interval: Annotated[int, Check(ge=0)]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainingSettings:
        """These settings with ``overrides`` (a stage's) replacing ours."""
        return dataclasses.replace(self, **overrides)


_SETTING_HINTS = typing.get_type_hints(TrainingSettings, include_extras=True)


def _checked(check: Check, value: Any, key: str) -> list[str]:
    problem = check.problem(value)
    return [] if problem is None else [f"{key}: {problem}"]


def _raise(errors: list[str]) -> None:
    if errors:
        raise ValueError("\n".join(errors))


def _problems(values: Mapping[str, Any], where: str) -> list[str]:
    """Range errors of settings values (their annotations' checks), each naming its key."""
    errors = [
        e
        for key, value in values.items()
        for check in split_hint(_SETTING_HINTS[key])[1]
        for e in _checked(check, value, f"{where}.{key}")
    ]
    advantage = values.get("advantage")
    if advantage is not None and not callable(advantage):
        errors.append(
            f"{where}.advantage: expected an advantage estimator (an object called as "
            "estimator(storage, model=..., next_value=..., gamma=...), built from a _target_ "
            f"such as rl.storage.GAE), got {type(advantage).__name__} {advantage!r}"
        )
    return errors


def _settings_signature(cls: type, *, optional: bool) -> type:
    """Show ``cls.__init__``'s ``**settings`` as one typed, ranged keyword per setting.

    The config check and the docs read the signature and annotations. ``optional``: every
    setting defaults to None (a stage's "unset").
    """
    init = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    hints = dict(typing.get_type_hints(init, include_extras=True))
    for field in dataclasses.fields(TrainingSettings):
        hint = _SETTING_HINTS[field.name]
        if optional:
            base, checks = split_hint(hint)
            hint = Annotated[(base | None, *checks)] if checks else base | None
        has_default = optional or field.default is not dataclasses.MISSING
        params.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if has_default else inspect.Parameter.empty,
                annotation=hint,
            )
        )
        hints[field.name] = hint
    init.__signature__ = signature.replace(parameters=params)
    init.__annotations__ = hints
    return cls


@functools.partial(_settings_signature, optional=True)
class PipelineStage:
    """One stage of a pipeline.

    Args:
        loss_names: Names of the losses (keys of the pipeline's ``named_losses``) to optimise.
        max_stage_steps: Budget of the stage in env steps over all environments; None (one
            stage at most): what the other stages leave of ``total_env_steps``.
        loss_weights: One weight per loss name (default: all 1).
        teacher_forcing: Schedule over the stage's env steps giving the probability that the
            expert's action is taken instead of the policy's (None: never).
        early_stopping_criterion: Ends the stage before its budget (None: never).
        offpolicy_component: Off-policy losses run after every rollout's update (None: none);
            with one, ``loss_names`` may be empty.
        **overrides: Any :class:`TrainingSettings` field; None or absent: the pipeline's.

    Raises:
        TypeError: An override that is not a training setting.
        ValueError: A stage without losses, weights that do not match, a value out of range.
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
        **overrides: Any,
    ) -> None:
        unknown = sorted(set(overrides) - set(TrainingSettings.names()))
        if unknown:
            raise TypeError(
                f"PipelineStage: {unknown} are not training settings "
                f"({', '.join(TrainingSettings.names())})"
            )
        self.overrides = {k: v for k, v in overrides.items() if v is not None}
        self.loss_names = list(loss_names)
        self.offpolicy_component = offpolicy_component
        component = None if offpolicy_component is None else offpolicy_component.loss_names
        _raise(
            stage_errors("pipeline stage", self.loss_names, loss_weights, component, None)
            + _checked(Check(gt=0), max_stage_steps, "pipeline stage.max_stage_steps")
            + _problems(self.overrides, "pipeline stage")
        )
        self.loss_weights = (
            [1.0] * len(self.loss_names) if loss_weights is None else list(loss_weights)
        )
        # None until the pipeline gives it the rest of its total (TrainingPipeline).
        self.max_stage_steps: int = None if max_stage_steps is None else int(max_stage_steps)  # type: ignore[assignment]
        self.teacher_forcing = teacher_forcing
        self.early_stopping_criterion = early_stopping_criterion or NeverEarlyStoppingCriterion()

    @property
    def weighted_losses(self) -> dict[str, float]:
        """``{loss_name: weight}`` for this stage."""
        return dict(zip(self.loss_names, self.loss_weights, strict=True))

    def __repr__(self) -> str:
        return (
            f"PipelineStage(loss_names={self.loss_names}, max_stage_steps={self.max_stage_steps},"
            f" overrides={self.overrides})"
        )


@functools.partial(_settings_signature, optional=False)
class TrainingPipeline:
    """Stages of training run in order, with named losses and default settings.

    Args:
        named_losses: Losses by name; stages refer to them by these names.
        stages: The stages, in order.
        optimizer: Builder of the optimizer, called as ``optimizer(params=...)`` (a Hydra
            ``_partial_``).
        lr_scheduler: Builder of the LR scheduler, called as ``lr_scheduler(optimizer=...)``
            (e.g. a partial ``LambdaLR`` over a ``LinearDecay``), stepped to the env-step count.
            None keeps the LR constant.
        total_env_steps: The run's budget: the stages' budgets must sum to it, and a stage
            without ``max_stage_steps`` gets what the others leave.
        on_nonfinite: What a NaN or infinite loss or gradient norm does: ``error`` stops the
            run naming the loss term, ``skip`` drops that optimisation step (counted as
            ``losses/nonfinite_skipped``, with a warning).
        compile: Run the policy's forward in the on-policy update through ``torch.compile``
            (:func:`~rl.training.learner.compiled_forward`); each new minibatch shape pays the
            compile time. False: eager.
        keep_last: Keep only the newest this many checkpoints, plus the best and any whose
            validation is pending (:mod:`rl.checkpoints.retention`); None or 0: keep all.
        best_metric: The metric marking the best checkpoint (``checkpoints/best``,
            ``best.json``): a ``valid/*`` metric, judged when its validation result arrives, or
            any logged one, its latest value at the save. None: no best is tracked.
        best_mode: ``max``: a higher ``best_metric`` is better; ``min``: a lower one.
        **settings: Every :class:`TrainingSettings` field (``advance_scene_rollout_period``
            may be left out): the stages' defaults.

    Raises:
        TypeError: A setting missing or unknown.
        ValueError: Unknown loss names, budgets that do not add up, a value out of range.
    """

    def __init__(
        self,
        *,
        named_losses: Mapping[str, Callable[..., Any]],
        stages: Sequence[PipelineStage],
        optimizer: Callable[..., torch.optim.Optimizer],
        lr_scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        total_env_steps: Annotated[int | None, Check(gt=0)] = None,
        on_nonfinite: Annotated[str, Check(choices=NONFINITE_POLICIES)] = "error",
        compile: bool = False,
        keep_last: Annotated[int | None, Check(ge=0)] = None,
        best_metric: str | None = None,
        best_mode: Annotated[str, Check(choices=BEST_MODES)] = "max",
        **settings: Any,
    ) -> None:
        missing = [
            f.name
            for f in dataclasses.fields(TrainingSettings)
            if settings.get(f.name) is None and f.default is dataclasses.MISSING
        ]
        unknown = sorted(set(settings) - set(TrainingSettings.names()))
        problems = []
        if missing:
            problems.append(f"settings missing (or null): {missing}")
        if unknown:
            problems.append(f"not training settings: {unknown}")
        if problems:
            raise TypeError("pipeline: " + "; ".join(problems))
        self.stages = list(stages)
        self.named_losses = dict(named_losses)
        errors = [] if self.stages else ["pipeline.stages: at least one stage is required"]
        for i, stage in enumerate(self.stages):
            component = stage.offpolicy_component
            errors += stage_errors(
                f"pipeline.stages.{i}",
                stage.loss_names,
                stage.loss_weights,
                None if component is None else component.loss_names,
                self.named_losses,
            )
        errors += budget_errors([s.max_stage_steps for s in self.stages], total_env_steps)
        errors += _problems(settings, "pipeline")
        errors += _checked(
            Check(choices=NONFINITE_POLICIES), on_nonfinite, "pipeline.on_nonfinite"
        )
        if not isinstance(compile, bool):
            errors.append(f"pipeline.compile: expected true or false, got {compile!r}")
        if keep_last is not None and type(keep_last) is not int:
            errors.append(f"pipeline.keep_last: expected an integer or null, got {keep_last!r}")
        else:
            errors += _checked(Check(ge=0), keep_last, "pipeline.keep_last")
        if best_metric is not None and (not isinstance(best_metric, str) or not best_metric):
            errors.append(f"pipeline.best_metric: expected a metric name, got {best_metric!r}")
        errors += _checked(Check(choices=BEST_MODES), best_mode, "pipeline.best_mode")
        if total_env_steps is None and any(s.max_stage_steps is None for s in self.stages):
            errors.append(
                "pipeline.stages: a stage leaves max_stage_steps unset (the rest of "
                "pipeline.total_env_steps), which is not set either"
            )
        _raise(errors)
        for stage in self.stages:  # the open budget (one at most) takes the rest
            if stage.max_stage_steps is None:
                given = sum(s.max_stage_steps for s in self.stages if s.max_stage_steps)
                stage.max_stage_steps = int(total_env_steps) - given
        self.on_nonfinite = on_nonfinite
        self.compile = compile
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.optimizer_builder = optimizer
        self.lr_scheduler_builder = lr_scheduler
        self.defaults = TrainingSettings(**settings)
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
        return self.defaults.with_overrides(self.stages[stage_index].overrides)

    @property
    def total_max_steps(self) -> int:
        """Sum of the stages' budgets."""
        return sum(s.max_stage_steps for s in self.stages)

    @property
    def stage_remaining_steps(self) -> int:
        """Env steps left in the current stage's budget."""
        return self.current_stage.max_stage_steps - self.stage_steps

    def add_steps(self, env_steps: int) -> None:
        """Count one finished rollout of ``env_steps`` env steps towards the current stage."""
        self.stage_steps += env_steps
        self.total_steps += env_steps
        self.rollout_count += 1

    def should_advance(self, training_metrics: Mapping[str, float]) -> bool:
        """True if the current stage's budget is spent or its criterion fires.

        Args:
            training_metrics: The values logged since the criterion's last check.
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
        counts: dict[str, int] = {}
        for key in ("current_stage_index", "stage_steps", "total_steps", "rollout_count"):
            count = as_count(state.get(key))
            if count is None:  # (the file may be anyone's: a bool, a float, a negative count)
                raise ValueError(f"checkpoint entry pipeline.{key}: expected an int >= 0")
            counts[key] = count
        index = counts["current_stage_index"]
        if index > len(self.stages):
            raise ValueError(
                f"checkpoint stage index {index} but the pipeline has {len(self.stages)} stages"
            )
        self.current_stage_index = index
        self.stage_steps, self.total_steps = counts["stage_steps"], counts["total_steps"]
        self.rollout_count = counts["rollout_count"]
        if self.finished and self.total_steps < self.total_max_steps:
            last = len(self.stages) - 1
            self.current_stage_index = last
            self.stage_steps = self.total_steps - sum(
                s.max_stage_steps for s in self.stages[:last]
            )
            log.info(
                "budget extended: stage %d continues at its env step %d", last, self.stage_steps
            )
