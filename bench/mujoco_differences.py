"""Why continuous control lagged: each difference from CleanRL and stable-baselines3, measured.

On one MuJoCo environment (``--env``, Walker2d-v5 by default) at ``--steps`` (300k), 3 seeds
each, ``--jobs`` at a time: ``ppo_continuous`` as it shipped (Pendulum's settings), then one
difference from the references removed at a time, up to the ``ppo_mujoco`` preset; then the
preset with one of its parts taken away. For each: the deterministic evaluation return (20
episodes of the Gaussian's mean, observations normalised with the frozen training statistics),
the return of training episodes over the last 10% of the budget (CleanRL's metric), training FPS,
and the change in evaluation return from the row it builds on.

The table replaces the part of ``--page`` (``docs/howto/continuous-control.md``) between
``BEGIN`` and ``END``; ``--out`` (``docs/results/``) gets ``mujoco_differences.json``, every
seed's figures. Runs are cached under ``--work`` as ``bench/published.py``'s (``--fresh``
retrains).

``--smoke``: two rows (``shipped``, ``gamma_lr``) with one seed and 2,048 env steps into a
temporary folder, to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/mujoco_differences.py [--env Walker2d-v5] [--steps 300000] [--seeds 1 2 3]
                                       [--jobs 2] [--out docs/results] [--fresh] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import published  # noqa: E402  (the runner: jobs, results, summaries)


@dataclass(frozen=True)
class Variant:
    """A row: what changes, against which row, and the overrides that make it."""

    key: str
    label: str
    experiment: str
    overrides: tuple[str, ...]
    base: str | None  # the row its change is measured against


PENDULUM_TO_CLEANRL = ("pipeline.gamma=0.99", "pipeline.optimizer.lr=3e-4")
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "shipped",
        "`ppo_continuous` as shipped (Pendulum's gamma 0.9, lr 1e-3)",
        "ppo_continuous",
        (),
        None,
    ),
    Variant(
        "gamma_lr",
        "+ gamma 0.99 and lr 3e-4 (CleanRL's, SB3's)",
        "ppo_continuous",
        PENDULUM_TO_CLEANRL,
        "shipped",
    ),
    Variant(
        "preset",
        "+ clip range held at 0.2 (CleanRL's, SB3's), not decayed to 0: `ppo_mujoco`",
        "ppo_mujoco",
        (),
        "gamma_lr",
    ),
    Variant(
        "one_env",
        "`ppo_mujoco` with 1 env x 2,048 steps (CleanRL's, SB3's shape)",
        "ppo_mujoco",
        ("sampler.num_envs=1", "pipeline.num_steps=2048"),
        "preset",
    ),
    Variant(
        "lr_const",
        "`ppo_mujoco` with lr held at 3e-4 (SB3's default)",
        "ppo_mujoco",
        ("pipeline.lr_scheduler=null",),
        "preset",
    ),
    Variant(
        "no_reward_norm",
        "`ppo_mujoco` without reward normalisation",
        "ppo_mujoco",
        ("normalize.rewards=false",),
        "preset",
    ),
    Variant(
        "no_obs_norm",
        "`ppo_mujoco` without observation normalisation",
        "ppo_mujoco",
        ("normalize.observations=false",),
        "preset",
    ),
)


BEGIN = "<!-- bench/mujoco_differences.py: begin (generated) -->"
END = "<!-- bench/mujoco_differences.py: end -->"


def write_region(page: Path, table: str) -> None:
    """Replace the text between ``BEGIN`` and ``END`` in ``page`` with ``table``."""
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: no {BEGIN!r} ... {END!r} region to write the table into")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")


def folder(work: Path, env_id: str, steps: int, key: str, seed: int) -> Path:
    """A run's folder; the preset's is the side-by-side row's of ``published.py`` (one run)."""
    if key == "preset":
        return published.side_by_side_folder(work, env_id, steps) / f"ours_seed{seed}"
    return work / f"differences_{env_id}_{steps}" / f"{key}_seed{seed}"


