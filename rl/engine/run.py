"""Run wiring: the only code that sees the whole config (``train.py``/``evaluate.py`` call it).

``train(cfg)``: verify the config (every error at once, before anything starts), resolve it once
into plain containers, seed, build sampler, model, pipeline and loggers with
``hydra.utils.instantiate``, train, optionally evaluate the final policy, and always close the
samplers and loggers. ``evaluate(cfg)``: load a checkpoint safely, rebuild the task and model
from the config saved in it, and run a fixed, seeded episode list.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra.utils
import torch
import yaml
from omegaconf import DictConfig

from rl.distributed.setup import DistContext, distributed_settings, synchronize_model
from rl.engine.checkpoint import load_checkpoint
from rl.engine.evaluator import (
    EvalResult,
    PeriodicEvaluation,
    episode_seed_list,
    evaluate_policy,
)
from rl.engine.monitors import RunMonitors
from rl.engine.resume import (
    StartPlan,
    TrainingStopped,
    plan_start,
    stop_on_signals,
    wandb_run_id,
)
from rl.engine.trainer import OnPolicyTrainer
from rl.engine.validation import verify_valid_cfg
from rl.loggers.base import MetricsLogger, RunContext
from rl.models.actor_critic import ActorCritic
from rl.pipeline.stages import TrainingPipeline
from rl.sampling.serial import build_env, dict_space
from rl.utils.config import ConfigError, check_targets, to_plain
from rl.utils.seeding import set_seed

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ verification
# Top-level keys a training config may have; anything else is a typo (e.g. `+lr=1e-3`).
TOP_LEVEL_KEYS = frozenset(
    {
        "task",
        "model",
        "pipeline",
        "sampler",
        "logger",
        "exp_name",
        "seed",
        "device",
        "torch_threads",
        "total_env_steps",
        "tags",
        "output_dir",
        "eval",
        "optimized_metric",
        "valid",
        "video_interval",
        "resume",
        "init_from",
        "distributed",
    }
)
EVAL_KEYS = frozenset(
    {"num_episodes", "episode_seed", "num_envs", "deterministic", "action_seed", "interval"}
)


def sampler_num_envs(sampler: dict[str, Any]) -> int:
    """Total environments a sampler config asks for."""
    if "num_envs" in sampler:
        return int(sampler["num_envs"])
    return int(sampler.get("num_processes", 1)) * int(sampler.get("envs_per_process", 1))


def verify_train_cfg(cfg: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` listing every problem of a resolved training config."""
    errors: list[str] = [
        f"{key}: unknown top-level key (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"
        for key in cfg
        if key not in TOP_LEVEL_KEYS and key != "hydra"
    ]
    errors += [
        f"eval.{key}: unknown key (known: {', '.join(sorted(EVAL_KEYS))})"
        for key in cfg.get("eval") or {}
        if key not in EVAL_KEYS
    ]
    for key, kind in (
        ("seed", int),
        ("total_env_steps", int),
        ("exp_name", str),
        ("device", str),
        ("output_dir", str),
    ):
        if key not in cfg:
            errors.append(f"{key}: missing")
        elif not isinstance(cfg[key], kind) or isinstance(cfg[key], bool):
            errors.append(f"{key}: expected {kind.__name__}, got {cfg[key]!r}")
    for group in ("task", "model", "pipeline", "sampler", "logger"):
        if not isinstance(cfg.get(group), dict):
            errors.append(f"{group}: missing config group (choose one, e.g. {group}=...)")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    if isinstance(cfg["total_env_steps"], int) and cfg["total_env_steps"] <= 0:
        errors.append(f"total_env_steps: must be positive, got {cfg['total_env_steps']}")
    if str(cfg["device"]).startswith("cuda") and not torch.cuda.is_available():
        errors.append(f"device: {cfg['device']!r} requested but CUDA is not available")
    errors += check_targets({k: v for k, v in cfg.items() if k != "hydra"})
    errors += verify_valid_cfg(cfg)  # `valid` and `video_interval`

    pipe = cfg["pipeline"]
    num_envs = sampler_num_envs(cfg["sampler"])
    if num_envs < 1:
        errors.append(f"sampler: needs at least one environment, got {num_envs}")
    losses = pipe.get("named_losses") or {}
    stages = pipe.get("stages") or []
    if not stages:
        errors.append("pipeline.stages: at least one stage is required")
    for i, stage in enumerate(stages):
        where = f"pipeline.stages.{i}"
        component = stage.get("offpolicy_component") or {}
        named = [(f"{where}.loss_names", n) for n in stage.get("loss_names") or []]
        named += [
            (f"{where}.offpolicy_component.loss_names", n)
            for n in component.get("loss_names") or []
        ]
        for key, name in named:
            if name not in losses:
                errors.append(
                    f"{key}: no loss named {name!r} in pipeline.named_losses "
                    f"(defined: {sorted(losses)})"
                )
        if not stage.get("loss_names") and not component:
            errors.append(
                f"{where}.loss_names: must name at least one loss "
                "(or the stage needs an offpolicy_component)"
            )
        weights = stage.get("loss_weights")
        if weights is not None and len(weights) != len(stage.get("loss_names") or []):
            errors.append(f"{where}.loss_weights: one weight per loss name is required")

        def setting(key: str, stage: dict[str, Any] = stage) -> Any:
            return stage[key] if stage.get(key) is not None else pipe.get(key)

        for key in ("num_steps", "num_mini_batch", "update_repeats"):
            value = setting(key)
            if isinstance(value, int) and value < 1:
                errors.append(f"{where}.{key} (or pipeline.{key}): must be >= 1, got {value}")
        mb = setting("num_mini_batch")
        if isinstance(mb, int) and mb > num_envs:
            errors.append(
                f"{where}.num_mini_batch (or pipeline.num_mini_batch)={mb} > {num_envs} "
                "environments: minibatches are split by environment, so at most one per env"
            )
        budget = stage.get("max_stage_steps")
        if isinstance(budget, int) and budget <= 0:
            errors.append(f"{where}.max_stage_steps: must be positive, got {budget}")
    budgets = [st.get("max_stage_steps") for st in stages]
    if all(isinstance(b, int) for b in budgets) and sum(budgets) != cfg["total_env_steps"]:
        errors.append(
            f"pipeline.stages.*.max_stage_steps sum to {sum(budgets):,} but total_env_steps is "
            f"{cfg['total_env_steps']:,} (schedules run over total_env_steps: make them agree)"
        )
    errors += verify_distributed_cfg(cfg)
    ev = cfg.get("eval") or {}
    if int(ev.get("num_episodes", 0)) < 0:
        errors.append("eval.num_episodes: must be >= 0")
    if int(ev.get("interval") or 0) > 0 and int(ev.get("num_episodes", 0)) < 1:
        errors.append("eval.interval: periodic evaluation needs eval.num_episodes >= 1")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def verify_distributed_cfg(cfg: dict[str, Any]) -> list[str]:
    """Problems of the ``distributed`` group (see ``conf/distributed/``)."""
    from rl.distributed.setup import DISTRIBUTED_DEFAULTS, distributed_settings

    raw = cfg.get("distributed") or {}
    errors = [
        f"distributed.{k}: unknown key (known: {', '.join(sorted(DISTRIBUTED_DEFAULTS))})"
        for k in raw
        if k not in DISTRIBUTED_DEFAULTS
    ]
    d = distributed_settings(cfg)
    workers = d["workers"]
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        errors.append(f"distributed.workers: expected a positive integer or null, got {workers!r}")
    if workers is not None and not d["enabled"]:
        errors.append("distributed.workers: needs distributed=ddp (distributed.enabled=true)")
    if d["backend"] not in ("auto", "gloo", "nccl", "mpi"):
        errors.append(f"distributed.backend: auto, gloo, nccl or mpi, got {d['backend']!r}")
    sync = d["sync_frac"]
    if sync is not None and not (isinstance(sync, (int, float)) and 0 < sync <= 1):
        errors.append(f"distributed.sync_frac: must be in (0, 1] or null, got {sync!r}")
    low = d["min_rollout_frac"]
    if not (isinstance(low, (int, float)) and 0 <= low <= 1):
        errors.append(f"distributed.min_rollout_frac: must be in [0, 1], got {low!r}")
    return errors


