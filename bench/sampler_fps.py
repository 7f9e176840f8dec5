"""Sampler throughput: the raw environment limit, our training FPS, stable-baselines3's, memory.

Everything runs on the ``ppo_nav`` task (``rl/PointNav-v0``, 19x19) with 16 environments and
the ``ppo_nav`` hyperparameters (128-step rollouts, 4 epochs x 4 minibatches, 1 torch thread):

(a) raw limit: environment steps/s with uniformly random actions and no policy, for the serial
    sampler and several multiprocess layouts;
(o) collection only (policy inference + stepping, no update), synchronous vs double-buffered
    (two samplers over halves of the environments, one stepping while the policy acts on the
    other, as Sample Factory does): does overlapping pay on this machine?
(b) our training FPS (``python train.py +experiment=ppo_nav``) with the memoryless policies
    (``model=mlp``, ``model=nav_cnn``) and the GRU policy, serial vs multiprocess, with the
    trainer's time split (``time/{env,inference,update}_fraction``);
(c) stable-baselines3 PPO on the same registered task, DummyVecEnv and SubprocVecEnv, with the
    equivalent memoryless MLP policy (see ``bench/train_fps.py``);
(m) peak memory of a ``ppo_nav`` training run's whole process tree (RSS summed, and PSS, which
    counts pages shared between the processes once).

``--smoke``: every section with tiny budgets (512 env steps in 16-step rollouts, 0.25 s per raw
and collection row), one multiprocess layout (2 processes), the memoryless MLP only in (o) and
(b), no ``SubprocVecEnv`` row (16 environment processes to start: a printed note says so), the
memory of the serial run only (two rollouts, not four): to check that the benchmark runs
(``tests/test_bench.py``), not to measure.

    python bench/sampler_fps.py [--steps 40960] [--raw-seconds 4] [--skip-sb3] [--quick]
                                [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import train_fps  # noqa: E402  (this folder's sibling benchmark)

NUM_ENVS = train_fps.NUM_ENVS
TASK: dict[str, Any] = yaml.safe_load((ROOT / "conf" / "task" / "nav.yaml").read_text())
MP_LAYOUTS = [(1, 16), (2, 16), (3, 16), (4, 16)]  # (processes, total envs)
SMOKE_MP_LAYOUTS = [(2, 16)]


def make_sampler(kind: str, processes: int = 2, num_envs: int = NUM_ENVS, **kw: Any) -> Any:
    from rl.sampling import MultiprocessSampler, SerialSampler

    if kind == "serial":
        return SerialSampler(task=TASK, num_envs=num_envs, seed=0, **kw)
    return MultiprocessSampler(task=TASK, num_processes=processes, num_envs=num_envs, seed=0, **kw)


# ------------------------------------------------------------------------------ (a) raw
def raw_fps(kind: str, processes: int, seconds: float) -> float:
    """Env steps/s with random actions, no policy (actions drawn in advance)."""
    actions = np.random.default_rng(0).integers(0, 4, size=(4096, NUM_ENVS))
    with make_sampler(kind, processes) as sampler:
        sampler.reset()
        for t in range(50):  # warm-up
            sampler.step(actions[t])
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            sampler.step(actions[steps % 4096])
            steps += 1
        return steps * NUM_ENVS / (time.perf_counter() - start)


# ---------------------------------------------------------------------- (o) overlap
def build_policy(model: str) -> Any:
    from rl.models import build_policy as build
    from rl.tasks import task_spaces

    cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{model}.yaml").read_text())
    torch.manual_seed(0)
    return build(cfg, *task_spaces(TASK)).eval()


def collect_fps(model: str, mode: str, seconds: float, processes: int = 2) -> float:
    """Steps/s of inference + stepping: ``sync`` (one sampler) or ``overlap`` (two halves)."""
    from rl.models import policy_input
    from rl.sampling import MultiprocessSampler

    policy = build_policy(model)
    dev = torch.device("cpu")

    def act(batch: Any, starts: torch.Tensor, state: Any) -> Any:
        """Actions for a sampler's step (or reset) ``TensorDict``: its ``obs``, as collected."""
        obs = {k: v.to(dev, non_blocking=True) for k, v in batch["obs"].items()}
        step = policy.act(policy_input(obs, starts, state))
        return step["actions"].numpy(), step["next_state"]

    with torch.no_grad():
        if mode == "sync":
            with make_sampler("serial" if processes == 0 else "mp", processes) as s:
                b = s.reset()
                hidden = policy.initial_state(NUM_ENVS, dev)
                starts = torch.ones(NUM_ENVS, dtype=torch.bool)
                steps, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    a, hidden = act(b, starts, hidden)
                    b = s.step(a)
                    starts = b["terminated"] | b["truncated"]
                    steps += NUM_ENVS
                return steps / (time.perf_counter() - start)
        half = NUM_ENVS // 2
        per = max(1, processes // 2)
        halves = [
            MultiprocessSampler(
                task=TASK,
                num_processes=per,
                num_envs=half,
                seed=0,
                env_offset=i * half,
                total_envs=NUM_ENVS,
            )
            for i in range(2)
        ]
        try:
            first = [h.reset() for h in halves]
            hid = [policy.initial_state(half, dev) for _ in halves]
            sts = [torch.ones(half, dtype=torch.bool) for _ in halves]
            a0, hid[0] = act(first[0], sts[0], hid[0])
            halves[0].step_async(a0)
            a1, hid[1] = act(first[1], sts[1], hid[1])
            halves[1].step_async(a1)
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for i in (0, 1):  # half i's result arrives while the other half steps
                    b = halves[i].step_wait()
                    sts[i] = b["terminated"] | b["truncated"]
                    a, hid[i] = act(b, sts[i], hid[i])
                    halves[i].step_async(a)
                    steps += half
            return steps / (time.perf_counter() - start)
        finally:
            for h in halves:
                h.close()


# ------------------------------------------------------------------ (b) our training
def ours(model: str, sampler: str, steps: int) -> tuple[float, dict[str, float]]:
    """Training FPS and the last logged time split of ``ppo_nav``."""
    extra = ["sampler=multiprocess", "sampler.num_processes=2"] if sampler == "mp" else []
    fps, last = train_fps.ours(model, steps, extra_overrides=extra, return_record=True)
    split = {k.split("/")[1]: v for k, v in last.items() if k.startswith("time/")}
    return fps, split


# ---------------------------------------------------------------------------- (m) memory
def peak_memory(sampler: str, steps: int) -> tuple[float, float, int]:
    """Peak RSS sum and PSS sum (MiB) of a ppo_nav CLI run's process tree, and its size."""
    extra = ["sampler=multiprocess", "sampler.num_processes=2"] if sampler == "mp" else []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "train.py",
            "+experiment=ppo_nav",
            *extra,
            f"total_env_steps={steps}",
            f"pipeline.num_steps={train_fps.NUM_STEPS}",
            "eval.num_episodes=0",
            "pipeline.save_interval=0",
            "logger.sinks.console.progress_bar=false",
            f"hydra.run.dir={tmp}/run",
        ]
        env = {**os.environ, "WANDB_MODE": "disabled"}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        peak_rss = peak_pss = 0.0
        nproc = 0
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            rss = pss = 0.0
            tree = [root]
            try:
                tree += root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in tree:
                try:
                    info = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            nproc = max(nproc, len(tree))
            time.sleep(0.2)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed with {proc.returncode}")
    return peak_rss / 2**20, peak_pss / 2**20, nproc


