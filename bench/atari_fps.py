"""Atari throughput: both forms of ``task=atari`` raw, and ``ppo_atari`` against CleanRL's.

Breakout (``--game``), 8 environments, CleanRL's ``ppo_atari_envpool.py`` settings:

(a) raw environment steps/s (agent steps: 4 frames each), uniformly random actions, no policy:
    the per-environment form (``make_atari_env``) stepped by the serial sampler; its batched
    twin (ale-py's ``AtariVectorEnv`` through ``AtariGames``, C++ threads) stepped by the
    batched sampler, as ``+experiment=ppo_atari`` does; ale-py's ``AtariVectorEnv`` alone (what
    the adapter, our episodic life and the channels-last copy cost); envpool 1.2.5 alone
    (CleanRL's environments, in the reference environment below); and the cost of the
    twin's channels-last copy of a step's frame stacks ``[8, 4, 84, 84] -> [8, 84, 84, 4]``.
(b) training FPS, the same env steps each, seed 1, ``--torch-threads`` torch threads each, on
    ``--device``: ``python train.py +experiment=ppo_atari`` and CleanRL's
    ``ppo_atari_envpool.py`` (``bench/reference/``: the fetched file, its logging local, adapted
    to envpool 1.2.5's gymnasium API), each in its own process. FPS = env steps / wall time
    over the last three quarters of the steps (the first quarter is warm-up: ours from its
    metrics, CleanRL's from the cumulative ``SPS:`` it prints every iteration); wall = the
    whole process, start-up included.

CleanRL's script needs envpool, which the project does not lock: it runs in a throwaway
virtual environment (``--venv``, under ``outputs/`` by default) made over this interpreter with
``--system-site-packages`` and a ``.pth`` file naming this environment's site-packages (a venv
made from a venv sees the base interpreter's packages, not the venv's), so torch, numpy,
gymnasium and tensorboard are the project's; pip installs ``envpool==1.2.5`` (with its assets:
about 750 MB) and ``tyro`` there only. A full run makes it where it is missing;
``--setup-reference`` only makes it. Delete the folder to start afresh.

``--smoke``: raw rows of 0.25 s, 256 training steps each (two rollouts of 8 envs x 16 steps, FPS
over the second), CleanRL's rows only where the reference environment exists (else ``n/a``,
saying how to make it): to check that the benchmark runs (``tests/test_bench.py``), not to
measure.

    python bench/atari_fps.py [--steps 102400] [--raw-seconds 5] [--torch-threads 1]
                              [--device cpu|cuda] [--game breakout] [--venv PATH]
                              [--setup-reference] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "bench" / "reference" / "ppo_atari_envpool.py"
VENV = ROOT / "outputs" / "bench" / "envpool-1.2.5-venv"
# What CleanRL's script needs that the project's environment lacks (tyro: its command line).
REFERENCE_PACKAGES = ["envpool==1.2.5", "tyro==1.0.17"]
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 8, 128, 4, 4  # ppo_atari's, CleanRL's
SMOKE_NUM_STEPS = 16
SMOKE = {"steps": NUM_ENVS * SMOKE_NUM_STEPS * 2, "raw_seconds": 0.25}


# ------------------------------------------------------------------------------ (a) raw
def raw_fps(kind: str, game: str, seconds: float) -> float:
    """Agent steps/s of 8 environments with random actions (drawn in advance), no policy."""
    from rl.sampling import BatchedSampler, SerialSampler

    task = {"_target_": "rl_envs.atari.make_atari_env", "game": game}
    actions = np.random.default_rng(0).integers(0, 4, size=(4096, NUM_ENVS))
    env: Any
    if kind == "ale":
        from ale_py.vector_env import AtariVectorEnv

        from rl_envs.atari import rom_name

        env = AtariVectorEnv(rom_name(game), NUM_ENVS)
        env.reset(seed=np.arange(NUM_ENVS))
        step = env.step
    else:
        sampler_class = SerialSampler if kind == "serial" else BatchedSampler
        kwargs = {"device": "cpu"} if kind != "serial" else {}
        env = sampler_class(task=task, num_envs=NUM_ENVS, seed=0, **kwargs)
        env.reset()
        step = env.step
    try:
        for t in range(20):  # warm-up
            step(actions[t])
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step(actions[steps % 4096])
            steps += 1
        return steps * NUM_ENVS / (time.perf_counter() - start)
    finally:
        env.close()


def channels_last_us() -> float:
    """Microseconds of the twin's channels-last copy of one step's frame stacks."""
    from rl_envs.atari import _channels_last

    stacks = np.random.default_rng(0).integers(0, 255, (NUM_ENVS, 4, 84, 84), dtype=np.uint8)
    _channels_last(stacks)
    start = time.perf_counter()
    for _ in range(1000):
        _channels_last(stacks)
    return (time.perf_counter() - start) * 1e3


ENVPOOL_RAW = """
import sys, time, numpy as np, envpool
game, seconds = sys.argv[1], float(sys.argv[2])
envs = envpool.make(game, env_type="gymnasium", num_envs=8, episodic_life=True, reward_clip=True,
                    seed=1)
