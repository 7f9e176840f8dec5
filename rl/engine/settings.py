"""A training config's own keys, typed, and the check of the whole config before a run.

Each package checks its own section; one :class:`~rl.utils.config.ConfigError` lists every
problem. Defaults live in ``conf/train.yaml`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any

import torch

from rl.checkpoints.retention import retention_errors
from rl.collection.normalization import NormalizeSettings
from rl.distributed.settings import distributed_errors
from rl.evaluation.settings import evaluation_errors
from rl.pipeline.verify import pipeline_errors
from rl.sampling.base import MAX_NUM_ENVS
from rl.sampling.factory import sampler_num_envs
from rl.tasks.factory import FRAMEWORK_KEYS
from rl.tasks.gym import wrapper_errors
from rl.utils.config import (
    Check,
    ConfigError,
    check_targets,
    import_target,
    load_section,
    section_errors,
)

# Config groups every run composes (each a mapping with a `_target_` or sinks).
GROUPS = ("task", "model", "pipeline", "sampler", "collector", "logger")
# Sections of settings owned by other packages (`null` turns eval / valid / normalize off).
SECTIONS = ("eval", "valid", "distributed", "normalize")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The run's own keys (conf/train.yaml documents each)."""

    exp_name: str
    seed: Annotated[int, Check(ge=0, le=2**32 - 1)]  # (numpy's seeds are 32-bit)
    device: str
    torch_threads: Annotated[int | str | None, Check(ge=1, le=1024, words=("auto",))]
    total_env_steps: Annotated[int, Check(gt=0)]
    tags: list[str]
    output_dir: str
    optimized_metric: str | None
    resume: str | None
    init_from: str | None
    video_interval: Annotated[int | None, Check(ge=0)]
    deterministic: bool
    trusted_targets: list[str]
    callbacks: list[Any]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RunSettings:
        """The run's keys of a resolved training config."""
        return load_section(cls, _own_keys(cfg), "")


_RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunSettings))
TOP_LEVEL_KEYS = frozenset((*_RUN_KEYS, *GROUPS, *SECTIONS))


def _own_keys(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: cfg[k] for k in _RUN_KEYS if k in cfg}


def _collector_errors(cfg: Mapping[str, Any], num_envs: int | None) -> list[str]:
    """The collector class's ``config_errors(section, num_envs)``, and its DDP support."""
    try:
        target = import_target(str(cfg["collector"].get("_target_")))
    except Exception:  # noqa: BLE001  (check_targets reports it)
        return []
    collector = getattr(target, "__self__", target)  # a classmethod's class
    rules = getattr(collector, "config_errors", None)
    errors = rules(cfg["collector"], num_envs) if callable(rules) and num_envs else []
    distributed = cfg["distributed"]
    if not (isinstance(distributed, Mapping) and distributed.get("enabled") is True):
        return errors
    if getattr(collector, "supports_distributed", True):
        return errors
    return errors + [
        f"collector ({cfg['collector']['_target_']}) with distributed=ddp: this collector "
        "cannot run under DDP; use collector=local with DDP, or distributed=none"
    ]


def verify_train_cfg(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` listing every problem of a resolved training config."""
    errors = [
        f"{key}: unknown top-level key (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"
        for key in cfg
        if key not in TOP_LEVEL_KEYS and key != "hydra"
    ]
    errors += section_errors(RunSettings, _own_keys(cfg), "")
    errors += [
        f"{group}: missing config group (choose one, e.g. {group}=...)"
        for group in GROUPS
        if not isinstance(cfg.get(group), Mapping)
    ]
    errors += [f"{key}: missing (null turns it off)" for key in SECTIONS if key not in cfg]
    if errors:  # what follows reads these
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    if str(cfg["device"]).startswith("cuda") and not torch.cuda.is_available():
        errors.append(f"device: {cfg['device']!r} requested but CUDA is not available")
    errors += check_targets(
        {k: v for k, v in cfg.items() if k != "hydra"}, framework_keys={"task": FRAMEWORK_KEYS}
    )
    errors += wrapper_errors(cfg["task"])
    errors += [
        f"callbacks.{i}: expected a node naming its class ({{_target_: my_package.MyCallback}}), "
        f"got {node!r}"
        for i, node in enumerate(cfg.get("callbacks") or [])
        if not (isinstance(node, Mapping) and "_target_" in node)
    ]
    errors += evaluation_errors(cfg["eval"], cfg["valid"])
    errors += retention_errors(cfg["pipeline"], cfg["eval"], cfg["valid"])
    errors += distributed_errors(cfg["distributed"])
    if cfg["normalize"] is not None:
        errors += section_errors(NormalizeSettings, cfg["normalize"], "normalize")
    try:
        num_envs: int | None = sampler_num_envs(cfg["sampler"])
    except (TypeError, ValueError):  # (a num_envs of null: named above)
        num_envs = None
    errors += _collector_errors(cfg, num_envs)
    if num_envs is not None and num_envs < 1:
        errors.append(f"sampler: needs at least one environment, got {num_envs}")
    elif num_envs is not None and num_envs > MAX_NUM_ENVS:
        if not any(e.startswith("sampler.") for e in errors):  # (processes x environments)
            errors.append(f"sampler: {num_envs:,} environments; at most {MAX_NUM_ENVS:,}")
    if num_envs is None or not 1 <= num_envs <= MAX_NUM_ENVS:
        num_envs = MAX_NUM_ENVS  # (the minibatch check: no error that the above did not name)
    errors += pipeline_errors(
        cfg["pipeline"], num_envs=num_envs, total_env_steps=cfg["total_env_steps"]
    )
    errors += _task_swap_hint(errors)
    if errors:  # (once each: the optimizer's lr is checked by its annotation and by name)
        raise ConfigError("invalid config:\n  " + "\n  ".join(dict.fromkeys(errors)))


def _task_swap_hint(errors: list[str]) -> list[str]:
    """How to swap a whole task, when ``task._target_=...`` kept a preset's other keys."""
    unknown = [e.split(":", 1)[0].removeprefix("task.") for e in errors
               if e.startswith("task.") and ": unknown key for " in e]  # fmt: skip
    keys = [k for k in unknown if "." not in k]
    if not keys:
        return []
    drops = " ".join(f"~task.{k}" for k in keys)
    return [
        f"task: {', '.join(keys)} came with the composed task config, not with your _target_ "
        f"(changing task._target_ keeps the task's other keys): drop them ({drops}) or give "
        "your task a config of its own and choose it (task=<name>: conf/task/<name>.yaml, "
        "docs/howto/add-a-task.md)"
    ]
