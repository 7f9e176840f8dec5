"""Checks of a pipeline config before anything is built (every problem, each naming its key)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rl.utils.config import Check


# The cross-field rules, over plain values: both the config check (pipeline_errors) and the
# constructors (rl.pipeline.stages) apply them.
def stage_errors(
    where: str,
    loss_names: Sequence[str],
    loss_weights: Sequence[float] | None,
    component_loss_names: Sequence[str] | None,
    known_losses: Collection[str] | None,
) -> list[str]:
    """A stage's losses: named, known (``known_losses``, None: not checked), one weight each."""
    named = [(f"{where}.loss_names", n) for n in loss_names]
    named += [(f"{where}.offpolicy_component.loss_names", n) for n in component_loss_names or ()]
    errors = [
        f"{key}: no loss named {name!r} in pipeline.named_losses (defined: {sorted(known_losses)})"
        for key, name in named
        if known_losses is not None and name not in known_losses
    ]
    if not loss_names and component_loss_names is None:
        errors.append(
            f"{where}.loss_names: must name at least one loss "
            "(or the stage needs an offpolicy_component)"
        )
    if loss_weights is not None and len(loss_weights) != len(loss_names):
        errors.append(
            f"{where}.loss_weights: one weight per loss name is required ({len(loss_weights)} "
            f"for {len(loss_names)})"
        )
    return errors


def budget_errors(budgets: Sequence[int | None], total_env_steps: int | None) -> list[str]:
    """The stages' budgets against the run's: one may be open (the rest), else they sum to it."""
    unset = [i for i, b in enumerate(budgets) if b is None]
    given = [b for b in budgets if b is not None]
    if len(unset) > 1:
        return [
            f"pipeline.stages {unset}: only one stage may leave max_stage_steps unset (it gets "
            "what the others leave of total_env_steps)"
        ]
    if not (isinstance(total_env_steps, int) and all(isinstance(b, int) for b in given)):
        return []
    if unset and sum(given) >= total_env_steps:
        return [
            f"pipeline.stages.{unset[0]}.max_stage_steps is unset (the rest of "
            f"total_env_steps), but the other stages take {sum(given):,} of "
            f"total_env_steps={total_env_steps:,}"
        ]
    if not unset and sum(given) != total_env_steps:
        return [
            f"pipeline.stages.*.max_stage_steps sum to {sum(given):,} but total_env_steps "
            f"is {total_env_steps:,} (schedules run over total_env_steps: make them agree; "
            "write budgets as ${fraction_of_total:0.2} and leave the last stage's unset to "
            "follow total_env_steps)"
        ]
    return []


def sequence_errors(
    where: str, num_steps: Any, recurrence: Any, num_mini_batch: Any, num_envs: int
) -> list[str]:
    """Rollouts cut into equal BPTT chunks, and at most one minibatch per sequence."""
    errors = []
    chunks = 1
    if isinstance(num_steps, int) and isinstance(recurrence, int) and 0 < recurrence < num_steps:
        if num_steps % recurrence:
            errors.append(
                f"{where}.recurrence (or pipeline.recurrence)={recurrence} does not divide "
                f"num_steps={num_steps}: the rollout is cut into BPTT chunks of equal length"
            )
        chunks = num_steps // recurrence
    if isinstance(num_mini_batch, int) and num_mini_batch > num_envs * chunks:
        errors.append(
            f"{where}.num_mini_batch (or pipeline.num_mini_batch)={num_mini_batch} > "
            f"{num_envs * chunks} sequences ({num_envs} environments x {chunks} BPTT chunks): "
            "minibatches are split by sequence, so at most one per sequence"
        )
    return errors


def _stage_errors(pipe: Mapping[str, Any], i: int, num_envs: int) -> list[str]:
    stage = pipe["stages"][i]
    where = f"pipeline.stages.{i}"
    component = stage.get("offpolicy_component")
    errors = stage_errors(
        where,
        stage.get("loss_names") or [],
        stage.get("loss_weights"),
        None if not component else component.get("loss_names") or [],
        pipe.get("named_losses") or {},
    )

    def setting(key: str) -> Any:
        return stage[key] if stage.get(key) is not None else pipe.get(key)

    # Ranges of single settings come from the constructors' annotations (check_targets).
    return errors + sequence_errors(
        where, setting("num_steps"), setting("recurrence"), setting("num_mini_batch"), num_envs
    )


def pipeline_errors(
    pipe: Mapping[str, Any], *, num_envs: int, total_env_steps: int | None
) -> list[str]:
    """One message per problem of a resolved, plain ``pipeline`` config.

    Args:
        pipe: The ``pipeline`` config.
        num_envs: Environments of one worker (minibatches are split by environment).
        total_env_steps: The run's budget, which the stages' must sum to (None: not checked).
    """
    stages = pipe.get("stages") or []
    if not stages:
        return ["pipeline.stages: at least one stage is required"]
    errors = [e for i in range(len(stages)) for e in _stage_errors(pipe, i, num_envs)]
    optimizer = pipe.get("optimizer") or {}
    for key, check in (("lr", Check(gt=0)), ("eps", Check(ge=0)), ("weight_decay", Check(ge=0))):
        problem = check.problem(optimizer.get(key))
        if problem is not None:
            errors.append(f"pipeline.optimizer.{key}: {problem}")
    budgets = [st.get("max_stage_steps") for st in stages]
    errors += budget_errors(budgets, total_env_steps)
    return errors
