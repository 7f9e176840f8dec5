"""What ``evaluate.py`` runs: checkpoints in bulk, an export, or the task's expert.

Every checkpoint is read and its config rebuilt before any is evaluated, so an unreadable one
fails the command instead of being skipped silently (as habitat-baselines' evaluation does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rl.checkpoints.files import (
    BEST,
    CHECKPOINT_DIR,
    LATEST,
    CheckpointError,
    checked_file_path,
    checkpoint_file,
    list_checkpoints,
    load_checkpoint,
    parse_checkpoint_name,
)
from rl.checkpoints.lock import RunLock
from rl.checkpoints.saved_config import rebuild_config
from rl.collection.episodes import EvalResult, EvalSampler, episode_seed_list, evaluate_policy
from rl.collection.normalization import Normalizer
from rl.evaluation.expert_reference import evaluate_expert_reference, load_expert_reference
from rl.evaluation.export import describe, export_checkpoint
from rl.evaluation.inference import load_trained_policy
from rl.evaluation.report import (
    eval_json_path,
    format_summary,
    plot_checkpoint_metrics,
    summary_stems,
    training_curve,
    write_eval_json,
    write_summary,
)
from rl.evaluation.settings import EvaluateSettings
from rl.models.policy import Policy
from rl.tasks.factory import TaskLayout, task_layout, with_split
from rl.utils.config import ConfigError, load_section
from rl.utils.files import GLOB_CHARS, glob_without_links, write_atomic
from rl.utils.finite import as_count
from rl.utils.threads import set_torch_threads

log = logging.getLogger(__name__)

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")
# What evaluation builds from a checkpoint's config (the rest is never built, so not judged).
BUILT_FOR_EVALUATION = ("task", "model")


# ----------------------------------------------------------------- which checkpoints
def is_glob(value: Any) -> bool:
    """Whether a ``ckpt=`` value is a glob; a path that exists is literal (``run[1]/x.pt``)."""
    if not value or not GLOB_CHARS & set(str(value)):
        return False
    return not os.path.lexists(os.path.expanduser(str(value)))


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file, the pipeline stage it was saved in and the env step."""

    path: Path
    stage: int
    step: int

    @property
    def run_dir(self) -> Path:
        """The run folder: the parent of ``checkpoints/``, else the file's folder."""
        parent = self.path.parent
        return parent.parent if parent.name == CHECKPOINT_DIR else parent


def checkpoint_ref(path: str | Path) -> CheckpointRef:
    """A checkpoint's stage and env step: from its name, else from its contents."""
    path = Path(path)
    parsed = parse_checkpoint_name(path)
    if parsed is not None:
        return CheckpointRef(path, parsed[0], parsed[1])
    pipe = load_checkpoint(path).get("pipeline")
    pipe = {} if pipe is None else pipe
    stage, steps = (
        as_count(pipe.get(key, 0)) if isinstance(pipe, dict) else None
        for key in ("current_stage_index", "total_steps")
    )
    if stage is None or steps is None:
        raise CheckpointError(f"{path}: its pipeline position is not a stage and a step count")
    return CheckpointRef(path, stage, steps)


