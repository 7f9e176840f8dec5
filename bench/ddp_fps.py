"""Distributed training throughput: ``ppo_nav`` with 1 process vs N DDP ranks (CLI runs).

Each run is the real command line (``python train.py +experiment=ppo_nav ...``; with
``distributed=ddp distributed.world_size=N`` for N > 1), every rank with ``num_envs`` envs
and one torch thread, so N ranks collect N times the env steps per rollout. FPS is the mean
``charts/SPS`` of the logged intervals after the first (start-up excluded), in global env
steps per second. Optionally ``--preempt`` adds the ``ddp_preempt`` preset (sync_frac 0.5).

``--smoke``: the same runs with tiny budgets (4 envs per rank, 16-step rollouts, 256 env
steps, FPS logged every 64), to check that the benchmark runs (``tests/test_bench.py``), not to
measure.

    python bench/ddp_fps.py [--steps 32768] [--ranks 1 2] [--num-envs 8] [--num-steps 128]
                            [--log-interval 4096] [--preempt] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --smoke's defaults (flags given explicitly still win).
SMOKE = {"steps": 256, "num_envs": 4, "num_steps": 16, "log_interval": 64}


def run(
    ranks: int,
    steps: int,
    num_envs: int,
    preempt: bool,
    num_steps: int = 128,
    log_interval: int = 4096,
) -> dict[str, float]:
    """One CLI run; returns its mean logged FPS and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            sys.executable,
            "train.py",
            "+experiment=ppo_nav",
            f"hydra.run.dir={tmp}/run",
            f"total_env_steps={steps}",
            f"sampler.num_envs={num_envs}",
            f"pipeline.num_steps={num_steps}",
            f"pipeline.metric_accumulate_interval={log_interval}",
            "pipeline.save_interval=1000000000",
            "eval.num_episodes=0",
            "logger.sinks.console.progress_bar=false",
        ]
        if ranks > 1:
            preset = "ddp_preempt" if preempt else "ddp"
            args += [f"distributed={preset}", f"distributed.world_size={ranks}"]
            if preempt:
                args.append("distributed.sync_frac=0.5")
        env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        lines = (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        sps = [r["charts/SPS"] for r in map(json.loads, lines) if "charts/SPS" in r]
    steady = sps[1:] or sps
    return {"fps": sum(steady) / len(steady), "wall_s": wall}


def main() -> None:
    """Print a table of FPS by rank count."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=32768)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-envs", type=int, default=8, help="environments per rank")
    parser.add_argument("--num-steps", type=int, default=128, help="rollout length")
    parser.add_argument(
        "--log-interval", type=int, default=4096, help="env steps between logged FPS figures"
    )
    parser.add_argument("--preempt", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    print(
        f"ppo_nav, {args.num_envs} envs/rank, {args.num_steps}-step rollouts, "
        f"{args.steps} env steps"
    )
    print(f"{'ranks':>7}  {'FPS':>8}  {'wall s':>7}")
    for ranks in args.ranks:
        result = run(
            ranks, args.steps, args.num_envs, args.preempt, args.num_steps, args.log_interval
        )
        print(f"{ranks:>7}  {result['fps']:>8.0f}  {result['wall_s']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
