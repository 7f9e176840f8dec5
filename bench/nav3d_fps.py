"""3D PointNav throughput: raw environment steps/s and training FPS by layout.

(a) Raw environment steps/s of ``rl/PointNav3D-v0`` (``conf/task/nav3d.yaml``, train split, 60x80
    RGB) with 16 environments and uniformly random turn/forward actions (no ``STOP``, so episodes
    run to ``max_steps`` and the figure is the stepping cost, resets included at their natural
    rate), no policy:
    - serial: one process steps all 16 (``sampler=serial``);
    - multiprocess: ``sampler=multiprocess`` with 2 worker processes x 8 environments;
    - process workers / Ray workers: 2 collection-worker processes (``collector=process``'s
      backend, or Ray actors as ``collector=ray``) each stepping its own 8 environments in a
      serial sampler, all at once;
    and the mean time of one environment's reset. ``--episodes-per-floorplan K`` sets the
    task's ``episodes_per_floorplan`` in every row (scenes kept for K episodes: cheaper resets).
(b) Training FPS in each layout (sampler or collection workers), over the last three quarters
    of ``--steps`` env steps (``bench/train_fps.py``'s measurement), with the experiments' own
    settings (16 envs x 128 steps, 4 epochs x 4 minibatches, 32-step BPTT chunks, one torch
    thread per process), in the two regimes a run goes through: ``ppo_nav3d`` from scratch (a
    random policy stops after ~4 steps, so resets dominate) and ``dagger_ppo_nav3d``'s imitation
    stage with the expert acting (episodes as long as a navigating agent's). Beside each row, the
    raw limit of the same layout (the same processes and environments, no policy, no learner)
    stepped with that regime's actions, measured in the same run: uniformly random over all four
    actions (what a fresh policy does: the same episode lengths, resets included) or the
    shortest-path expert's; and the training FPS as a share of it.

A layout that switches the experiment's collector (``collector=local`` where the experiments run
``collector=process``) gets that collector's own settings, not the experiment's for its process
workers (``train_fps.compose_run``).

``--smoke``: tiny budgets (4 environments, 128 env steps in 16-step rollouts, 0.25 s of raw
stepping), every raw row of (a); for training, the first regime in the smallest layout of each
kind (serial and multiprocess sampler, 1 process worker (async)), the second in the serial
layout only, each with its raw limit (the serial and multiprocess samplers of (a) step them:
one start-up each): to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/nav3d_fps.py [--raw-seconds 10] [--steps 12288] [--skip-train] [--skip-raw]
                             [--regime short|long] [--episodes-per-floorplan K] [--smoke]
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
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import train_fps  # noqa: E402  (this folder's sibling benchmark)

NUM_ENVS = 16  # --smoke: 4
# --smoke's defaults, and what it sets in every training row: 4 envs x 16-step rollouts (and
# BPTT chunks no longer than a rollout), 2 minibatches.
SMOKE = {"raw_seconds": 0.25, "steps": 128}
SMOKE_TRAIN = [
    "sampler.num_envs=4",
    "pipeline.num_steps=16",
    "pipeline.recurrence=16",
    "pipeline.num_mini_batch=2",
]
TASK: dict[str, Any] = yaml.safe_load((ROOT / "conf" / "task" / "nav3d.yaml").read_text())


# The actions a raw run steps with: random turn/forward (no STOP: episodes run to max_steps, the
# stepping cost), or a regime's: uniformly random over all four (a fresh policy's episodes) or
# the shortest-path expert's (a navigating agent's).
ACTIONS = ("walk", "fresh", "expert")


def _step_for(
    sampler: Any, num_envs: int, seconds: float, actions: str = "walk"
) -> tuple[int, float]:
    """Step ``sampler`` with ``actions`` (one of ``ACTIONS``) for ``seconds``: (steps, elapsed)."""
    high = 3 if actions == "walk" else 4
    table = np.random.default_rng(0).integers(0, high, size=(4096, num_envs))
    expert = sampler.reset()["expert_actions"].numpy()  # nav3d's step field (rl.tasks.fields)

    def act(t: int) -> np.ndarray:
        # -1: an environment without an expert action (none here): forward.
        return np.where(expert < 0, 2, expert) if actions == "expert" else table[t % 4096]

    for t in range(20):  # warm-up (textures, first frames)
        expert = sampler.step(act(t))["expert_actions"].numpy()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        expert = sampler.step(act(steps))["expert_actions"].numpy()
        steps += 1
    return steps * num_envs, time.perf_counter() - start


class RawStepper:
    """A collection-worker stand-in: a serial sampler of its own environments, random actions."""

    def __init__(
        self, task: dict[str, Any], num_envs: int, env_offset: int, total_envs: int = NUM_ENVS
    ) -> None:
        from rl.sampling import SerialSampler

        torch.set_num_threads(1)
        self.num_envs = num_envs
        self.sampler = SerialSampler(
            task=task, num_envs=num_envs, seed=0, env_offset=env_offset, total_envs=total_envs
        )

    def pid(self) -> int:
        return os.getpid()

    def run(self, seconds: float, actions: str = "walk") -> tuple[int, float]:
        return _step_for(self.sampler, self.num_envs, seconds, actions)

    def close(self) -> None:
        self.sampler.close()


def reset_ms(resets: int = 200) -> float:
    """Mean wall time of one environment's unseeded reset, milliseconds (after 10 warm-up)."""
    from rl.tasks.factory import build_env

    env = build_env(TASK)
    try:
        env.reset(seed=0)
        for _ in range(10):
            env.reset()
        start = time.perf_counter()
        for _ in range(resets):
            env.reset()
        return (time.perf_counter() - start) / resets * 1000
    finally:
        env.close()