# ------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=NUM_ENVS * train_fps.NUM_STEPS * 20)
    parser.add_argument("--raw-seconds", type=float, default=4.0)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--quick", action="store_true", help="raw and collection only")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    mp_layouts = MP_LAYOUTS
    models: tuple[str, ...] = ("mlp", "nav_cnn", "nav_cnn_gru")
    vec_envs: tuple[str, ...] = ("dummy", "subproc")
    memory_runs: tuple[str, ...] = ("serial", "mp")
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**train_fps.SMOKE)
        args = parser.parse_args()
        train_fps.use_smoke_rollouts()
        mp_layouts, models, vec_envs = SMOKE_MP_LAYOUTS, ("mlp",), ("dummy",)
        memory_runs = ("serial",)
    torch.set_num_threads(1)
    print(f"machine: {psutil.cpu_count()} CPUs; task rl/PointNav-v0 (19x19), {NUM_ENVS} envs")
    print(f"load average before: {os.getloadavg()}")

    print("\n(a) raw environment steps/s, random actions, no policy")
    raw = {"serial": raw_fps("serial", 0, args.raw_seconds)}
    print(f"  {'serial (1 process)':<34} {raw['serial']:>9,.0f}")
    for processes, n in mp_layouts:
        name = f"multiprocess {processes} x {n // processes}" + ("" if n % processes == 0 else "~")
        raw[name] = raw_fps("mp", processes, args.raw_seconds)
        print(f"  {name:<34} {raw[name]:>9,.0f}")
    best_raw_name = max(raw, key=raw.__getitem__)
    best_raw = raw[best_raw_name]
    print(f"  raw limit: {best_raw:,.0f} steps/s ({best_raw_name})")

    print("\n(o) collection only (policy inference + stepping, no update), steps/s")
    for model in [m for m in models if m != "nav_cnn_gru"]:
        row = {
            "serial": collect_fps(model, "sync", args.raw_seconds, processes=0),
            "mp 2 sync": collect_fps(model, "sync", args.raw_seconds, processes=2),
            "mp 2 halves overlapped": collect_fps(model, "overlap", args.raw_seconds, 2),
        }
        print(f"  {model:<8} " + "  ".join(f"{k}: {v:,.0f}" for k, v in row.items()))
    if args.quick:
        return

    print(
        f"\n(b) our training FPS, ppo_nav, {args.steps:,} env steps ({NUM_ENVS} envs x "
        f"{train_fps.NUM_STEPS} steps, {train_fps.EPOCHS} epochs x {train_fps.MINIBATCHES} "
        "minibatches, 1 torch thread); time split env/inference/update"
    )
    results: dict[str, float] = {}
    labels = {"mlp": "memoryless MLP", "nav_cnn": "memoryless CNN", "nav_cnn_gru": "GRU"}
    for model in models:
        label = labels[model]
        for sampler in ("serial", "mp"):
            fps, split = ours(model, sampler, args.steps)
            name = f"ours {label} ({model}), {'serial' if sampler == 'serial' else 'mp 2x8'}"
            results[name] = fps
            parts = " ".join(f"{k.removesuffix('_fraction')}={v:.2f}" for k, v in split.items())
            print(f"  {name:<44} {fps:>8,.0f} FPS   {parts}")

    sb3_best = 0.0
    if not args.skip_sb3:
        print("\n(c) stable-baselines3 PPO, same task/env count/hyperparameters, MLP policy")
        for vec in vec_envs:
            fps = train_fps.sb3(args.steps, vec_env=vec)
            sb3_best = max(sb3_best, fps)
            print(f"  {'stable-baselines3 ' + vec + 'VecEnv':<44} {fps:>8,.0f} FPS")
        if args.smoke:
            print("  (--smoke: no SubprocVecEnv row, its 16 environment processes take long)")

    print("\n(m) peak memory of a ppo_nav training run (whole process tree)")
    for sampler in memory_runs:
        rollouts = 2 if args.smoke else 4
        rss, pss, nproc = peak_memory(sampler, rollouts * NUM_ENVS * train_fps.NUM_STEPS)
        print(
            f"  {sampler:<8} {nproc} processes: peak RSS sum {rss:,.0f} MiB, "
            f"peak PSS sum {pss:,.0f} MiB"
        )

    best_name = max((k for k in results if "memoryless" in k), key=results.__getitem__)
    best = results[best_name]
    print("\nsummary")
    print(f"  best memoryless training FPS: {best:,.0f} ({best_name})")
    print(f"  raw limit: {best_raw:,.0f} -> {best / best_raw:.0%} of it (target >= 50%)")
    if sb3_best:
        ratio = best / sb3_best
        print(f"  stable-baselines3 best: {sb3_best:,.0f} -> {ratio:.2f}x (target >= 2x)")
    print(f"load average after: {os.getloadavg()}")
    print(json.dumps({"raw": raw, "train": results, "sb3_best": sb3_best}))


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
