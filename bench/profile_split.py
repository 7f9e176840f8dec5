"""Where a training step's time goes: ``ppo_nav`` under ``torch.profiler``, split by phase.

Runs ``ppo_nav`` (or ``--experiment``; its defaults, or Hydra overrides given on the command
line) for a few rollouts in this process with in-process collection (an experiment with
collection workers needs ``collector=local '~collector.num_workers'``), marks each phase with
``torch.profiler.record_function`` and prints, per 1,000 env steps, the wall time of:

- collection: environment stepping (the sampler), the policy's forward pass (``act``), storage
  inserts, and the rest (observation conversion, episode bookkeeping, bootstrapping);
- the update: forward pass and losses, backward pass, optimizer step, the rest (minibatch
  gathering, returns and advantages, logging).

It then lists the operators that take the most time in the update. The first rollouts are
warm-up and not profiled.

``--smoke``: one warm-up and one profiled rollout of 4 envs x 16 steps, one epoch (overrides
given on the command line still win), to check that the benchmark runs (``tests/test_bench.py``),
not to measure.

    python bench/profile_split.py [--rollouts 6] [--warmup 2] [--smoke] [--experiment ppo_nav]
                                  [HYDRA_OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import functools
import gc
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
PHASES = {
    "collect": "collection",
    "collect/env": "  environment steps",
    "collect/policy": "  policy forward (act)",
    "collect/storage": "  storage inserts",
    "update": "update",
    "update/backward": "  backward",
    "update/optimizer": "  optimizer step",
}
# --smoke's defaults (flags given explicitly still win) and the overrides it puts first.
SMOKE = {"rollouts": 1, "warmup": 1}
SMOKE_OVERRIDES = ["sampler.num_envs=4", "pipeline.num_steps=16", "pipeline.update_repeats=1"]


def _marked(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def _mark_phases() -> None:
    """Wrap the hot-path methods in ``record_function`` scopes (this process only)."""
    from rl.collection.local import InProcessCollector
    from rl.models.actor_critic import ActorCritic
    from rl.sampling.serial import SerialSampler
    from rl.storage.rollout import RolloutStorage
    from rl.training.learner import Learner

    InProcessCollector.collect = _marked("collect", InProcessCollector.collect)  # type: ignore[method-assign]
    SerialSampler.step = _marked("collect/env", SerialSampler.step)  # type: ignore[method-assign]
    ActorCritic.act = _marked("collect/policy", ActorCritic.act)  # type: ignore[method-assign]
    RolloutStorage.insert = _marked("collect/storage", RolloutStorage.insert)  # type: ignore[method-assign]
    Learner.update = _marked("update", Learner.update)  # type: ignore[method-assign]
    torch.Tensor.backward = _marked("update/backward", torch.Tensor.backward)  # type: ignore[method-assign]
    torch.optim.Adam.step = _marked("update/optimizer", torch.optim.Adam.step)  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6, help="profiled rollouts")
    parser.add_argument("--warmup", type=int, default=2, help="rollouts before profiling")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    parser.add_argument("--experiment", default="ppo_nav", help="the experiment to profile")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the experiment")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags and overrides given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    torch.set_num_threads(1)
    from hydra import compose, initialize_config_dir

    import rl.engine.run
    from rl.training.trainer import OnPolicyTrainer

    _mark_phases()
    steps_per_rollout = 16 * 128
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        probe = compose(
            config_name="train", overrides=[f"+experiment={args.experiment}", *args.overrides]
        )
    steps_per_rollout = int(probe.sampler.num_envs) * int(probe.pipeline.num_steps)
    total = steps_per_rollout * (args.warmup + args.rollouts)
    prof = profile(activities=[ProfilerActivity.CPU])
    original = OnPolicyTrainer._after_rollout

    def after_rollout(self: OnPolicyTrainer, *a: Any, **k: Any) -> Any:
        result = original(self, *a, **k)
        if self.pipeline.total_steps == steps_per_rollout * args.warmup:
            prof.start()
        return result

    OnPolicyTrainer._after_rollout = after_rollout  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                config_name="train",
                overrides=[
                    f"+experiment={args.experiment}",
                    f"total_env_steps={total}",
                    "pipeline.save_interval=0",
                    "eval.num_episodes=0",
                    "valid=null",
                    "logger.sinks.console.progress_bar=false",
                    "logger.sinks.console.summary_every=0",
                    f"output_dir={tmp}",
                    *args.overrides,
                ],
            )
        rl.engine.run.train(cfg)
    prof.stop()
    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    per_k = 1000.0 / (steps_per_rollout * args.rollouts)

    def ms(label: str) -> float:
        event = by_name.get(label)
        return 0.0 if event is None else event.cpu_time_total / 1000.0 * per_k

    rows = {label: ms(label) for label in PHASES}
    collect_rest = rows["collect"] - rows["collect/env"] - rows["collect/policy"]
    collect_rest -= rows["collect/storage"]
    forward = rows["update"] - rows["update/backward"] - rows["update/optimizer"]
    overrides = " ".join(args.overrides) or "(defaults)"
    print(
        f"\n{args.experiment} {overrides}: ms per 1,000 env steps "
        f"({args.rollouts} rollouts profiled)"
    )
    total_ms = rows["collect"] + rows["update"]
    for label, name in PHASES.items():
        print(f"  {name:<30} {rows[label]:8.1f}  {rows[label] / total_ms:6.1%}")
        if label == "collect/storage":
            print(f"  {'  the rest':<30} {collect_rest:8.1f}  {collect_rest / total_ms:6.1%}")
        if label == "update":
            print(f"  {'  forward and losses':<30} {forward:8.1f}  {forward / total_ms:6.1%}")
    print(f"  {'total':<30} {total_ms:8.1f}")
    ops = sorted(
        (e for e in events if e.key.startswith("aten::")),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:8]
    print("\nlargest operators (self time, ms per 1,000 env steps, collection and update):")
    for e in ops:
        print(f"  {e.key:<36} {e.self_cpu_time_total / 1000.0 * per_k:8.1f}  x{e.count}")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
