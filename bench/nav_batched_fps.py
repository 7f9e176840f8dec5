"""Raw steps/s of the batched grid PointNav (``BatchedPointNav``) against the serial sampler.

Both run ``conf/task/nav.yaml``'s PointNav (19x19, 2x2 rooms, 100 steps, split train), with
uniformly random actions over the four actions drawn in advance (STOP included: about a quarter
of the environments end their episode each step and start the next one), no policy, and
``--threads`` torch threads (1 by default), one row after another in the same process:

(a) the serial sampler over 16 ``PointNavEnv`` (``bench/sampler_fps.py``'s raw row, its code);
(b) ``BatchedPointNav.step`` (``rl_envs/pointnav/batched.py``, what ``sampler=batched`` steps) at
    16, 256, 1,024 and 4,096 environments (``--envs``), each for ``--seconds`` after 16 warm-up
    steps: every row includes the refills of the environments' random streams, which happen
    every few hundred steps.

Printed: steps/s, ms per step and the ratio to (a), then the ratio at 1,024 environments (the
largest measured where that is not).

``--smoke``: rows of 0.3 s at 16 and 64 environments: to check that the benchmark runs
(``tests/test_bench.py``), not to measure.

    python bench/nav_batched_fps.py [--seconds 5] [--envs 16 256 1024 4096] [--threads 1]
                                    [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import sampler_fps  # noqa: E402  (this folder's sibling benchmark: the serial raw row)

from rl_envs.pointnav.batched import BatchedPointNav  # noqa: E402

ENVS = [16, 256, 1024, 4096]
SMOKE_ENVS = [16, 64]
ACTION_BATCHES = 256  # distinct action batches, drawn in advance and cycled
WARMUP_STEPS = 16


def task_kwargs() -> dict[str, Any]:
    """``conf/task/nav.yaml``'s PointNav arguments (those BatchedPointNav takes)."""
    task = dict(sampler_fps.TASK)
    task.pop("_target_")
    task.pop("observations", None)
    return task


def batched_fps(num_envs: int, seconds: float) -> tuple[float, float]:
    """Env steps/s and ms per step of ``BatchedPointNav`` at ``num_envs``, random actions."""
    env = BatchedPointNav(**task_kwargs(), num_envs=num_envs, device="cpu")
    env.reset(list(range(num_envs)))
    rng = np.random.default_rng(0)
    actions = torch.from_numpy(rng.integers(0, 4, size=(ACTION_BATCHES, num_envs)))
    for t in range(WARMUP_STEPS):
        env.step(actions[t])
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % ACTION_BATCHES])
        steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs / elapsed, elapsed / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per row")
    parser.add_argument("--envs", type=int, nargs="+", default=ENVS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    seconds, envs = (0.3, SMOKE_ENVS) if args.smoke else (args.seconds, args.envs)
    torch.set_num_threads(args.threads)

    print(
        f"raw environment steps/s, PointNav 19x19 (conf/task/nav.yaml), uniformly random "
        f"actions, no policy, {args.threads} torch thread(s), {os.cpu_count()} CPUs, "
        f"{seconds:g} s a row"
    )
    serial = sampler_fps.raw_fps("serial", 0, seconds)
    step_ms = sampler_fps.NUM_ENVS / serial * 1e3
    label = f"serial sampler, {sampler_fps.NUM_ENVS} PointNavEnv"
    print(f"  {label:<34} {serial:>11,.0f} steps/s  {step_ms:7.3f} ms/step  {1:6.1f}x", flush=True)
    results = {}
    for num_envs in envs:
        fps, ms = batched_fps(num_envs, seconds)
        results[num_envs] = fps
        label = f"BatchedPointNav, {num_envs:,} envs"
        print(f"  {label:<34} {fps:>11,.0f} steps/s  {ms:7.3f} ms/step  {fps / serial:6.1f}x")
    at = 1024 if 1024 in results else max(results)
    print(f"  BatchedPointNav {at:,} envs / serial sampler: {results[at] / serial:.1f}x")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
