"""Multi-agent throughput: agent-steps per second of multi-agent PointNav vs single-agent PointNav.

Both on the small 9x9 layouts with the same policy (``nav_cnn_gru``) and settings
(``mappo_nav_multi``'s: 16 environments, 64-step rollouts, 4 epochs x 4 minibatches,
16-step BPTT chunks, one torch thread); FPS over the last three quarters of training, as in
``bench/train_fps.py``:

- raw limits (the serial sampler, random actions, no policy): single-agent PointNav's env
  steps/s, and multi-agent PointNav's agent-steps/s (rows; 2 agents per environment);
- training: ``ppo_nav`` on ``task=nav_small`` (env steps/s), ``mappo_nav_multi`` and
  ``ippo_nav_multi`` (agent-steps/s: each agent is a row of the batch, so 16 environments are
  32 rows).

``--smoke``: tiny budgets (1,024 steps in 16-step rollouts, 0.25 s of raw stepping), to check
that the benchmark runs (``tests/test_bench.py``).

    python bench/multiagent_fps.py [--steps 98304] [--raw-seconds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import train_fps  # noqa: E402  (the same measurement of training FPS)

NUM_ENVS = 16
SETTINGS = [  # mappo_nav_multi's, for the single-agent row too
    "sampler.num_envs=16",
    "pipeline.num_steps=64",
    "pipeline.num_mini_batch=4",
    "pipeline.update_repeats=4",
    "pipeline.recurrence=16",
    "pipeline.optimizer.lr=1.0e-3",
]


def raw_rows_per_second(task: dict, seconds: float) -> float:
    """Rows (env steps, or agent-steps) per second of the serial sampler, random actions."""
    from rl.sampling import build_sampler

    with build_sampler(None, task=task, num_envs=NUM_ENVS, seed=0) as sampler:
        rows = sampler.num_envs
        actions = np.random.default_rng(0).integers(0, 4, size=(1024, rows))
        sampler.reset()
        for t in range(20):  # warm-up
            sampler.step(actions[t])
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            sampler.step(actions[steps % 1024])
            steps += 1
        return steps * rows / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=98_304)
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    extra: list[str] = []
    if args.smoke:
        args.steps, args.raw_seconds = 1024, 0.25
        extra = ["pipeline.num_steps=16", "pipeline.recurrence=8"]
    torch.set_num_threads(1)
    single = yaml.safe_load((ROOT / "conf" / "task" / "nav_small.yaml").read_text())
    multi = yaml.safe_load((ROOT / "conf" / "task" / "nav_multi.yaml").read_text())
    raw_single = raw_rows_per_second(single, args.raw_seconds)
    raw_multi = raw_rows_per_second(multi, args.raw_seconds)
    settings = [*SETTINGS, *extra]
    rows = {
        "ppo_nav, task=nav_small (1 agent)": train_fps.ours(
            "nav_cnn_gru", args.steps, ["task=nav_small", *settings], experiment="ppo_nav"
        ),
        "mappo_nav_multi (2 agents)": train_fps.ours(
            None, args.steps, extra, experiment="mappo_nav_multi"
        ),
        "ippo_nav_multi (2 agents)": train_fps.ours(
            None, args.steps, extra, experiment="ippo_nav_multi"
        ),
    }
    print(f"\nPointNav 9x9, {NUM_ENVS} environments, {args.steps:,} steps (rows) each, 1 thread")
    print(f"  {'raw limit, 1 agent (env steps/s)':<44} {raw_single:>8,.0f}")
    print(f"  {'raw limit, 2 agents (agent-steps/s)':<44} {raw_multi:>8,.0f}")
    for name, fps in rows.items():
        unit = "env steps/s" if "1 agent" in name else "agent-steps/s"
        print(f"  {name:<44} {fps:>8,.0f} {unit}")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