# ------------------------------------------------------------------------ helpers
def _device(name: str) -> torch.device:
    return torch.device(name)


def build_model(model_cfg: dict[str, Any], task_cfg: dict[str, Any]) -> ActorCritic:
    """Instantiate the model for the observation and action spaces of the task."""
    env = build_env(task_cfg)
    try:
        obs_space, act_space = dict_space(env.observation_space), env.action_space
    finally:
        env.close()
    return hydra.utils.instantiate(model_cfg)(  # type: ignore[no-any-return]
        observation_space=obs_space, action_space=act_space
    )


def task_id_of(task_cfg: dict[str, Any]) -> str:
    """Readable task identifier: the gymnasium id or the environment class name."""
    if "env_id" in task_cfg:
        return str(task_cfg["env_id"])
    env = build_env(task_cfg)
    try:
        return env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    finally:
        env.close()


def write_eval_json(path: Path, result: EvalResult, settings: dict[str, Any]) -> None:
    """Write mean metrics and per-episode records as JSON."""
    path.write_text(
        json.dumps(
            {"settings": settings, "metrics": result.metrics, "episodes": result.episodes},
            indent=1,
        )
    )


def format_table(rows: dict[str, float], title: str) -> str:
    """A two-column text table of metrics."""
    width = max(len(k) for k in rows) if rows else 10
    lines = [title, "-" * (width + 14)]
    lines += [f"{k:<{width}}  {v:>12.4f}" for k, v in rows.items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- train
def train(cfg: DictConfig | dict[str, Any]) -> dict[str, float]:
    """Train from a composed config; return the final metrics (``eval/*`` included if run).

    ``resume=RUN_DIR|CHECKPOINT`` continues a run exactly in its own folder, ``init_from=`` starts
    a new one from a checkpoint's weights (see :mod:`rl.engine.resume`).

    ``distributed=ddp`` trains on several workers (:mod:`rl.distributed.launch`): under
    torchrun, or spawned here with ``distributed.workers=N``; the metrics are rank 0's.

    Raises:
        TrainingStopped: SIGTERM / SIGUSR1 / Ctrl-C stopped training after a checkpoint.
    """
    plain = to_plain(cfg)
    settings = distributed_settings(plain)
    if not settings["enabled"]:
        return _train(plan_start(cfg, plain))
    from rl.distributed import launch

    def make_plan() -> dict[str, Any]:
        start = plan_start(cfg, plain)
        start.close()
        verify_train_cfg(start.config)
        return _plan_payload(start)

    if settings["workers"] is None or launch.launched_by_torchrun():
        return launch.run_torchrun_worker(settings, plain["device"], make_plan, _train_worker)
    start = plan_start(cfg, plain)
    try:
        verify_train_cfg(start.config)
        kind, result, checkpoint = launch.spawn_workers(
            int(settings["workers"]),
            settings,
            str(start.config["device"]),
            _plan_payload(start),
            _train_worker,
        )
    finally:
        start.close()
    if kind == "stopped":
        raise TrainingStopped(result, None if checkpoint is None else Path(checkpoint))
    return result  # type: ignore[no-any-return]


def _plan_payload(start: StartPlan) -> dict[str, Any]:
    """A start plan as plain data for other workers (they reload its checkpoint)."""
    return {
        "config": start.config,
        "config_unresolved": start.config_unresolved,
        "resume": None if start.resume_state is None else str(start.checkpoint),
        "init_from": None if start.init_state is None else str(start.checkpoint),
    }


def _train_worker(payload: dict[str, Any], ctx: DistContext) -> dict[str, float]:
    """One distributed worker: rebuild the start plan from ``payload`` and train."""
    resume, init_from = payload["resume"], payload["init_from"]
    start = StartPlan(
        payload["config"],
        payload["config_unresolved"],
        resume_state=None if resume is None else load_checkpoint(Path(resume)),
        checkpoint=Path(resume or init_from) if (resume or init_from) else None,
        init_state=None if init_from is None else load_checkpoint(Path(init_from)),
    )
    return _train(start, ctx)


def _train(start: StartPlan, ctx: DistContext | None = None) -> dict[str, float]:
    """Train from a start plan; ``ctx``: this distributed worker (None: one process)."""
    plain = start.config
    verify_train_cfg(plain)
    main = ctx is None or ctx.is_main
    output_dir = Path(plain["output_dir"])
    if main:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))
    seed = plain["seed"]
    if plain.get("torch_threads"):
        torch.set_num_threads(int(plain["torch_threads"]))
    device = _device(plain["device"]) if ctx is None else ctx.device
    set_seed(seed)

    pipeline: TrainingPipeline = hydra.utils.instantiate(plain["pipeline"])
    task_cfg = plain["task"]
    model = build_model(plain["model"], task_cfg).to(device)
    start.init_model(model)
    sampler_kwargs: dict[str, Any] = {}
    if ctx is not None and ctx.enabled:
        synchronize_model(model)  # rank 0's weights everywhere, checked bitwise
        # Seeds: environment i of rank r is global env r * num_envs + i of one seed stream;
        # action sampling and shuffling draw from seed + rank.
        n = sampler_num_envs(plain["sampler"])
        sampler_kwargs = {"env_offset": ctx.rank * n, "total_envs": ctx.world_size * n}
        set_seed(seed + ctx.rank)
        if ctx.is_main:
            log.info(
                "distributed seeds: env seeds from worker_seeds(%d, %d) by global env index "
                "rank * %d + i; torch/numpy/python generators seeded with seed + rank",
                ctx.world_size * n,
                seed,
                n,
            )
    task_id = task_id_of(task_cfg)
    context = RunContext(
        output_dir=output_dir,
        config=plain,
        exp_name=plain["exp_name"],
        task_id=task_id,
        seed=seed,
        total_steps=pipeline.total_max_steps,
        run_name=f"{task_id}__{plain['exp_name']}__{seed}__{int(time.time())}",
    )
    log.info("run folder: %s", output_dir)
    sampler = hydra.utils.instantiate(plain["sampler"])(task=task_cfg, seed=seed, **sampler_kwargs)
    try:
        # Distributed: only rank 0 logs (its sinks, e.g. wandb), validates and records videos.
        sinks = [
            hydra.utils.instantiate(s)(context=context)
            for s in (plain["logger"].get("sinks") or {}).values()
            if s and main
        ]
        logger = MetricsLogger(sinks)
        monitors = RunMonitors(
            plain if main else {**plain, "valid": {"enabled": False}, "video_interval": 0},
            logger=logger,
            output_dir=output_dir,
            device=device,
        )
        try:
            ev = plain.get("eval") or {}
            if not main:
                ev = {**ev, "interval": 0, "num_episodes": 0}
            callbacks = [*monitors.callbacks]  # validation during training, probe videos
            if int(ev.get("interval") or 0) > 0:
                callbacks.append(
                    PeriodicEvaluation(
                        task=task_cfg,
                        interval=int(ev["interval"]),
                        num_episodes=int(ev["num_episodes"]),
                        episode_seed=int(ev["episode_seed"]),
                        num_envs=int(ev.get("num_envs", 16)),
                        deterministic=bool(ev.get("deterministic", False)),
                        action_seed=int(ev.get("action_seed", 0)),
                        device=device,
                    )
                )
            trainer = OnPolicyTrainer(
                model=model,
                pipeline=pipeline,
                sampler=sampler,
                logger=logger,
                output_dir=output_dir,
                config=plain,
                config_unresolved=start.config_unresolved,
                wandb_run_id=wandb_run_id(sinks) or start.wandb_run_id,
                device=device,
                seed=seed,
                callbacks=callbacks,
                on_checkpoint=monitors.on_checkpoint,
                dist=ctx,
            )
            if start.resume_state is not None:
                trainer.load_state_dict(start.resume_state)
            with stop_on_signals(trainer):
                metrics = trainer.train()
            if trainer.stop_reason is not None:
                raise TrainingStopped(trainer.stop_reason, trainer.last_checkpoint)
            final_ckpt = trainer.save()
            log.info("final checkpoint: %s", final_ckpt)
            if int(ev.get("num_episodes", 0)) > 0:
                result = evaluate_policy(
                    model=model,
                    task=task_cfg,
                    episode_seeds=episode_seed_list(ev["num_episodes"], ev["episode_seed"]),
                    num_envs=ev.get("num_envs", 16),
                    deterministic=ev.get("deterministic", False),
                    action_seed=ev.get("action_seed", 0),
                    device=device,
                )
                write_eval_json(final_ckpt.with_suffix(".eval.json"), result, ev)
                logged = result.as_logged("eval")
                logger.log(pipeline.total_steps, logged)
                metrics.update(logged)
                log.info("\n%s", format_table(logged, f"final evaluation ({final_ckpt.name})"))
            metrics.update(monitors.finish())  # waits for every pending validation
            logger.log_checkpoint(pipeline.total_steps, final_ckpt)  # e.g. a wandb artifact
        finally:
            monitors.close()
            logger.close()
    finally:
        sampler.close()
        start.close()
    return metrics


# ------------------------------------------------------------------------ evaluate
def evaluate(cfg: DictConfig | dict[str, Any]) -> dict[str, float]:
    """Evaluate checkpoints (``run_dir=``: every one of a run; ``ckpt=``: a file or a glob).

    Each selected checkpoint runs the same fixed, seeded episode list and gets its
    ``<checkpoint>.eval.json``; a run also gets ``eval_summary.{csv,json,png}``.
    ``test_expert=true`` evaluates the task's expert instead. See :mod:`rl.engine.eval_runs`.

    Returns:
        The last checkpoint's ``eval/*`` metrics (``expert/*`` with ``test_expert``).
    """
    from rl.engine.eval_runs import evaluate_from_config  # it uses this module's helpers

    return evaluate_from_config(to_plain(cfg))
