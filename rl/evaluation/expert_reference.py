"""The task's expert on the evaluation episodes (``evaluate.py test_expert=true``).

Its result, ``<run>/expert.eval.json``, is the reference row and dashed line of the run's later
summaries and plots on the same episodes. A run folder may come from anywhere: what is read of it
is bounded data (:mod:`rl.checkpoints.saved_config`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rl.checkpoints.config_tree import ordered_choices, saved_choices
from rl.checkpoints.files import CheckpointError, list_checkpoints, load_checkpoint
from rl.checkpoints.lock import RunLock
from rl.checkpoints.saved_config import config_data, rebuild_config
from rl.collection.episodes import EvalSampler, episode_seed_list, evaluate_expert
from rl.evaluation.report import format_table, write_eval_json
from rl.evaluation.settings import EvaluateSettings
from rl.tasks.factory import with_split
from rl.utils.config import ConfigError
from rl.utils.files import load_yaml_data, read_regular_file

log = logging.getLogger(__name__)

EXPERT_NAME = "expert.eval.json"
# Read limits: a real expert.eval.json has ~250 bytes an episode, a config.yaml or hydra.yaml a
# few KB, a run's overrides a few dozen entries.
_MAX_EXPERT_BYTES = 64 * 2**20
_MAX_CONFIG_BYTES = 4 * 2**20
_MAX_OVERRIDES = 1_000


def load_expert_reference(folder: Path, settings: Mapping[str, Any]) -> dict[str, float] | None:
    """Mean metrics of ``folder/expert.eval.json`` if it ran on the same episode list.

    Only a regular file is read; one that is not a reference of numbers is ignored, with a warning.
    """
    path = folder / EXPERT_NAME
    raw = read_regular_file(path, _MAX_EXPERT_BYTES + 1)
    if raw is None:
        return None
    try:
        if len(raw) > _MAX_EXPERT_BYTES:
            raise ValueError(f"larger than {_MAX_EXPERT_BYTES:,} bytes")
        data = json.loads(raw)
        seeds = [e["episode_seed"] for e in data["episodes"]]
        metrics = {str(k): float(v) for k, v in data["metrics"].items()}
        if not all(map(math.isfinite, metrics.values())):
            raise ValueError("a metric that is not a finite number")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as e:
        log.warning("ignoring unreadable expert reference %s (%s)", path, type(e).__name__)
        return None
    if seeds != episode_seed_list(int(settings["num_episodes"]), int(settings["episode_seed"])):
        return None
    return metrics


def _folder_yaml(path: Path) -> Any:
    """A run folder's YAML file, parsed but unchecked (None: missing, a link, not a regular file).

    What is used of it goes through :func:`~rl.checkpoints.saved_config.config_data`.
    """
    raw = read_regular_file(path, _MAX_CONFIG_BYTES + 1)
    if raw is None:
        return None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: larger than {_MAX_CONFIG_BYTES:,} bytes; refused")
    try:
        return load_yaml_data(raw)
    except yaml.YAMLError as e:
        raise CheckpointError(f"{path}: refused: {str(e).splitlines()[0]}") from e


def _hydra_choices(path: Path) -> Any:
    """The ordered group choices of a run's ``.hydra/hydra.yaml`` (None: none).

    Only ``hydra.runtime.choices`` and the keys of ``hydra.overrides.task`` are read, as data.
    """
    hydra = _folder_yaml(path)
    hydra = hydra.get("hydra") if isinstance(hydra, dict) else None
    if not isinstance(hydra, dict):
        return None
    runtime, overrides = hydra.get("runtime"), hydra.get("overrides")
    choices = runtime.get("choices") if isinstance(runtime, dict) else None
    typed = overrides.get("task") if isinstance(overrides, dict) else None
    typed = typed[:_MAX_OVERRIDES] if isinstance(typed, list) else []
    keys = [o.split("=", 1)[0] for o in typed if isinstance(o, str)]
    return ordered_choices(config_data(choices, str(path)), config_data(keys, str(path)))


def _task_of_run(run_dir: Path, trusted_targets: Sequence[str]) -> tuple[dict[str, Any], Any]:
    """A run's task, rebuilt on the user's config tree, and its sampler config.

    From its newest checkpoint, else from its ``config.yaml`` and ``.hydra/hydra.yaml``.
    """
    found = list_checkpoints(run_dir)
    if found:
        state = load_checkpoint(found[-1])
        config, choices, where = state["config"], state["choices"], str(found[-1])
        sources = state["config_sources"]
    else:
        config = _folder_yaml(run_dir / "config.yaml")
        config = None if config is None else config_data(config, str(run_dir / "config.yaml"))
        if not isinstance(config, dict):
            raise CheckpointError(
                f"{run_dir}: no checkpoint and no config.yaml to take a task from"
            )
        where = str(run_dir / "config.yaml")
        choices = saved_choices(_hydra_choices(run_dir / ".hydra" / "hydra.yaml"), where)
        sources = None
    rebuilt = rebuild_config(
        config, choices, where, trusted_targets=trusted_targets, built=("task",), sources=sources
    )  # (the sampler config is read as data: EvalSampler.of_run builds nothing it names)
    return dict(rebuilt.config["task"]), rebuilt.config.get("sampler")


def evaluate_expert_reference(
    cfg: EvaluateSettings, folder: Path | None, task: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Run the task's expert on the evaluation episodes; return its metrics as ``expert/*``.

    Args:
        cfg: The evaluation settings.
        folder: The run (``run_dir``, or the first checkpoint's of ``ckpt``); its task is used
            unless ``task`` is given, and the result goes there (else to ``output_dir``).
        task: ``task=NAME``'s config.

    Raises:
        ConfigError: No task was given and there is no run.
        NoExpertError: The task has no expert.
    """
    sampler = EvalSampler.serial()  # (a task=NAME of no run: serially)
    if task:
        task = dict(task)
    elif folder is not None:
        task, run_sampler = _task_of_run(folder, cfg.trusted_targets)
        sampler = EvalSampler.of_run(run_sampler, device=cfg.device)
    else:
        raise ConfigError(
            "test_expert=true needs a task: run_dir=RUN_FOLDER, ckpt=FILE or task=NAME "
            "(a conf/task option)"
        )
    task = with_split(task, cfg.split)
    if folder is None:
        folder = Path(cfg.output_dir).resolve()
    episode_seeds = episode_seed_list(cfg.num_episodes, cfg.episode_seed)
    out = folder / EXPERT_NAME
    with RunLock(folder, "evaluation"):
        result = evaluate_expert(
            task=task, episode_seeds=episode_seeds, num_envs=cfg.num_envs, sampler=sampler
        )
        settings = {"num_episodes": cfg.num_episodes, "episode_seed": cfg.episode_seed}
        write_eval_json(out, result, {**settings, "expert": True, "task": task})
    logged = result.as_logged("expert")
    print(
        format_table(logged, f"expert on {task.get('_target_')} ({len(episode_seeds)} episodes)")
    )
    print(f"wrote {out}")
    return logged
