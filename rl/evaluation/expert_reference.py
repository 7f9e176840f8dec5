"""The task's expert on the evaluation episodes: ``evaluate.py test_expert=true``.

The expert (``info["expert_action"]``, the shortest-path action on PointNav) runs the same
fixed episode list as the checkpoints; its result, ``<run>/expert.eval.json``, is the reference
row and dashed line of later summaries and plots of that run on the same episodes. The task
comes from ``task=NAME`` or from the run, whose folder is untrusted input: read as bounded data
(:mod:`rl.checkpoints.saved_config`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rl.checkpoints.config_tree import ordered_choices, saved_choices
from rl.checkpoints.files import CheckpointError, list_checkpoints, load_checkpoint
from rl.checkpoints.lock import RunLock
from rl.checkpoints.saved_config import config_data, rebuild_config
from rl.collection.episodes import episode_seed_list, evaluate_expert
from rl.evaluation.report import format_table, write_eval_json
from rl.evaluation.selection import find_checkpoints
from rl.evaluation.settings import EvaluateSettings
from rl.tasks.factory import with_split
from rl.utils.config import ConfigError
from rl.utils.files import read_regular_file

__all__ = ["EXPERT_NAME", "evaluate_expert_reference", "load_expert_reference"]

log = logging.getLogger(__name__)

EXPERT_NAME = "expert.eval.json"


def load_expert_reference(folder: Path, settings: Mapping[str, Any]) -> dict[str, float] | None:
    """Mean metrics of ``folder/expert.eval.json`` if it ran on the same episode list."""
    path = folder / EXPERT_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        seeds = [e["episode_seed"] for e in data["episodes"]]
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable expert reference %s", path)
        return None
    if seeds != episode_seed_list(int(settings["num_episodes"]), int(settings["episode_seed"])):
        return None
    return {k: float(v) for k, v in data["metrics"].items()}


# The most of a run folder's config.yaml / .hydra/hydra.yaml read (a real one is a few KB).
_MAX_CONFIG_BYTES = 4 * 2**20


def _folder_yaml(path: Path) -> Any:
    """A run folder's YAML file as bounded data (None: missing, a link, not a regular file)."""
    raw = read_regular_file(path, _MAX_CONFIG_BYTES + 1)
    if raw is None:
        return None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: larger than {_MAX_CONFIG_BYTES:,} bytes; refused")
    try:
        return config_data(yaml.safe_load(raw), str(path))
    except yaml.YAMLError as e:
        raise CheckpointError(f"{path}: not YAML: {str(e).splitlines()[0]}") from e


def _hydra_choices(hydra: Any) -> Any:
    """The ordered config group choices of a ``.hydra/hydra.yaml``'s ``hydra`` node (data)."""
    if not isinstance(hydra, dict):
        return None
    runtime, overrides = hydra.get("runtime"), hydra.get("overrides")
    return ordered_choices(
        runtime.get("choices") if isinstance(runtime, dict) else None,
        overrides.get("task") if isinstance(overrides, dict) else None,
    )


def _task_of_run(run_dir: Path, trusted_targets: Sequence[str]) -> dict[str, Any]:
    """The task a run trained on, rebuilt on the user's config tree.

    From its newest checkpoint, else (no checkpoint yet) from its ``config.yaml`` with the
    choices of Hydra's ``.hydra/hydra.yaml`` beside it. Both are untrusted input (a run folder
    may come from anywhere): read as bounded data (:mod:`rl.checkpoints.saved_config`).
    """
    found = list_checkpoints(run_dir)
    if found:
        state = load_checkpoint(found[-1])
        config, choices, where = state["config"], state["choices"], str(found[-1])
    else:
        config = _folder_yaml(run_dir / "config.yaml")
        if not isinstance(config, dict):
            raise CheckpointError(
                f"{run_dir}: no checkpoint and no config.yaml to take a task from"
            )
        where = str(run_dir / "config.yaml")
        hydra = _folder_yaml(run_dir / ".hydra" / "hydra.yaml")
        hydra = hydra.get("hydra") if isinstance(hydra, dict) else None
        choices = saved_choices(_hydra_choices(hydra), where)
    rebuilt = rebuild_config(
        config, choices, where, trusted_targets=trusted_targets, built=("task",)
    )
    return dict(rebuilt.config["task"])


def evaluate_expert_reference(
    cfg: EvaluateSettings, task: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """``test_expert=true``: run the task's expert on the evaluation episode list.

    The task comes from ``task`` (``task=NAME``, a config group choice) if given, else from the run
    (``run_dir``, or the first checkpoint matched by ``ckpt``). Results go to
    ``<run>/expert.eval.json`` (or ``<output_dir>/expert.eval.json`` without a run), where
    later checkpoint summaries and plots pick them up as the reference.

    Returns:
        The expert's mean metrics as ``expert/*``.

    Raises:
        ConfigError: If no task can be found.
        NoExpertError: If the task has no expert.
    """
    folder: Path | None = None
    if cfg.run_dir:
        folder = Path(cfg.run_dir)
    elif cfg.ckpt:
        folder = find_checkpoints(ckpt=cfg.ckpt)[0].run_dir
    if task:
        task = dict(task)
    elif folder is not None:
        task = _task_of_run(folder, cfg.trusted_targets)
    else:
        raise ConfigError(
            "test_expert=true needs a task: run_dir=RUN_FOLDER, ckpt=FILE or task=NAME "
            "(a conf/task option)"
        )
    task = with_split(task, cfg.split)
    if folder is None:
        folder = Path(cfg.output_dir)
    with RunLock(folder, "evaluation"):
        return _evaluate_expert_into(cfg, task, folder)


def _evaluate_expert_into(
    cfg: EvaluateSettings, task: dict[str, Any], folder: Path
) -> dict[str, float]:
    """Run the expert on the evaluation episodes; write ``folder/expert.eval.json``."""
    episode_seeds = episode_seed_list(cfg.num_episodes, cfg.episode_seed)
    result = evaluate_expert(task=task, episode_seeds=episode_seeds, num_envs=cfg.num_envs)
    out = folder / EXPERT_NAME
    settings = {
        "num_episodes": cfg.num_episodes,
        "episode_seed": cfg.episode_seed,
        "expert": True,
        "task": task,
    }
    write_eval_json(out, result, settings)
    logged = result.as_logged("expert")
    print(
        format_table(logged, f"expert on {task.get('_target_')} ({len(episode_seeds)} episodes)")
    )
    print(f"wrote {out}")
    return logged
