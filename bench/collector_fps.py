"""Training throughput by collector: in-process vs Ray collection workers (sync and async).

One run measures, on the registered ``rl/PointNav-v0`` task with ``train_fps``'s settings (16 envs
x 128 steps, 4 epochs x 4 minibatches, one torch thread per process, FPS over the last three
quarters of training): ``collector=local``, ``collector=ray`` synchronous and asynchronous, each
with the memoryless MLP and the GRU policy, and stable-baselines3 PPO (same MLP, DummyVecEnv).
For the Ray rows it also prints the time split of the learner (collect = waiting for rollouts,
update) from the run's own ``time/*`` metrics, and the bytes a rollout takes with and without
compression.

``--smoke``: every layout with tiny budgets (512 env steps in 16-step rollouts), the MLP only,
to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/collector_fps.py [--steps 40960] [--workers 1] [--skip-sb3] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_fps  # noqa: E402  (the same runs and settings)


def row(model: str, steps: int, overrides: list[str]) -> tuple[float, dict[str, float]]:
    return train_fps.ours(model, steps, overrides, return_record=True)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=train_fps.NUM_ENVS * train_fps.NUM_STEPS * 20)
    parser.add_argument("--workers", type=int, default=1, help="Ray collection workers")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    models: tuple[str, ...] = ("mlp", "nav_cnn_gru")
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(steps=train_fps.SMOKE["steps"])
        args = parser.parse_args()
        train_fps.use_smoke_rollouts()
        models = ("mlp",)
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
    results: list[tuple[str, float, dict[str, float]]] = []
    for model in models:
        for name, overrides in layouts.items():
            fps, metrics = row(model, args.steps, overrides)
            results.append((f"ours {model}, {name}", fps, metrics))
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
