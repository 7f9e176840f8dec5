"""Seconds per 100k env steps with torch's default thread count vs ``torch_threads=auto``.

The shipped experiments and a gym task as a user runs them (``python train.py ...`` in a
subprocess, start-up included, no evaluation), and ``evaluate.py`` on the checkpoints of the
first workload's run, on an otherwise idle machine and with ``--busy N`` CPU-bound processes
running beside it (pure Python loops this script starts and ends by handle). Two variants, run
interleaved (a, b, a, b, ...) so that drift hits both alike:

- by default ``torch_threads=null`` (torch's default: one thread per core) against
  ``torch_threads=auto`` (the default now), on this tree;
- with ``--before REF``: the defaults only (no ``torch_threads`` given) of the tree at git
  ``REF`` (checked out into a temporary worktree, removed at the end) against this tree's.

    python bench/threads.py [--steps 50000] [--busy 2] [--repeats 1] [--out DIR] [--before REF]
    python bench/threads.py --smoke      # tiny budgets, idle only (no CPU-bound process
                                         # beside the suite's tests): checks that it runs
                                         # (tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import shutil
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


@dataclasses.dataclass(frozen=True)
class Variant:
    """What a row's column runs: the tree's ``train.py``/``evaluate.py`` with these overrides."""

    name: str
    tree: Path
    overrides: tuple[str, ...]


THREAD_SETTINGS = (
    Variant("null", ROOT, ("torch_threads=null",)),
    Variant("auto", ROOT, ("torch_threads=auto",)),
)


def _spin() -> None:  # a CPU-bound process: a pure Python loop until terminated
    while True:
        pass


def timed(cmd: list[str], log: Path, cwd: Path = ROOT) -> float:
    """Run ``cmd`` in ``cwd``; its wall seconds (an error if it fails)."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return seconds


def train_cmd(overrides: list[str], variant: Variant, steps: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        *overrides,
        *variant.overrides,
        f"total_env_steps={steps}",
        "eval.num_episodes=0",
        "logger.sinks.console.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]


def measure(
    args: argparse.Namespace, out: Path, label: str, variants: tuple[Variant, ...]
) -> dict[str, dict[str, list[float]]]:
    """Every workload with each variant, interleaved: ``{row: {variant: [s per 100k]}}``."""
    rows: dict[str, dict[str, list[float]]] = {}
    scale = 100_000 / args.steps
    for repeat in range(args.repeats):
        for name, overrides in WORKLOADS:
            for variant in variants:
                tag = f"{label}_{name.split()[0]}_{variant.name}_{repeat}"
                cmd = train_cmd(overrides, variant, args.steps, out / tag)
                seconds = timed(cmd, out / f"{tag}.log", variant.tree)
                rows.setdefault(name, {}).setdefault(variant.name, []).append(seconds * scale)
        # evaluate.py on every checkpoint of the first workload's run of the same variant.
        first = WORKLOADS[0][0].split()[0]
        for variant in variants:
            run_dir = out / f"{label}_{first}_{variant.name}_{repeat}"
            count = len(list((run_dir / "checkpoints").glob("ckpt_*.pt")))
            row = f"evaluate.py, {count} checkpoints x {args.eval_episodes} episodes"
            tag = f"{label}_evaluate_{variant.name}_{repeat}"
            cmd = [
                sys.executable,
                "evaluate.py",
                f"run_dir={run_dir}",
                f"num_episodes={args.eval_episodes}",
                *variant.overrides,
                "plot=false",
                "progress_bar=false",
                f"hydra.run.dir={out / tag}",
            ]
            seconds = timed(cmd, out / f"{tag}.log", variant.tree)
            rows.setdefault(row, {}).setdefault(variant.name, []).append(seconds)
    return rows


def worktree(ref: str, out: Path) -> Path:
    """A git worktree of ``ref`` under ``out`` (removed by :func:`remove_worktree`)."""
    path = out / f"tree_{ref.replace('/', '_')}"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)
    shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per training run")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--before", default=None, help="git ref: its defaults vs this tree's")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.busy, args.eval_episodes = 512, 0, 4
        WORKLOADS[:] = WORKLOADS[1:2]
    out = args.out or Path(tempfile.mkdtemp(prefix="threads_"))
    out.mkdir(parents=True, exist_ok=True)
    before = worktree(args.before, out) if args.before else None
    variants = (
        THREAD_SETTINGS
        if before is None
        else (Variant("before", before, ()), Variant("after", ROOT, ()))
    )
    spinners = [
        mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(args.busy)
    ]
    try:
        results = {"idle": measure(args, out, "idle", variants)}
        if spinners:
            for p in spinners:
                p.start()
            busy = f"busy ({args.busy} CPU-bound processes beside)"
            results[busy] = measure(args, out, "busy", variants)
    finally:
        for p in spinners:  # ours, by handle
            if p.pid is not None:
                p.terminate()
                p.join(timeout=10)
        if before is not None:
            remove_worktree(before)
        if args.out is None:  # (a folder of our own: the runs are measured, nothing to keep)
            shutil.rmtree(out, ignore_errors=True)
    a, b = (v.name for v in variants)
    unit = "s per 100k env steps (training), s per call (evaluate.py)"
    what = (
        f"before: the defaults at {args.before}; after: this tree's"
        if before is not None
        else "torch_threads=null is torch's default (one per core)"
    )
    print(f"\n{unit}; {what}")
    print(f"{'condition':<40} {'workload':<44} {a:>8} {b:>8} {f'{a}/{b}':>11}")
    for condition, rows in results.items():
        for name, by_variant in rows.items():
            first = sum(by_variant[a]) / len(by_variant[a])
            second = sum(by_variant[b]) / len(by_variant[b])
            print(
                f"{condition:<40} {name:<44} {first:>8.1f} {second:>8.1f} {first / second:>10.2f}x"
            )


if __name__ == "__main__":
    main()
