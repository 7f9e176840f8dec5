"""Training throughput by collector: in-process vs Ray collection workers (sync and async).

One run measures, on the registered ``rl/PointNav-v0`` task with ``train_fps``'s settings (16 envs
x 128 steps, 4 epochs x 4 minibatches, one torch thread per process, FPS over the last three
quarters of training): ``collector=local``, ``collector=ray`` synchronous and asynchronous, each
with the memoryless MLP and the GRU policy, and stable-baselines3 PPO (same MLP, DummyVecEnv).
For the Ray rows it also prints the time split of the learner (collect = waiting for rollouts,
update) from the run's own ``time/*`` metrics, and the bytes a rollout takes with and without
compression.

``--slow-worker``: instead, the straggler case of barrier-free async. Two process workers of
8 environments each on ``rl_envs.toys.debug.SlowEnv`` (a trivial counter task, so that collection
is the policy's cost), one of whose environments sleeps ``--delay`` s per step: worker 1 is a
straggler. The barrier (``rollouts_per_update: null``: every worker's rollout each update) runs
at worker 1's pace; barrier-free (``rollouts_per_update: 1``) updates on whichever rollout is
ready first. Learner FPS (env steps the learner consumes per second), policy lag and drops.

``--smoke``: every layout but the uncompressed one with tiny budgets (512 env steps in 16-step
rollouts), the MLP only, then the straggler comparison with the same budgets in the same process
(one interpreter start for both tables; ``--smoke --slow-worker``: that one only), to check that
the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/collector_fps.py [--steps 40960] [--workers 1] [--skip-sb3] [--smoke]
    python bench/collector_fps.py --slow-worker [--delay 0.002] [--steps 81920]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_fps  # noqa: E402  (the same runs and settings)


def row(model: str, steps: int, overrides: list[str]) -> tuple[float, dict[str, float]]:
    return train_fps.ours(model, steps, overrides, return_record=True)  # type: ignore[no-any-return]


def slow_worker(steps: int, delay: float, max_policy_lag: int = 4) -> None:
    """Barrier vs barrier-free async with one straggler worker (see the module docstring)."""
    from rl.utils.seeding import env_seeds

    seed, envs = 1, train_fps.NUM_ENVS
    slow_env = envs // 2  # worker 1's first environment
    task = [
        "task=gym",
        "task._target_=rl_envs.toys.debug.SlowEnv",
        "~task.env_id",
        "~task.env_kwargs",
        "~task.wrappers",
        f"+task.delay={delay}",
        f"+task.slow_seed={env_seeds(envs, seed)[slow_env]}",
        "+task.max_steps=50",
    ]
    common = [
        f"seed={seed}",
        *task,
        "collector=process",
        "collector.mode=async",
        "collector.num_workers=2",
        f"collector.max_policy_lag={max_policy_lag}",
    ]
    layouts = {
        "barrier (every worker's rollout)": ["collector.rollouts_per_update=null"],
        "barrier-free (first ready)": ["collector.rollouts_per_update=1"],
    }
    results = {}
    for name, overrides in layouts.items():
        results[name] = row("mlp", steps, [*common, *overrides])
    print(
        f"\nlearner FPS with a straggler: 2 process workers x {envs // 2} envs of "
        f"rl_envs.toys.debug.SlowEnv, worker 1's env {slow_env} sleeping {delay * 1000:.1f} ms a "
        f"step; MLP policy, {train_fps.NUM_STEPS}-step rollouts, max_policy_lag {max_policy_lag}, "
        f"{steps:,} env steps each"
    )
    for name, (fps, m) in results.items():
        print(
            f"  {name:<34} {fps:>8,.0f} FPS | lag mean {m['collection/policy_lag']:.2f} max "
            f"{m.get('collection/policy_lag_max', float('nan')):.0f}, dropped "
            f"{m['collection/dropped']:.0f}"
        )
    (barrier, _), (free, _) = results.values()
    print(f"  barrier-free / barrier: {free / barrier:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=train_fps.NUM_ENVS * train_fps.NUM_STEPS * 20)
    parser.add_argument("--workers", type=int, default=1, help="Ray collection workers")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    parser.add_argument("--slow-worker", action="store_true", help="the straggler comparison")
    parser.add_argument("--delay", type=float, default=0.002, help="--slow-worker: s per step")
    args = parser.parse_args()
    if args.slow_worker:
        torch.set_num_threads(1)
        if args.smoke:
            train_fps.use_smoke_rollouts()
        slow_worker(train_fps.SMOKE["steps"] if args.smoke else args.steps * 2, args.delay)
        return
    collectors(parser, args)
    if args.smoke:  # the straggler table too, without a second interpreter start
        slow_worker(train_fps.SMOKE["steps"], args.delay)


def collectors(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The default mode's table: every collector layout, then stable-baselines3's row."""
    models: tuple[str, ...] = ("mlp", "nav_cnn_gru")
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(steps=train_fps.SMOKE["steps"])
        args = parser.parse_args()
        train_fps.use_smoke_rollouts()
        models = ("mlp",)
    from rl.collection.ray_runtime import init_ray

    torch.set_num_threads(1)
    ray_args = [f"collector.num_workers={args.workers}", "collector.cpus_per_worker=1"]
    layouts = {
        "local": ["collector=local"],
        "ray sync": ["collector=ray", "collector.mode=sync", *ray_args],
        "ray async": ["collector=ray", "collector.mode=async", *ray_args],
        "ray async, no lz4": [
            "collector=ray",
            "collector.mode=async",
            "collector.compress=false",
            *ray_args,
        ],
    }
    if args.smoke:  # (compression off is the async row's own path with one flag)
        del layouts["ray async, no lz4"]
    results: list[tuple[str, float, dict[str, float]]] = []
    for model in models:
        runtime = None
        try:
            for name, overrides in layouts.items():
                if runtime is None and "collector=ray" in overrides:
                    # One private Ray instance (as collector=ray starts it) for this model's Ray
                    # rows: their collectors find it running and leave it; its start is in no
                    # row's time. The local row runs before it, without Ray's daemons.
                    runtime = init_ray(address=None, num_cpus=args.workers)
                fps, metrics = row(model, args.steps, overrides)
                results.append((f"ours {model}, {name}", fps, metrics))
        finally:
            if runtime is not None:
                runtime.shutdown()
    sb3 = None if args.skip_sb3 else train_fps.sb3(args.steps)
    print(
        f"\ntraining FPS on rl/PointNav-v0, {args.steps:,} env steps each "
        f"({train_fps.NUM_ENVS} envs x {train_fps.NUM_STEPS} steps, {train_fps.EPOCHS} epochs x "
        f"{train_fps.MINIBATCHES} minibatches, 1 torch thread per process, "
        f"{args.workers} Ray worker(s))"
    )
    for name, fps, metrics in results:
        split = " ".join(
            f"{k.split('/')[1].removesuffix('_fraction')} {metrics[k]:.2f}"
            for k in (
                "time/collect_fraction",
                "time/env_fraction",
                "time/inference_fraction",
                "time/update_fraction",
            )
            if k in metrics
        )
        extra = ""
        if "collection/bytes_sent" in metrics:
            extra = (
                f" | lag {metrics['collection/policy_lag']:.2f}, "
                f"{metrics['collection/bytes_sent'] / 1024:.0f} KiB sent per rollout "
                f"(x{metrics['collection/compression']:.1f}, packed in "
                f"{metrics['collection/pack_seconds'] * 1000:.1f} ms), "
                f"worker {metrics['collection/worker_fps']:,.0f} FPS"
            )
        print(f"  {name:<28} {fps:>8,.0f} FPS   [{split}]{extra}")
    if sb3 is not None:
        print(f"  {'stable-baselines3 PPO, MLP':<28} {sb3:>8,.0f} FPS")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