def raw_in_process(
    kind: str, seconds: float, actions: str = "walk", kept: dict[str, Any] | None = None
) -> float:
    """Raw steps/s of a ``serial`` or ``multiprocess`` sampler of ``NUM_ENVS`` environments.

    ``kept`` (``--smoke``): samplers by kind, each started once and left open for the next
    call of its kind (the caller closes them); None: a sampler of its own, closed after.
    """
    from rl.sampling import MultiprocessSampler, SerialSampler

    sampler: Any = None if kept is None else kept.get(kind)
    if sampler is None:
        if kind == "serial":
            sampler = SerialSampler(task=TASK, num_envs=NUM_ENVS, seed=0)
        else:
            sampler = MultiprocessSampler(task=TASK, num_processes=2, num_envs=NUM_ENVS, seed=0)
        if kept is not None:
            kept[kind] = sampler
    if kept is not None:
        steps, elapsed = _step_for(sampler, NUM_ENVS, seconds, actions)
        return steps / elapsed
    with sampler:
        steps, elapsed = _step_for(sampler, NUM_ENVS, seconds, actions)
    return steps / elapsed


def raw_workers(
    backend: str,
    seconds: float,
    workers: int = 2,
    actions: str = "walk",
    task: dict[str, Any] | None = None,
    num_envs: int | None = None,
) -> float:
    """Steps/s of ``workers`` actors stepping at once: their steps / the wall time of all.

    ``task`` and ``num_envs`` (split evenly over the workers): default this file's ``TASK`` and
    ``NUM_ENVS`` (``bench/gpu_box.py`` passes an experiment's task and layout).
    """
    from rl.collection.hosts import ProcessHosts, RayHosts

    total = NUM_ENVS if num_envs is None else num_envs
    per = total // workers
    task = TASK if task is None else task
    kwargs = [
        {"task": task, "num_envs": per, "env_offset": i * per, "total_envs": total}
        for i in range(workers)
    ]
    if backend == "ray":
        hosts: Any = RayHosts(
            RawStepper, kwargs, address=None, cpus_per_worker=1, start_timeout=300
        )
    else:
        hosts = ProcessHosts(RawStepper, kwargs, start_timeout=300)
    try:
        for i in range(workers):  # warm-up (textures, first frames), then all at once
            hosts.get(hosts.call(i, "run", min(1.0, seconds), actions), i)
        start = time.perf_counter()
        calls = [hosts.call(i, "run", seconds, actions) for i in range(workers)]
        results = [hosts.get(c, i) for i, c in enumerate(calls)]
        elapsed = time.perf_counter() - start
    finally:
        hosts.close(timeout=60)
        if backend == "ray":
            import ray

            ray.shutdown()
    return sum(s for s, _ in results) / elapsed


# Training layouts: what each adds to the experiment's own config.
LAYOUTS: dict[str, list[str]] = {
    "serial sampler, in-process": ["sampler=serial", "collector=local"],
    "multiprocess sampler (2 procs)": [
        "sampler=multiprocess",
        "sampler.num_processes=2",
        "collector=local",
    ],
    "1 process worker, async": ["collector=process", "collector.num_workers=1"],
    "2 process workers, sync": [
        "collector=process",
        "collector.num_workers=2",
        "collector.mode=sync",
    ],
    "2 process workers, async": ["collector=process", "collector.num_workers=2"],
    "2 Ray workers, sync": [
        "collector=ray",
        "collector.mode=sync",
        "collector.num_workers=2",
        "collector.cpus_per_worker=1",
    ],
}
# The raw layout of each training layout: the same processes stepping the same environments.
RAW_LAYOUT: dict[str, tuple[str, int]] = {
    "serial sampler, in-process": ("serial", 1),
    "multiprocess sampler (2 procs)": ("multiprocess", 2),
    "1 process worker, async": ("process", 1),
    "2 process workers, sync": ("process", 2),
    "2 process workers, async": ("process", 2),
    "2 Ray workers, sync": ("ray", 2),
}
# --smoke's layouts, by regime: the first regime in the smallest layout of each kind (each
# sampler, process workers; Ray's raw row is in (a)), the second in the first layout only.
SMOKE_LAYOUTS = [
    [
        "serial sampler, in-process",
        "multiprocess sampler (2 procs)",
        "1 process worker, async",
    ],
    ["serial sampler, in-process"],
]