def main(argv: list[str] | None = None) -> None:
    """Train every variant's seeds (or reuse them), write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Walker2d-v5")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="+", default=None, choices=[v.key for v in VARIANTS])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument(
        "--page", type=Path, default=ROOT / "docs" / "howto" / "continuous-control.md"
    )
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "published")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--progress", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    command = " ".join(
        ["python bench/mujoco_differences.py", *(sys.argv[1:] if argv is None else argv)]
    )
    tmp = None
    if args.smoke:
        tmp = tempfile.TemporaryDirectory(prefix="differences-smoke-")
        args.seeds, args.steps, args.fresh = [1], published.SMOKE_STEPS, True
        args.work, args.out = Path(tmp.name) / "work", Path(tmp.name) / "out"
        args.page = None
    if args.smoke and args.only is None:  # a row of each experiment, a row that builds on one
        args.only = ["shipped", "gamma_lr"]
    variants = [v for v in VARIANTS if args.only is None or v.key in args.only]
    episodes = 2 if args.smoke else published.EVAL_EPISODES_SIDE
    reference = published.Reference(math.nan, math.nan, "", "eval")
    jobs = [
        published.Job(
            published.Benchmark(args.env, args.steps, v.experiment, reference, v.overrides),
            "ours",
            seed,
            folder(args.work, args.env, args.steps, v.key, seed),
            args.steps,
            episodes,
        )
        for v in variants
        for seed in args.seeds
    ]
    started = time.perf_counter()
    print(f"{len(jobs)} runs, {args.jobs} at a time; runs in {args.work}", flush=True)
    results = published.run_all(jobs, args.jobs, args.fresh, args.progress)
    rows = {}
    for i, variant in enumerate(variants):
        runs = results[i * len(args.seeds) : (i + 1) * len(args.seeds)]
        eval_mean, eval_std = published.summarise([r["final_eval"] for r in runs])
        train_mean, train_std = published.summarise([r["final_train"] for r in runs])
        rows[variant.key] = {
            "label": variant.label,
            "experiment": variant.experiment,
            "overrides": list(variant.overrides),
            "base": variant.base,
            "eval_mean": eval_mean,
            "eval_std": eval_std,
            "eval_seeds": [r["final_eval"] for r in runs],
            "train_mean": train_mean,
            "train_std": train_std,
            "fps": sum(r["fps"] for r in runs) / len(runs),
        }
    lines = [
        f"Made by `{command}`: {args.env}, {args.steps:,} env steps, seeds "
        f"{', '.join(map(str, args.seeds))}, mean +- std over seeds; evaluation: 20 episodes of "
        "the Gaussian's mean; training: the return of training episodes over the last 10% of "
        "the budget; change: the evaluation return's against the row named.",
        "",
        "| setting | eval return | per seed | training return | change in eval return "
        "| training FPS |",
        "|---|---|---|---|---|---|",
    ]
    count = published._count
    for key, row in rows.items():
        base = rows.get(row["base"]) if row["base"] else None
        change = f'{row["eval_mean"] - base["eval_mean"]:+,.0f} vs "{row["base"]}"' if base else ""
        seeds = ", ".join(count(v) for v in row["eval_seeds"])
        lines.append(
            f'| {row["label"]} ("{key}") | {count(row["eval_mean"])} +- {count(row["eval_std"])} '
            f"| {seeds} | {count(row['train_mean'])} +- {count(row['train_std'])} | {change} "
            f"| {count(row['fps'])} |"
        )
    table = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.page is not None:
        write_region(args.page, table)
    payload = {"command": command, "env_id": args.env, "steps": args.steps, "rows": rows}
    (args.out / "mujoco_differences.json").write_text(json.dumps(payload, indent=1))
    print()
    print(table)
    wall = published._clock(time.perf_counter() - started)
    print(f"wrote {args.page or 'no page'} and {args.out / 'mujoco_differences.json'} in {wall}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