def find_checkpoints(
    *, ckpt: str | None = None, run_dir: str | None = None
) -> list[CheckpointRef]:
    """The checkpoints named by ``ckpt`` or ``run_dir``, by run folder, each run in step order.

    Args:
        ckpt: A checkpoint file, a run's ``checkpoints/latest`` or ``checkpoints/best``
            pointer, or a glob of files (``**`` allowed).
        run_dir: A run folder: every checkpoint in its ``checkpoints/``.

    Raises:
        ConfigError: Neither or both are given.
        CheckpointError: Nothing matches, or a file needed for ordering is unreadable.
        UnsafePathError: A run's ``checkpoints`` is a link (another run's files) or not a folder.
    """
    if bool(ckpt) == bool(run_dir):
        raise ConfigError(
            "evaluate: set exactly one of ckpt=FILE_OR_GLOB (checkpoint files) or "
            f"run_dir=RUN_FOLDER (every checkpoint of a run); got ckpt={ckpt!r}, "
            f"run_dir={run_dir!r}"
        )
    if run_dir:
        paths = list_checkpoints(run_dir)
        if not paths:
            raise CheckpointError(f"no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}")
    elif is_glob(ckpt):
        found, links = glob_without_links(str(ckpt))
        if links:
            log.warning(
                "ckpt=%r: %d link(s) below the pattern's folder skipped, never followed (a "
                "link could lead out of the folder; name a linked run's files directly): %s",
                ckpt,
                len(links),
                ", ".join(map(str, links[:5])) + (", ..." if len(links) > 5 else ""),
            )
        paths = [
            checked_file_path(p) for p in found if p.suffix in CHECKPOINT_SUFFIXES and p.is_file()
        ]
        if not paths:
            raise CheckpointError(
                f"no checkpoint file ({'/'.join(CHECKPOINT_SUFFIXES)}) matches ckpt={ckpt!r}"
            )
    else:
        path = Path(str(ckpt)).expanduser()
        in_run = path.parent.name == CHECKPOINT_DIR
        pointer = path.name in (LATEST, BEST) and in_run  # (any kind: ignored)
        if path.is_dir() and not pointer:
            raise ConfigError(
                f"ckpt={ckpt!r} is a folder; for every checkpoint of a run use run_dir="
            )
        path = checkpoint_file(path)  # (the run's latest / best pointer: what it names)
        if not path.is_file():  # (a FIFO is never opened: it could block)
            problem = "is not a regular file" if os.path.lexists(path) else "does not exist"
            raise CheckpointError(f"checkpoint {path} {problem}")
        paths = [path]
    refs = [checkpoint_ref(p) for p in paths]
    return sorted(refs, key=lambda r: (str(r.run_dir), r.step, r.stage, r.path.name))


def thin_by_steps(refs: Sequence[CheckpointRef], every_steps: int) -> list[CheckpointRef]:
    """Keep checkpoints at least ``every_steps`` env steps apart (0: all), per run folder.

    A run's first and last checkpoints are always kept; ``refs`` in run, then step order.
    """
    if every_steps < 0:
        raise ConfigError(f"every_steps: must be >= 0, got {every_steps}")
    if every_steps == 0:
        return list(refs)
    kept: list[CheckpointRef] = []
    for i, ref in enumerate(refs):
        last_of_run = i + 1 == len(refs) or refs[i + 1].run_dir != ref.run_dir
        first_of_run = not kept or kept[-1].run_dir != ref.run_dir
        if first_of_run or last_of_run or ref.step - kept[-1].step >= every_steps:
            kept.append(ref)
    return kept