def raw(
    kind: str,
    workers: int,
    seconds: float,
    actions: str = "walk",
    kept: dict[str, Any] | None = None,
) -> float:
    """Raw steps/s of a layout: ``kind`` (``RAW_LAYOUT``'s) with ``workers`` processes.

    ``kept``: ``raw_in_process``'s (the in-process layouts' samplers, reused).
    """
    if kind in ("serial", "multiprocess"):
        return raw_in_process(kind, seconds, actions, kept)
    return raw_workers(kind, seconds, workers, actions)


def regimes(steps: int) -> dict[str, tuple[str, str, list[str]]]:
    """The two episode-length regimes training goes through: (experiment, the raw limit's
    actions, the experiment's overrides)."""
    return {
        # A fresh policy takes STOP a quarter of the time: episodes of ~4 steps, resets dominate.
        "ppo_nav3d from scratch (short episodes)": ("ppo_nav3d", "fresh", []),
        # The expert acts (teacher forcing 1): episodes as long as a navigating agent's.
        "dagger_ppo_nav3d imitation (expert-length episodes)": (
            "dagger_ppo_nav3d",
            "expert",
            [
                "pipeline.stages=[{_target_:rl.pipeline.PipelineStage,loss_names:[imitation],"
                f"max_stage_steps:{steps},teacher_forcing:{{_target_:rl.pipeline.LinearDecay,"
                "steps:1,startp:1.0,endp:1.0}}]"
            ],
        ),
    }


def main() -> None:
    global NUM_ENVS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=NUM_ENVS * 128 * 6)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--regime", choices=("short", "long"), default=None, help="only this one")
    parser.add_argument(
        "--episodes-per-floorplan",
        type=int,
        default=TASK.get("episodes_per_floorplan", 1),
        help="the task's episodes_per_floorplan, in every row (default: conf/task/nav3d.yaml's)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        NUM_ENVS = 4
    torch.set_num_threads(1)
    # --smoke: the in-process samplers of (a) measure their layouts' raw limits in (b) too
    # (one start-up each; a full run starts a fresh one for each figure).
    kept: dict[str, Any] | None = {} if args.smoke else None
    try:
        measure(args, kept)
    finally:
        for sampler in (kept or {}).values():
            sampler.close()


def measure(args: argparse.Namespace, kept: dict[str, Any] | None) -> None:
    """(a) and (b) as ``args`` ask; ``kept``: ``raw_in_process``'s."""
    TASK["episodes_per_floorplan"] = args.episodes_per_floorplan
    task_override = [f"task.episodes_per_floorplan={args.episodes_per_floorplan}"]
    half = f"2 x {NUM_ENVS // 2} envs"
    stepping = (
        {}
        if args.skip_raw
        else {
            f"serial (1 process, {NUM_ENVS} envs)": raw("serial", 1, args.raw_seconds, kept=kept),
            f"multiprocess sampler ({half})": raw("multiprocess", 2, args.raw_seconds, kept=kept),
            f"process workers ({half})": raw("process", 2, args.raw_seconds),
            f"Ray workers ({half})": raw("ray", 2, args.raw_seconds),
        }
    )
    if stepping:
        print(
            f"\n(a) raw steps/s, rl/PointNav3D-v0, {NUM_ENVS} envs, random turn/forward actions, "
            f"episodes_per_floorplan={args.episodes_per_floorplan}"
        )
        for name, value in stepping.items():
            print(f"  {name:<40} {value:>8,.0f} steps/s")
        resets = 20 if args.smoke else 200
        print(f"  {f'reset (mean of {resets}, one env)':<40} {reset_ms(resets):>8.2f} ms")
    if args.skip_train:
        return
    for i, (regime, (experiment, actions, extra)) in enumerate(regimes(args.steps).items()):
        if args.regime and not regime.startswith("ppo" if args.regime == "short" else "dagger"):
            continue
        fps: dict[str, float] = {}
        limits: dict[tuple[str, int], float] = {}  # raw limit by raw layout, this regime
        for name, overrides in LAYOUTS.items():
            if args.smoke and name not in SMOKE_LAYOUTS[i]:
                continue
            smoke = SMOKE_TRAIN if args.smoke else []
            fps[name] = train_fps.ours(
                None,
                args.steps,
                [*smoke, *overrides, *task_override, *extra],
                experiment=experiment,
            )
            layout = RAW_LAYOUT[name]
            if layout not in limits:
                limits[layout] = raw(*layout, args.raw_seconds, actions, kept)
            print(
                f"  ... {regime}, {name}: {fps[name]:,.0f} FPS, raw {limits[layout]:,.0f}",
                flush=True,
            )
        print(
            f"\n(b) {regime}: training FPS, {args.steps:,} env steps each (last 3/4), and the "
            f"raw limit of the same layout ({actions} actions)"
        )
        for name, value in fps.items():
            limit = limits[RAW_LAYOUT[name]]
            print(f"  {name:<40} {value:>8,.0f} FPS of {limit:>8,.0f} raw  {value / limit:>4.0%}")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