envs.reset()
actions = np.random.default_rng(0).integers(0, 4, size=(4096, 8)).astype(np.int32)
for t in range(20):
    envs.step(actions[t])
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    envs.step(actions[steps % 4096])
    steps += 1
print(steps * 8 / (time.perf_counter() - start))
"""


def envpool_raw_fps(python: Path, game: str, seconds: float) -> float:
    """envpool's agent steps/s, 8 environments (in the reference environment)."""
    out = subprocess.run(
        [str(python), "-c", ENVPOOL_RAW, envpool_id(game), str(seconds)],
        capture_output=True,
        text=True,
        timeout=120 + seconds,
        check=True,
    )
    return float(out.stdout.split()[-1])


def envpool_id(game: str) -> str:
    from rl_envs.atari import gym_id

    return gym_id(game).removeprefix("ALE/")  # Breakout-v5


# ---------------------------------------------------------------- reference environment
def reference_python(venv: Path, create: bool) -> tuple[Path | None, str]:
    """The reference environment's python (made where missing if ``create``), or why none."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import envpool, tyro, torch"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python, ""
    if not create:
        return None, (
            f"no reference environment at {venv}; make it: python bench/atari_fps.py "
            "--setup-reference"
        )
    print(f"making the reference environment {venv} (pip: {' '.join(REFERENCE_PACKAGES)})")
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True
        )
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        (Path(site) / "_project_site_packages.pth").write_text("\n".join(sorted(ours)) + "\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *REFERENCE_PACKAGES],
            check=True,
            timeout=1800,
        )
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"the reference environment could not be made ({type(e).__name__}: {e})"
    return python, ""


# ------------------------------------------------------------------------ (b) training
def train_ours(
    game: str, steps: int, num_steps: int, threads: int, device: str
) -> tuple[float, float]:
    """``python train.py +experiment=ppo_atari``: (FPS over the last 3/4, wall seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "train.py",
            "+experiment=ppo_atari",
            f"task.game={game}",
            f"total_env_steps={steps}",
            f"pipeline.num_steps={num_steps}",
            f"pipeline.metric_accumulate_interval={steps // 4}",
            "pipeline.save_interval=0",
            "eval.num_episodes=0",
            f"torch_threads={threads}",
            f"device={device}",
            "seed=1",
            "logger.sinks.console.progress_bar=false",
            "logger.sinks.console.summary_every=0",
            f"hydra.run.dir={tmp}/run",
        ]
        env = {**os.environ, "WANDB_MODE": "disabled"}
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        records = [
            json.loads(line)
            for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        ]
    records = [r for r in records if "charts/SPS" in r]
    first, last = records[0], records[-1]
    fps = (last["env_step"] - first["env_step"]) / (last["wall_time"] - first["wall_time"])
    return fps, wall