# ----------------------------------------------------------------- evaluation
class _ModelCache:
    """Rebuilt configs by checkpoint, one model per distinct (model, task) config."""

    def __init__(self, device: torch.device, trusted_targets: Sequence[str]) -> None:
        self.device = device
        self.trusted_targets = list(trusted_targets)
        self._configs: dict[Path, dict[str, Any]] = {}
        self._rebuilt: dict[str, dict[str, Any]] = {}
        self._models: dict[str, Policy] = {}
        self._layouts: dict[str, TaskLayout] = {}

    def config(self, ref: CheckpointRef, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint's training config, rebuilt on the user's config tree."""
        if ref.path not in self._configs:
            state = state or load_checkpoint(ref.path)
            key = json.dumps([state["config"], state["choices"]], sort_keys=True)
            if key not in self._rebuilt:
                self._rebuilt[key] = rebuild_config(
                    state["config"],
                    state["choices"],
                    str(ref.path),
                    trusted_targets=self.trusted_targets,
                    built=BUILT_FOR_EVALUATION,
                    sources=state["config_sources"],
                ).config
            self._configs[ref.path] = self._rebuilt[key]
        return self._configs[ref.path]

    def load(self, ref: CheckpointRef) -> tuple[Policy, dict[str, Any], Normalizer | None]:
        """The checkpoint's policy, its training config and its normalisation (frozen)."""
        state = load_checkpoint(ref.path, map_location=self.device)
        train_cfg = self.config(ref, state)
        key = json.dumps([train_cfg["model"], train_cfg["task"]], sort_keys=True, default=str)
        if key not in self._layouts:  # (spaces read once per distinct task)
            self._layouts[key] = task_layout(train_cfg["task"])
        layout = self._layouts[key]
        model, normalizer = load_trained_policy(
            state, ref.path, layout.spaces,
            model=self._models.get(key), model_config=train_cfg["model"], device=self.device,
            groups=layout.groups,
        )  # fmt: skip
        self._models[key] = model
        return model, train_cfg, normalizer


def evaluate_checkpoints(cfg: EvaluateSettings) -> dict[str, float]:
    """Evaluate the selected checkpoints; return the last one's metrics as ``eval/*``."""
    refs = find_checkpoints(ckpt=cfg.ckpt, run_dir=cfg.run_dir)
    selected = thin_by_steps(refs, cfg.every_steps)
    if len(selected) < len(refs):
        log.info(
            "every_steps=%s: evaluating %d of %d checkpoints",
            cfg.every_steps,
            len(selected),
            len(refs),
        )
    models = _ModelCache(torch.device(cfg.device), cfg.trusted_targets)
    for ref in selected:  # every one readable, its config rebuilt, before any is evaluated
        eval_sampler(ref, models.config(ref), cfg.device)
    if cfg.deterministic is None:  # as the runs evaluated while they trained
        cfg = dataclasses.replace(cfg, deterministic=_as_trained(selected, models))
    with contextlib.ExitStack() as stack:
        # Results are written into the run folders: no trainer may be writing there meanwhile.
        for folder in sorted({ref.run_dir for ref in selected}):
            stack.enter_context(RunLock(folder, "evaluation"))
        return _evaluate_selected(cfg, refs, selected, models)


def eval_sampler(ref: CheckpointRef, train_cfg: Mapping[str, Any], device: str) -> EvalSampler:
    """The checkpoint's run's sampler (``batched``, its environments on ``device``), else serial.

    Raises:
        ConfigError: The saved sampler settings are out of range (the checkpoint named).
    """
    try:
        return EvalSampler.of_run(train_cfg.get("sampler"), device=device)
    except ConfigError as e:
        raise ConfigError(f"{ref.path}: {e}") from e


def _as_trained(selected: Sequence[CheckpointRef], models: _ModelCache) -> bool:
    """The ``eval.deterministic`` the selected checkpoints' runs trained with (one for all)."""
    modes = {
        ref.run_dir: bool((models.config(ref).get("eval") or {}).get("deterministic", False))
        for ref in selected
    }
    if len(set(modes.values())) > 1:
        raise ConfigError(
            "deterministic: the selected runs evaluated with argmax and with sampled actions "
            f"while training ({', '.join(f'{d}: {m}' for d, m in sorted(modes.items()))}); "
            "set deterministic=true or deterministic=false"
        )
    mode = next(iter(modes.values()), False)
    log.info("deterministic=%s: as the run evaluated while training (eval.deterministic)", mode)
    return mode


def _evaluate_selected(
    cfg: EvaluateSettings,
    refs: Sequence[CheckpointRef],
    selected: Sequence[CheckpointRef],
    models: _ModelCache,
) -> dict[str, float]:
    assert cfg.deterministic is not None  # (the caller resolved it: as the runs trained)
    device = torch.device(cfg.device)
    episode_seeds = episode_seed_list(cfg.num_episodes, cfg.episode_seed)
    settings = cfg.episode_list
    rows_by_run: dict[Path, list[dict[str, Any]]] = {}
    logged: dict[str, float] = {}
    bar = tqdm(
        selected,
        desc="checkpoints",
        unit="ckpt",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if cfg.progress_bar is None else not cfg.progress_bar,
    )
    for ref in bar:
        bar.set_postfix_str(ref.path.name, refresh=True)
        model, train_cfg, normalizer = models.load(ref)
        sampler = eval_sampler(ref, train_cfg, cfg.device)
        if ref.run_dir not in rows_by_run:  # (its first checkpoint)
            log.info("%s: %d environments through the %s", ref.run_dir,
                     min(cfg.num_envs, cfg.num_episodes), sampler.describe())  # fmt: skip
        result = evaluate_policy(
            model=model,
            task=with_split(train_cfg["task"], cfg.split),
            episode_seeds=episode_seeds,
            num_envs=cfg.num_envs,
            deterministic=cfg.deterministic,
            action_seed=cfg.action_seed,
            device=device,
            normalizer=normalizer,
            sampler=sampler,
        )
        write_eval_json(
            eval_json_path(ref.path, settings),
            result,
            {**settings, "checkpoint": str(ref.path), "step": ref.step, "stage": ref.stage},
        )
        rows_by_run.setdefault(ref.run_dir, []).append(_summary_row(ref, result))
        logged = result.as_logged("eval")
    bar.close()

    mode = "argmax" if cfg.deterministic else "sampled"
    single_file = len(refs) == 1 and not cfg.run_dir and not is_glob(cfg.ckpt)
    for run_dir, rows in rows_by_run.items():
        expert = load_expert_reference(run_dir, settings)
        title = f"{run_dir} ({cfg.num_episodes} episodes, {mode} actions)"
        print(format_summary(rows, title, expert))
        if single_file:
            print(f"wrote {eval_json_path(selected[0].path, settings)}")
            continue
        csv_path, json_path = write_summary(run_dir, rows, settings, expert)
        name = eval_json_path(Path("<checkpoint>.pt"), settings).name
        print(f"wrote {len(rows)} {name} files, {csv_path}, {json_path}")
        if cfg.plot:
            own, latest = summary_stems(settings)
            png = plot_checkpoint_metrics(
                rows,
                run_dir / f"{own}.png",
                title=f"{run_dir} ({mode} actions)",
                expert=expert,
                training=training_curve(run_dir / "metrics.jsonl"),
            )
            if png is not None:
                write_atomic(run_dir / f"{latest}.png", png.read_bytes(), what="evaluation plot")
                print(f"wrote {png} (and {latest}.png)")
    return logged


def _summary_row(ref: CheckpointRef, result: EvalResult) -> dict[str, Any]:
    return {"checkpoint": ref.path.name, "step": ref.step, "stage": ref.stage, **result.metrics}


# ----------------------------------------------------------------- evaluate.py
def export_from_settings(cfg: EvaluateSettings) -> dict[str, float]:
    """``export=onnx|pt2``: one checkpoint's policy written for use without the framework."""
    if cfg.test_expert:
        raise ConfigError("export: exports a checkpoint's policy; test_expert=true has none")
    source = cfg.ckpt or cfg.run_dir
    if source is None:
        raise ConfigError("export: give the checkpoint, ckpt=FILE (or its run: run_dir=RUN)")
    if cfg.ckpt and is_glob(cfg.ckpt):
        raise ConfigError(f"export: exports one checkpoint, ckpt={cfg.ckpt!r} is a glob")
    info = export_checkpoint(
        source,
        cfg.export,  # type: ignore[arg-type]
        cfg.export_path,
        trusted_targets=cfg.trusted_targets,
    )
    print(describe(info))
    return {"export/checked_observations": float(info.checked_observations)}


def evaluate_from_config(cfg: Mapping[str, Any]) -> dict[str, float]:
    """What ``evaluate.py`` runs: checkpoints, an export or the expert.

    ``cfg`` is the plain conf/evaluate.yaml config; ``task`` is there only when a task was chosen
    (``task=NAME``, for ``test_expert``).

    Raises:
        ConfigError: A key is unknown, missing, mistyped or out of range (each named).
    """
    task = cfg.get("task")
    if cfg.get("export") == "torchscript":
        raise ConfigError(
            "export=torchscript: torch.jit is deprecated in the torch this project pins; "
            "export=pt2 writes its successor, a torch.export program "
            "(torch.export.load(path).module()), and export=onnx an ONNX file"
        )
    settings = load_section(EvaluateSettings, {k: v for k, v in cfg.items() if k != "task"}, "")
    set_torch_threads(settings.torch_threads, settings.device)
    if settings.export is not None:
        return export_from_settings(settings)
    if settings.test_expert:
        folder = None
        if settings.run_dir:  # (resolved: the user may reach it through a link)
            folder = Path(settings.run_dir).expanduser().resolve()
        elif settings.ckpt:
            folder = find_checkpoints(ckpt=settings.ckpt)[0].run_dir
        return evaluate_expert_reference(settings, folder, task)
    if task:
        raise ConfigError(
            "task=... is only used with test_expert=true; checkpoints are evaluated on the task "
            "saved in them"
        )
    return evaluate_checkpoints(settings)
