"""Env steps to reach evaluation success >= 0.9 on 19x19 PointNav, per experiment and seed.

Each run trains an experiment as shipped, evaluating the policy every ``--eval-interval`` env
steps on evaluate.py's fixed 200 episodes (sampled actions); its last stage stops early once
``eval/success >= --target``. The figure reported is the env step of the first evaluation at or
above the target (so it is resolved to ``--eval-interval``).

``--smoke``: every experiment, one seed, with tiny budgets (``+debug=smoke``'s 4 envs x 16-step
rollouts, 256 env steps split evenly over the stages, evaluations of 4 episodes every 128
steps, bc_offline_ppo_nav's expert data generated small inside ``--out``, a temporary folder
unless given): to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/learning_comparison.py [--seeds 1 2] [--experiments ppo_nav dagger_ppo_nav ...]
                                        [--eval-episodes 200] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAST_STAGE = {"ppo_nav": 0, "dagger_ppo_nav": 1, "bc_offline_ppo_nav": 1, "a2c_nav": 0}
# --smoke's defaults (flags given explicitly still win) and its budget per run.
SMOKE = {"seeds": [1], "eval_interval": 128, "eval_episodes": 4}
SMOKE_STEPS = 256


def smoke_overrides(experiment: str, out: Path) -> list[str]:
    """``--smoke``: ``+debug=smoke``'s sizes and 256 env steps split evenly over the stages."""
    stages = LAST_STAGE[experiment] + 1
    overrides = [
        "+debug=smoke",
        f"total_env_steps={SMOKE_STEPS}",
        *(f"pipeline.stages.{i}.max_stage_steps={SMOKE_STEPS // stages}" for i in range(stages)),
    ]
    if experiment == "bc_offline_ppo_nav":  # a small expert data set, in `out`, not data/
        data = "pipeline.stages.0.offpolicy_component.data_iterator"
        overrides += [f"{data}.path={out / 'expert.npz'}", f"{data}.generate.num_episodes=50"]
    return overrides


def run(
    experiment: str,
    seed: int,
    target: float,
    interval: int,
    out: Path,
    eval_episodes: int = 200,
    extra: tuple[str, ...] = (),
) -> dict:
    run_dir = out / f"{experiment}_seed{seed}"
    stop = (
        f"+pipeline.stages.{LAST_STAGE[experiment]}.early_stopping_criterion="
        f"{{_target_:rl.pipeline.MetricThresholdCriterion,metric:eval/success,threshold:{target}}}"
    )
    start = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            f"+experiment={experiment}",
            f"seed={seed}",
            f"eval.interval={interval}",
            f"eval.num_episodes={eval_episodes}",
            stop,
            *extra,
            "logger.sinks.console.progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{experiment} seed {seed} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["env_step"], r["eval/success"]) for r in records if "eval/success" in r]
    reached = next((step for step, success in evals if success >= target), None)
    return {
        "experiment": experiment,
        "seed": seed,
        "steps_to_target": reached,
        "final_step": records[-1]["env_step"],
        "eval_curve": evals,
        "wall_minutes": (time.time() - start) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", default=list(LAST_STAGE))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--eval-interval", type=int, default=25_000)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: outputs/bench_learning (--smoke: a temp)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.smoke and args.out is None:
        with tempfile.TemporaryDirectory(prefix="learning_comparison_") as tmp:
            compare(args, Path(tmp))
    else:
        compare(args, (args.out or ROOT / "outputs" / "bench_learning").resolve())


def compare(args: argparse.Namespace, out: Path) -> None:
    """Run every experiment and seed into ``out``; print the table."""
    results = []
    for experiment in args.experiments:
        extra = tuple(smoke_overrides(experiment, out)) if args.smoke else ()
        for seed in args.seeds:
            result = run(
                experiment, seed, args.target, args.eval_interval, out, args.eval_episodes, extra
            )
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "eval_curve"}), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"\nenv steps to eval success >= {args.target} ({args.eval_episodes} episodes, sampled "
        f"actions, evaluated every {args.eval_interval:,} steps)"
    )
    for experiment in args.experiments:
        rows = [r for r in results if r["experiment"] == experiment]
        cells = [
            f"{r['steps_to_target']:,}" if r["steps_to_target"] else f"not by {r['final_step']:,}"
            for r in rows
        ]
        wall = sum(r["wall_minutes"] for r in rows) / len(rows)
        print(
            f"  {experiment:<20} "
            + "  ".join(f"{c:>16}" for c in cells)
            + f"   ({wall:.1f} min/run)"
        )


if __name__ == "__main__":
    main()