def train_cleanrl(
    python: Path, game: str, steps: int, num_steps: int, threads: int, device: str
) -> tuple[float, float]:
    """CleanRL's ``ppo_atari_envpool.py``: (FPS over the last 3/4, wall seconds)."""
    batch = NUM_ENVS * num_steps
    with tempfile.TemporaryDirectory() as tmp:  # (its runs/ folder)
        cmd = [
            str(python),
            str(REFERENCE),
            f"--env-id={envpool_id(game)}",
            f"--total-timesteps={steps}",
            f"--num-envs={NUM_ENVS}",
            f"--num-steps={num_steps}",
            "--seed=1",
            "--cuda" if device.startswith("cuda") else "--no-cuda",
        ]
        # torch's intra-op threads (CleanRL's script does not set them)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    sps = [int(v) for v in re.findall(r"^SPS: (\d+)$", out.stdout, re.MULTILINE)]
    # Iteration k (from 1) ends at global step k * batch, SPS_k = that / seconds since start.
    done = [(k + 1) * batch for k in range(len(sps))]
    seconds = [s / max(v, 1) for s, v in zip(done, sps, strict=True)]
    q = max(0, (steps // 4) // batch - 1)  # the iteration at the first quarter (ours' first log)
    fps = (done[-1] - done[q]) / (seconds[-1] - seconds[q]) if len(sps) > q + 1 else float("nan")
    return fps, wall


# ------------------------------------------------------------------------------- main
def _fig(value: float | None, unit: str) -> str:
    if value is None or value != value:
        return f"{'n/a':>9} {unit}"
    return f"{value:>9,.0f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=NUM_ENVS * NUM_STEPS * 100)
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--game", default="breakout")
    parser.add_argument("--venv", type=Path, default=VENV)
    parser.add_argument("--setup-reference", action="store_true", help="make --venv, exit")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    num_steps = NUM_STEPS
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        num_steps = SMOKE_NUM_STEPS
    if args.setup_reference:
        python, why = reference_python(args.venv, create=True)
        print(python or why)
        sys.exit(0 if python else 1)
    python, why = reference_python(args.venv, create=not args.smoke)
    from rl_envs.atari import gym_id

    print(
        f"Atari throughput, {gym_id(args.game)}, {NUM_ENVS} environments; machine: "
        f"{psutil.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.2f}"
    )

    print("(a) raw environment steps/s (agent steps, 4 frames each), random actions, no policy")
    twin = raw_fps("batched", args.game, args.raw_seconds)
    raw = {
        "per-env form, serial sampler": raw_fps("serial", args.game, args.raw_seconds),
        "batched twin, batched sampler": twin,
        "ale-py AtariVectorEnv alone": raw_fps("ale", args.game, args.raw_seconds),
        "envpool 1.2.5 alone (CleanRL's)": (
            envpool_raw_fps(python, args.game, args.raw_seconds) if python else None
        ),
    }
    for name, value in raw.items():
        print(f"  {name:<48} {_fig(value, 'steps/s')}")
    copy_us = channels_last_us()
    twin_step_us = 1e6 * NUM_ENVS / twin
    print(
        f"  channels-last copy of a step's frames: {copy_us:,.0f} us "
        f"({copy_us / twin_step_us:.1%} of a twin step)"
    )

    print(
        f"(b) training FPS, {args.steps:,} env steps each ({NUM_ENVS} envs x {num_steps} steps, "
        f"{EPOCHS} epochs x {MINIBATCHES} minibatches), seed 1, {args.torch_threads} torch "
        f"thread(s), {args.device}"
    )
    ours_fps, ours_wall = train_ours(
        args.game, args.steps, num_steps, args.torch_threads, args.device
    )
    print(f"  {'ours +experiment=ppo_atari (sampler=batched)':<48} {_fig(ours_fps, 'FPS')}   "
          f"wall {ours_wall:,.1f} s")  # fmt: skip
    ref_fps = ref_wall = None
    if python is not None:
        ref_fps, ref_wall = train_cleanrl(
            python, args.game, args.steps, num_steps, args.torch_threads, args.device
        )
    wall = "n/a" if ref_wall is None else f"{ref_wall:,.1f}"
    print(f"  {'CleanRL ppo_atari_envpool.py (envpool 1.2.5)':<48} {_fig(ref_fps, 'FPS')}   "
          f"wall {wall} s")  # fmt: skip
    if python is None:
        print(f"  (CleanRL's rows: {why})")
    ratio = "n/a" if not ref_fps else f"{ours_fps / ref_fps:.2f}x"
    print(f"  ours / CleanRL: {ratio}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(json.dumps({"raw": raw, "ours": [ours_fps, ours_wall], "cleanrl": [ref_fps, ref_wall]}))


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
