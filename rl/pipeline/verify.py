"""Checks of a pipeline config before anything is built (every problem, each naming its key)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl.utils.config import Check


def _stage_errors(pipe: Mapping[str, Any], i: int, num_envs: int) -> list[str]:
    stage = pipe["stages"][i]
    where = f"pipeline.stages.{i}"
    losses = pipe.get("named_losses") or {}
    component = stage.get("offpolicy_component") or {}
    named = [(f"{where}.loss_names", n) for n in stage.get("loss_names") or []]
    named += [
        (f"{where}.offpolicy_component.loss_names", n) for n in component.get("loss_names") or []
    ]
    errors = [
        f"{key}: no loss named {name!r} in pipeline.named_losses (defined: {sorted(losses)})"
        for key, name in named
        if name not in losses
    ]
    if not stage.get("loss_names") and not component:
        errors.append(
            f"{where}.loss_names: must name at least one loss "
            "(or the stage needs an offpolicy_component)"
        )
    weights = stage.get("loss_weights")
    if weights is not None and len(weights) != len(stage.get("loss_names") or []):
        errors.append(f"{where}.loss_weights: one weight per loss name is required")

    def setting(key: str) -> Any:
        return stage[key] if stage.get(key) is not None else pipe.get(key)

    # Ranges of single settings come from the constructors' annotations (check_targets).
    mb, steps, chunk = (setting(k) for k in ("num_mini_batch", "num_steps", "recurrence"))
    chunks = 1
    if isinstance(steps, int) and isinstance(chunk, int) and 0 < chunk < steps:
        if steps % chunk:
            errors.append(
                f"{where}.recurrence (or pipeline.recurrence)={chunk} does not divide num_steps="
                f"{steps}: the rollout is cut into BPTT chunks of equal length"
            )
        chunks = steps // chunk
    if isinstance(mb, int) and mb > num_envs * chunks:
        errors.append(
            f"{where}.num_mini_batch (or pipeline.num_mini_batch)={mb} > {num_envs * chunks} "
            f"sequences ({num_envs} environments x {chunks} BPTT chunks): minibatches are split "
            "by sequence, so at most one per sequence"
        )
    return errors


def pipeline_errors(
    pipe: Mapping[str, Any], *, num_envs: int, total_env_steps: int | None
) -> list[str]:
    """Problems of a resolved ``pipeline`` config.

    Args:
        pipe: The plain pipeline section (``named_losses``, ``stages``, default settings).
        num_envs: Environments of one worker (minibatches are split by environment).
        total_env_steps: The run's budget, which the stage budgets must sum to (None: skip).

    Returns:
        One message per problem: unknown loss names, stages without losses, weights that do
        not match, impossible rollout/minibatch settings, budgets that do not add up.
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
    unset = [i for i, b in enumerate(budgets) if b is None]
    given = [b for b in budgets if b is not None]
    if len(unset) > 1:
        errors.append(
            f"pipeline.stages {unset}: only one stage may leave max_stage_steps unset (it gets "
            "what the others leave of total_env_steps)"
        )
    elif isinstance(total_env_steps, int) and all(isinstance(b, int) for b in given):
        if unset and sum(given) >= total_env_steps:
            errors.append(
                f"pipeline.stages.{unset[0]}.max_stage_steps is unset (the rest of "
                f"total_env_steps), but the other stages take {sum(given):,} of "
                f"total_env_steps={total_env_steps:,}"
            )
        elif not unset and sum(given) != total_env_steps:
            errors.append(
                f"pipeline.stages.*.max_stage_steps sum to {sum(given):,} but total_env_steps "
                f"is {total_env_steps:,} (schedules run over total_env_steps: make them agree; "
                "write budgets as ${fraction_of_total:0.2} and leave the last stage's unset to "
                "follow total_env_steps)"
            )
    return errors
