"""The composition root: the only code that sees the whole config.

``train.py`` and ``evaluate.py`` call :func:`train` and :func:`evaluate`; nothing in ``rl/``
imports this module. Each part of a run is built from its own config section here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra.utils
import torch
import yaml
from omegaconf import DictConfig

from rl.checkpoints.config_tree import run_choices
from rl.checkpoints.files import CheckpointError, load_checkpoint
from rl.checkpoints.resume import StartPlan, plan_start
from rl.collection.base import CollectionSpec, Collector
from rl.collection.episodes import EvalSampler
from rl.distributed.launch import launched_by_torchrun, run_torchrun_rank, spawn_ranks
from rl.distributed.settings import DistributedSettings
from rl.distributed.setup import DistContext, synchronize_model
from rl.engine.cli import hydra_record, write_hydra_record
from rl.engine.settings import RunSettings, verify_train_cfg
from rl.evaluation.runs import evaluate_from_config
from rl.evaluation.settings import eval_settings, valid_settings
from rl.evaluation.training_eval import TrainingEvaluation
from rl.evaluation.validation import BackgroundValidation
from rl.evaluation.video import ProbeVideo
from rl.loggers.base import MetricsLogger, RunContext
from rl.loggers.factory import build_logger
from rl.losses.auxiliary import bind_losses, loss_modules
from rl.models.policy import build_policy
from rl.pipeline.stages import TrainingPipeline
from rl.sampling.factory import sampler_num_envs
from rl.tasks.factory import TaskLayout, task_id, task_layout
from rl.training.callbacks import Callback
from rl.training.state import RunRecord
from rl.training.stopping import StopAgreement, TrainingStopped, stop_on_signals
from rl.training.trainer import OnPolicyTrainer
from rl.utils.config import (
    ConfigError,
    integral_fields_to_int,
    integral_floats_to_int,
    to_plain,
)
from rl.utils.files import write_atomic
from rl.utils.logs import log_fatal
from rl.utils.provenance import git_state
from rl.utils.seeding import deterministic_mode, env_seeds, set_seed
from rl.utils.threads import set_torch_threads

log = logging.getLogger(__name__)


def train(cfg: DictConfig | dict[str, Any]) -> dict[str, float]:
    """Train from a composed config; return the final metrics (``eval/*`` included if run).

    ``resume=RUN_DIR|CHECKPOINT`` continues a run exactly in its own folder, ``init_from=`` starts
    a new one from a checkpoint's weights (see :mod:`rl.checkpoints.resume`).
    ``distributed=ddp`` trains on several ranks: under torchrun, or spawned here with
    ``distributed.world_size=N``; the metrics are rank 0's.

    Raises:
        ConfigError: The config cannot run (every problem listed).
        TrainingStopped: SIGTERM / SIGUSR1 / Ctrl-C stopped training after a checkpoint.
    """
    record = hydra_record(cfg)  # as composed, before anything below changes it
    if isinstance(cfg, DictConfig):  # total_env_steps=1e6: a whole number, for every interpolation
        integral_fields_to_int(cfg, RunSettings)
    plain = to_plain(cfg)
    integral_floats_to_int(plain)
    verify_train_cfg(plain)
    _warn_without_experiment(cfg, plain)
    dist = DistributedSettings.from_config(plain["distributed"])
    if not dist.enabled:
        start = plan_start(cfg, plain)
        return _train(start, checked=start.config is plain, record=record)

    planned: list[StartPlan] = []  # rank 0 holds its plan (the run folder's lock) to the end

    def make_plan() -> dict[str, Any]:
        planned.append(_verified_plan(cfg, plain))
        return _plan_payload(planned[0], record)

    if dist.world_size is None or launched_by_torchrun():
        try:
            outcome = run_torchrun_rank(dist, plain["device"], make_plan, _train_rank)
        finally:
            for start in planned:
                start.close()
    else:
        start = _verified_plan(cfg, plain)
        try:  # this process waits for the ranks with the run's log file attached
            payload = _plan_payload(start, record)
            outcome = spawn_ranks(
                dist.world_size, dist, start.config["device"], payload, _train_rank
            )
        finally:
            start.close()
    if "stopped" in outcome:
        checkpoint = outcome["checkpoint"]
        raise TrainingStopped(outcome["stopped"], None if checkpoint is None else Path(checkpoint))
    return outcome["metrics"]


def _warn_without_experiment(cfg: DictConfig | dict[str, Any], plain: dict[str, Any]) -> None:
    """Warn when Hydra composed a new run without ``+experiment=``."""
    choices = run_choices(cfg)
    if choices is None or "experiment" in choices or plain.get("resume"):
        return
    groups = ", ".join(f"{g}={choices[g]}" for g in ("task", "model", "pipeline") if g in choices)
    log.warning(
        "no +experiment= given: training the config tree's defaults (%s) as %r; pick one "
        "with +experiment=NAME (conf/experiment/, e.g. +experiment=ppo_nav)",
        groups,
        plain.get("exp_name"),
    )


def _verified_plan(cfg: DictConfig | dict[str, Any], plain: dict[str, Any]) -> StartPlan:
    """How the run starts; a resumed run's config (rebuilt from its checkpoint) is checked too.

    Each config is checked once per process; ranks train on the config their launcher checked.
    """
    start = plan_start(cfg, plain)
    if start.config is not plain:
        try:
            verify_train_cfg(start.config)
        except BaseException:
            start.close()
            raise
    return start


def _plan_payload(start: StartPlan, record: dict[str, str] | None) -> dict[str, Any]:
    """A start plan as plain data for the ranks (they reload its checkpoint themselves)."""
    return {
        "config": start.config,
        "choices": start.choices,
        "sources": start.sources,
        "resume": None if start.resume_state is None else str(start.checkpoint),
        "init_from": None if start.init_state is None else str(start.checkpoint),
        "hydra_record": record,
    }


def _train_rank(payload: dict[str, Any], ctx: DistContext) -> dict[str, Any]:
    """One rank: rebuild the start plan from ``payload`` and train; the outcome as plain data."""
    resume, init_from = payload["resume"], payload["init_from"]
    start = StartPlan(  # the launcher rebuilt the config: only the training state is read
        payload["config"],
        payload.get("choices"),
        resume_state=None if resume is None else load_checkpoint(resume),
        checkpoint=Path(resume or init_from) if (resume or init_from) else None,
        init_state=None if init_from is None else load_checkpoint(init_from),
        sources=payload.get("sources"),
    )
    try:
        return {"metrics": _train(start, ctx, record=payload.get("hydra_record"))}
    except TrainingStopped as e:
        return {
            "stopped": e.reason,
            "checkpoint": None if e.checkpoint is None else str(e.checkpoint),
        }


def _train(
    start: StartPlan,
    ctx: DistContext | None = None,
    *,
    checked: bool = True,
    record: dict[str, str] | None = None,
) -> dict[str, float]:
    """Train from a start plan on this rank (``ctx`` None: one process).

    ``checked``: the plan's config was already checked (False: a resumed run's rebuilt config).
    ``record``: Hydra's record of the invocation (:func:`~rl.engine.cli.hydra_record`), written
    into a new run's folder. A fatal error is logged here, while a resumed run's own
    ``train.log`` is still attached.
    """
    try:
        return _train_body(start, ctx, checked, record)
    except (TrainingStopped, KeyboardInterrupt):
        raise
    except ConfigError as e:
        # Refused before anything was written: no folder left behind, as train.py does for Hydra's.
        if start.lock is None or not start.lock.discard_unused_folder():
            log_fatal(log, e, "training failed")
        raise
    except Exception as e:
        log_fatal(log, e, "training failed")
        raise
    finally:
        start.close()


def _train_body(
    start: StartPlan, ctx: DistContext | None, checked: bool, record: dict[str, str] | None
) -> dict[str, float]:
    """Build the parts from the plan's config, train, and close them all."""
    with contextlib.ExitStack() as stack:
        # Signals stop the run cleanly (a checkpoint at the first rollout boundary) from here
        # on, also while the parts below are being built.
        stop = StopAgreement(ctx)
        stack.enter_context(stop_on_signals(stop))
        cfg = start.config
        if not checked:
            verify_train_cfg(cfg)
        run = RunSettings.from_config(cfg)
        stack.enter_context(deterministic_mode(run.deterministic))  # before any CUDA work
        main = ctx is None or ctx.is_main
        output_dir = Path(run.output_dir).resolve()  # (typed through a link, perhaps: once)
        # Task, policy and losses that cannot work together are ConfigErrors, raised before the
        # run folder is written: spaces no policy takes (here), outputs that break the policy
        # protocol (build_policy runs a small batch), a feature a loss needs that the policy
        # lacks (bind_losses).
        layout = task_layout(cfg["task"])
        device = torch.device(run.device) if ctx is None else ctx.device
        log.info(
            "torch threads: %d (torch_threads=%s)",
            set_torch_threads(run.torch_threads, device),
            run.torch_threads,
        )
        set_seed(run.seed)
        pipeline: TrainingPipeline = hydra.utils.instantiate(cfg["pipeline"])
        model = build_policy(cfg["model"], *layout.spaces, groups=layout.groups).to(device)
        # Auxiliary heads are built before the per-rank seeds: every rank builds the same ones.
        bind_losses(pipeline.used_losses, model, *layout.spaces)
        if main:
            output_dir.mkdir(parents=True, exist_ok=True)
            log.info("run folder: %s", output_dir)
        start.init_model(model)
        env_offset, total_envs = _distribute(
            model, cfg, run, ctx, loss_modules(pipeline.used_losses)
        )
        spec = CollectionSpec(
            **{k: cfg[k] for k in ("task", "sampler", "model", "normalize")},
            seed=run.seed,
            env_offset=env_offset,
            total_envs=total_envs,
            spaces=layout.spaces,  # read once: no collector builds an environment for them
            agents=layout.agents,
            groups=layout.groups,
        )
        collector: Collector = hydra.utils.instantiate(cfg["collector"])(
            spec=spec, model=model, device=device, dist=ctx
        )
        stack.callback(collector.close)
        if main:  # once the collector took its settings: a refused one leaves no run folder
            write_atomic(output_dir / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
            if start.resume_state is None:  # a resumed run keeps its first invocation's
                write_hydra_record(output_dir, record)
            _record_code(output_dir, first=start.resume_state is None)
        stack.enter_context(stop_on_signals(stop))  # again: Ray installs its own handlers
        logger = MetricsLogger([])
        if main:  # distributed: only rank 0 logs, evaluates, validates and records videos
            logger = build_logger(cfg["logger"], _run_context(cfg, run, pipeline, start))
        stack.callback(logger.close)
        trainer = OnPolicyTrainer(
            model=model,
            pipeline=pipeline,
            collector=collector,
            logger=logger,
            output_dir=output_dir,
            run=RunRecord(cfg, start.choices, logger.run_id or start.wandb_run_id, start.sources),
            device=device,
            seed=run.seed,
            callbacks=_callbacks(cfg, run, logger, device, stack, layout) if main else [],
            dist=ctx,
            stop=stop,
        )
        _resume(trainer, start)
        metrics = trainer.train()
        if trainer.stop_reason is not None:
            raise TrainingStopped(trainer.stop_reason, trainer.last_checkpoint)
        assert trainer.last_checkpoint is not None
        log.info("final checkpoint: %s", trainer.last_checkpoint)
        logger.log_checkpoint(pipeline.total_steps, trainer.last_checkpoint)  # e.g. an artifact
        return metrics


def _resume(trainer: OnPolicyTrainer, start: StartPlan) -> None:
    """Load a resumed run's training state into ``trainer`` (nothing for a new run).

    Raises:
        CheckpointError: The state does not fit this run (a crafted or damaged file: named,
            not a raw traceback).
    """
    if start.resume_state is None:
        return
    try:
        trainer.load_state_dict(start.resume_state)
    except (KeyError, IndexError, TypeError, AttributeError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"resume from {start.checkpoint}: it does not fit this run: "
            f"{type(e).__name__}: {next(iter(str(e).splitlines()), '')}"
        ) from e


def _distribute(
    model: torch.nn.Module,
    cfg: dict[str, Any],
    run: RunSettings,
    ctx: DistContext | None,
    losses: dict[str, torch.nn.Module],
) -> tuple[int, int | None]:
    """Distributed: rank 0's weights (and auxiliary heads) everywhere, then per-rank seeds.

    Environment ``i`` of rank ``r`` is global environment ``r * num_envs + i`` of one seed
    stream; action sampling and shuffling draw from ``seed + rank``.

    Returns:
        ``(env_offset, total_envs)`` of this rank's sampler in the global seed stream.
    """
    if ctx is None or not ctx.enabled:
        return 0, None
    synchronize_model(model)
    for module in losses.values():
        synchronize_model(module)
    n = sampler_num_envs(cfg["sampler"])
    set_seed(run.seed + ctx.rank)
    if ctx.is_main:
        log.info(
            "distributed seeds: env seeds from env_seeds(%d, %d) by global env index "
            "rank * %d + i; torch/numpy/python generators seeded with seed + rank",
            ctx.world_size * n,
            run.seed,
            n,
        )
    return ctx.rank * n, ctx.world_size * n


def _record_code(output_dir: Path, *, first: bool) -> None:
    """Log this invocation's git commit and whether it had uncommitted changes.

    Only a new run (``first``) writes ``git.json``: a resumed one keeps its first invocation's,
    and its log says which code each invocation ran.
    """
    state = git_state()
    if not state:
        log.info("code: not a git checkout (no commit to record)")
        return
    dirty = " with uncommitted changes" if state["git_dirty"] else ""
    log.info("code: git commit %s%s", state["git_sha"], dirty)
    if first:
        code = {"commit": state["git_sha"], "dirty": state["git_dirty"]}
        write_atomic(output_dir / "git.json", json.dumps(code) + "\n")


def _run_context(
    cfg: dict[str, Any], run: RunSettings, pipeline: TrainingPipeline, start: StartPlan
) -> RunContext:
    name = task_id(cfg["task"])
    return RunContext(
        output_dir=Path(run.output_dir),
        config=cfg,
        exp_name=run.exp_name,
        task_id=name,
        seed=run.seed,
        total_steps=pipeline.total_max_steps,
        run_name=f"{name}__{run.exp_name}__{run.seed}__{int(time.time())}",
        resume_id=start.wandb_run_id,
    )


def _callbacks(
    cfg: dict[str, Any],
    run: RunSettings,
    logger: MetricsLogger,
    device: torch.device,
    stack: contextlib.ExitStack,
    layout: TaskLayout,
) -> list[Callback]:
    """The trainer callbacks the config asks for (closed with ``stack``), in calling order.

    Evaluation comes first: at the end of training the final evaluation then runs while the
    validation process still works on the last checkpoints.
    """
    callbacks: list[Callback] = []
    evaluation = eval_settings(cfg["eval"])
    if evaluation is not None and evaluation.num_episodes > 0:
        callbacks.append(TrainingEvaluation(evaluation))
    if run.video_interval:
        # The same episode every time (environment 0's first training seed), to compare policies.
        seed = env_seeds(sampler_num_envs(cfg["sampler"]), run.seed)[0]
        video = ProbeVideo(
            task=cfg["task"],
            output_dir=Path(run.output_dir),
            interval=run.video_interval,
            seed=seed,
            device=device,
        )
        stack.callback(video.close)
        callbacks.append(video)
    validation = valid_settings(cfg["valid"])
    if validation is not None:
        background = BackgroundValidation(
            validation,
            task=cfg["task"],
            model=cfg["model"],
            logger=logger,
            device=device,
            layout=layout,
            sampler=EvalSampler.of_run(cfg["sampler"]),
        )
        stack.callback(background.close)
        callbacks.append(background)
    return callbacks + _own_callbacks(cfg.get("callbacks") or [], stack)


_HOOKS = ("on_train_start", "on_rollout_end", "on_stage_end", "on_checkpoint", "on_train_end")


def _own_callbacks(nodes: list[Any], stack: contextlib.ExitStack) -> list[Callback]:
    """The researcher's ``callbacks:``, built from their ``_target_``s (closed with the run).

    Raises:
        ConfigError: An object lacks a hook of :class:`~rl.training.Callback`.
    """
    built: list[Callback] = []
    for i, node in enumerate(nodes):
        callback = hydra.utils.instantiate(node)
        missing = [hook for hook in _HOOKS if not callable(getattr(callback, hook, None))]
        if missing:
            raise ConfigError(
                f"callbacks.{i}: {node['_target_']} built a {type(callback).__name__} without "
                f"{', '.join(missing)} (subclass rl.training.Callback: its hooks do nothing "
                "until you write them)"
            )
        if callable(getattr(callback, "close", None)):
            stack.callback(callback.close)
        built.append(callback)
    return built


def evaluate(cfg: DictConfig | dict[str, Any]) -> dict[str, float]:
    """Evaluate checkpoints (``run_dir=``: every one of a run; ``ckpt=``: a file or a glob).

    Each selected checkpoint runs the same fixed, seeded episode list (see
    :mod:`rl.evaluation.runs` for the files written); ``test_expert=true`` evaluates the task's
    expert instead.

    Returns:
        The last checkpoint's ``eval/*`` metrics (``expert/*`` with ``test_expert``).
    """
    return evaluate_from_config(to_plain(cfg))
