"""Seconds per 100k env steps with torch's default thread count vs ``torch_threads=auto``.

The shipped experiments and a gym task as a user runs them (``python train.py ...`` in a
subprocess, start-up included, no evaluation), and ``evaluate.py`` on two checkpoints, each with
``torch_threads=null`` (torch's default: one thread per core, what the defaults were) and with
``torch_threads=auto`` (the default now), on an otherwise idle machine and with ``--busy N``
CPU-bound processes running beside it (pure Python loops this script starts and ends by pid).
Rows run interleaved (null, auto, null, auto, ...) so that drift hits both alike.

    python bench/threads.py [--steps 50000] [--busy 2] [--repeats 1] [--out DIR]
    python bench/threads.py --smoke      # tiny budgets, busy only: checks that it runs
                                         # (tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (row name, train.py overrides); each trains --steps env steps.
WORKLOADS = [
    ("ppo_nav", ["+experiment=ppo_nav"]),
    ("ppo_cartpole", ["+experiment=ppo_cartpole"]),
    ("Acrobot-v1 (ppo_cartpole)", ["+experiment=ppo_cartpole", "task.env_id=Acrobot-v1"]),
]
SETTINGS = ("null", "auto")


def _spin() -> None:  # a CPU-bound process: a pure Python loop until terminated
    while True:
        pass


def timed(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` from the repository root; its wall seconds (an error if it fails)."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return seconds


def train_cmd(overrides: list[str], threads: str, steps: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        *overrides,
        f"torch_threads={threads}",
        f"total_env_steps={steps}",
        "eval.num_episodes=0",
        "logger.sinks.console.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]


def measure(args: argparse.Namespace, out: Path, label: str) -> dict[str, dict[str, list[float]]]:
    """Every workload with each setting, interleaved: ``{row: {setting: [s per 100k]}}``."""
    rows: dict[str, dict[str, list[float]]] = {}
    scale = 100_000 / args.steps
    for repeat in range(args.repeats):
        for name, overrides in WORKLOADS:
            for threads in SETTINGS:
                tag = f"{label}_{name.split()[0]}_{threads}_{repeat}"
                seconds = timed(
                    train_cmd(overrides, threads, args.steps, out / tag), out / f"{tag}.log"
                )
                rows.setdefault(name, {}).setdefault(threads, []).append(seconds * scale)
        # evaluate.py on every checkpoint of the first workload's first run.
        run_dir = out / f"{label}_{WORKLOADS[0][0].split()[0]}_null_0"
        count = len(list((run_dir / "checkpoints").glob("ckpt_*.pt")))
        row = f"evaluate.py, {count} checkpoints x {args.eval_episodes} episodes"
        for threads in SETTINGS:
            tag = f"{label}_evaluate_{threads}_{repeat}"
            cmd = [
                sys.executable,
                "evaluate.py",
                f"run_dir={run_dir}",
                f"num_episodes={args.eval_episodes}",
                f"torch_threads={threads}",
                "plot=false",
                "progress_bar=false",
                f"hydra.run.dir={out / tag}",
            ]
            seconds = timed(cmd, out / f"{tag}.log")
            rows.setdefault(row, {}).setdefault(threads, []).append(seconds)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per training run")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.busy, args.eval_episodes = 512, 1, 4
        WORKLOADS[:] = WORKLOADS[1:2]
    out = args.out or Path(tempfile.mkdtemp(prefix="threads_"))
    out.mkdir(parents=True, exist_ok=True)
    results = {} if args.smoke else {"idle": measure(args, out, "idle")}
    spinners = [
        mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(args.busy)
    ]
    for p in spinners:
        p.start()
    try:
        results[f"busy ({args.busy} CPU-bound processes beside)"] = measure(args, out, "busy")
    finally:
        for p in spinners:  # ours, by handle
            p.terminate()
            p.join(timeout=10)
    unit = "s per 100k env steps (training), s per call (evaluate.py)"
    print(f"\n{unit}; torch_threads=null is torch's default (one per core)")
    print(f"{'condition':<40} {'workload':<44} {'null':>8} {'auto':>8} {'null/auto':>9}")
    for condition, rows in results.items():
        for name, by_setting in rows.items():
            null = sum(by_setting["null"]) / len(by_setting["null"])
            auto = sum(by_setting["auto"]) / len(by_setting["auto"])
            print(f"{condition:<40} {name:<44} {null:>8.1f} {auto:>8.1f} {null / auto:>8.2f}x")


if __name__ == "__main__":
    main()
