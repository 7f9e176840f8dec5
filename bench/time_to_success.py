"""Time to success: how long ``ppo_nav`` (or ``--experiment``) trains before it navigates.

Default mode: each seed runs ``python train.py +experiment=ppo_nav seed=S`` as a user would (a
subprocess, start-up included, its run folder in a temporary directory) with periodic evaluation
on the fixed episode list (``eval.interval``; ``ppo_nav`` evaluates 200 episodes of the held-out
``test`` layouts with sampled actions, the README's settings). For each seed it prints the
training clock and env steps at the first evaluation reaching success >= 0.9 and >= 0.95, the
final success and SPL, and the time spent evaluating. The training clock is wall time since the
process was launched minus the time spent in evaluations: metrics.jsonl records when an
evaluation ended (``wall_time``, counted from when the logger opened, not from launch) but not
how long it took, so the child process runs ``train.py`` with ``TrainingEvaluation.evaluate``
wrapped to write the start and end time of every evaluation (nothing else changes).
``--total-env-steps`` shorter than the experiment's 1M also shortens its LR and clip decay.
``--experiment`` and ``--thresholds`` pick another experiment and success levels (e.g.
``--experiment dagger_ppo_nav3d --override task=nav3d_small --thresholds 0.8``); every
evaluation (the learning curve: env steps, training clock, wall time since launch, success, SPL)
is printed after the summary.

``--sigterm SECONDS``: the user-level check. Each seed runs ``python train.py
+experiment=ppo_nav seed=S`` (no periodic evaluation), gets SIGTERM SECONDS after launch (the
trainer saves a checkpoint at the next rollout boundary and exits with 143) unless it finished
before, then ``python evaluate.py ckpt=<its last checkpoint>`` evaluates it with evaluate.py's
defaults (200 episodes, test split, sampled actions) and ``--evaluate-override KEY=VALUE``
(e.g. ``num_envs=2``, ``device=cuda``); prints env steps reached, success, SPL.

``--smoke`` (either mode): one seed, tiny budgets (``+debug=smoke``'s 4 envs x 16-step rollouts
and 4-episode evaluations, 256 env steps, an evaluation every 128; evaluate.py on 4 episodes),
to check that the benchmark runs (``tests/test_bench.py``), not to measure. For experiments of
one stage (``ppo_nav``'s budget follows ``total_env_steps``).

    python bench/time_to_success.py [--seeds 1 2 3] [--interval 20480] [--total-env-steps N]
                                    [--max-wall SECONDS] [--override KEY=VALUE ...] [--out DIR]
                                    [--experiment NAME] [--thresholds 0.9 0.95] [--smoke]
    python bench/time_to_success.py --sigterm 60 [--seeds 1 2 3] [--override KEY=VALUE ...]
                                    [--evaluate-override KEY=VALUE ...] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHILD_FLAG = "--as-train-with-eval-timing"  # internal: argv[1] of the timed child process
# --smoke's defaults (flags given explicitly still win; --override KEY=VALUE adds to these), and
# what evaluate.py gets in the SIGTERM mode.
SMOKE = {"seeds": [1], "interval": 128, "total_env_steps": 256, "override": ["+debug=smoke"]}
SMOKE_EVALUATE = ["num_episodes=4"]


# ------------------------------------------------------------------- child process
def run_timed_train(timing_file: str, train_args: list[str]) -> None:
    """Run ``train.py train_args`` in this process, appending every evaluation's start and end.

    Each evaluation during (and after) training writes two JSON lines to ``timing_file``:
    ``{"event": "start"|"end", "time": <unix time>, "env_step": N}``.
    """
    from rl.evaluation.training_eval import TrainingEvaluation

    evaluate = TrainingEvaluation.evaluate

    def mark(event: str, env_step: int) -> None:
        line = {"event": event, "time": time.time(), "env_step": env_step}
        with open(timing_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def timed(self: TrainingEvaluation, trainer: Any) -> Any:
        mark("start", trainer.pipeline.total_steps)
        result = evaluate(self, trainer)
        mark("end", trainer.pipeline.total_steps)
        return result

    TrainingEvaluation.evaluate = timed  # type: ignore[method-assign]
    sys.path[0] = str(ROOT)  # what `python train.py` has
    sys.argv = [str(ROOT / "train.py"), *train_args]
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


# ------------------------------------------------------------------------- helpers
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it does not exist yet)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_spans(timing: list[dict[str, Any]]) -> tuple[list[tuple[int, float, float]], float]:
    """Finished evaluations ``(env_step, start, end)``; the start of one still running, or 0."""
    spans: list[tuple[int, float, float]] = []
    open_start = 0.0
    for line in timing:
        if line["event"] == "start":
            open_start = line["time"]
        else:
            spans.append((line["env_step"], open_start, line["time"]))
            open_start = 0.0
    return spans, open_start


def train_clock(now: float, launched: float, timing: list[dict[str, Any]]) -> float:
    """Wall seconds since launch minus the seconds spent in evaluations up to ``now``."""
    spans, open_start = eval_spans(timing)
    in_eval = sum(end - start for _, start, end in spans)
    if open_start:
        in_eval += now - open_start
    return now - launched - in_eval


def launch(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Start ``cmd`` in the repository root with its output in ``log_path``; the launch time."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    log_file = log_path.open("wb")
    launched = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    log_file.close()  # the child holds its own descriptor
    return proc, launched


def check_exit(proc: subprocess.Popen[bytes], ok: tuple[int, ...], log_path: Path) -> None:
    """Raise with the tail of the output if the process ended with another code."""
    if proc.returncode not in ok:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        command = " ".join(str(a) for a in proc.args)  # type: ignore[union-attr]
        raise RuntimeError(f"{command} exited {proc.returncode}:\n{tail}")


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec`` (e.g. ``>10,d``), or a dash of the same width."""
    if value is None:
        return format("-", ">" + re.match(r">?(\d*)", spec).group(1))  # type: ignore[union-attr]
    return format(value, spec)


# --------------------------------------------------------------- time to success
def time_to_success(seed: int, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Train one seed with periodic evaluation; the time and steps to each threshold."""
    run_dir = base / f"seed{seed}"
    timing_path = base / f"seed{seed}.eval_times.jsonl"
    log_path = base / f"seed{seed}.out"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        CHILD_FLAG,
        str(timing_path),
        f"+experiment={args.experiment}",
        f"seed={seed}",
        f"eval.interval={args.interval}",
        f"hydra.run.dir={run_dir}",
        *([f"total_env_steps={args.total_env_steps}"] if args.total_env_steps else []),
        *args.override,
    ]
    proc, launched = launch(cmd, log_path)
    stopped_at_clock: float | None = None
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            if args.max_wall is not None and stopped_at_clock is None:
                clock = train_clock(time.time(), launched, read_jsonl(timing_path))
                if clock > args.max_wall:
                    proc.send_signal(signal.SIGTERM)  # checkpoint at the next rollout, exit 143
                    stopped_at_clock = clock
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.time()
    check_exit(proc, (0, 143) if stopped_at_clock is not None else (0,), log_path)

    spans, _ = eval_spans(read_jsonl(timing_path))
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/success" in r]
    by_step = {r["env_step"]: r for r in records}
    if [s for s, _, _ in spans] != [r["env_step"] for r in records]:
        raise RuntimeError(
            f"seed {seed}: timed evaluations at {[s for s, _, _ in spans]} but eval records at "
            f"{[r['env_step'] for r in records]} in {run_dir / 'metrics.jsonl'}"
        )
    evals = []
    spent = 0.0
    for step, start, end in spans:
        record = by_step[step]
        # The policy evaluated here was ready when the evaluation started.
        evals.append(
            {
                "env_step": step,
                "train_clock": start - launched - spent,
                "wall": end - launched,
                "eval_seconds": end - start,
                "success": record["eval/success"],
                "spl": record.get("eval/spl"),
            }
        )
        spent += end - start
    reached: dict[str, dict[str, float] | None] = {}
    for threshold in args.thresholds:
        first = next((e for e in evals if e["success"] >= threshold), None)
        reached[f"{threshold:g}"] = (
            None
            if first is None
            else {
                "seconds": first["train_clock"],
                "wall": first["wall"],
                "env_step": first["env_step"],
            }
        )
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    last = evals[-1] if evals else None
    return {
        "seed": seed,
        "reached": reached,
        "final": last,
        "train_clock": ended - launched - spent,
        "wall": ended - launched,
        "eval_seconds": spent,
        "num_evals": len(evals),
        "stopped_by_max_wall": stopped_at_clock is not None,
        "evals": evals,
        "eval_settings": config["eval"],
        "total_env_steps": config["total_env_steps"],
    }


def print_time_to_success(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    ev = results[0]["eval_settings"]
    print(
        f"\ntime to evaluation success, {args.experiment} {' '.join(args.override)} (budget "
        f"{results[0]['total_env_steps']:,} env steps), evaluated every {args.interval:,} env "
        f"steps on {ev['num_episodes']} episodes (split {ev['split']}, "
        f"{'argmax' if ev['deterministic'] else 'sampled'} actions); train s = wall time since "
        "launch minus evaluation time; wall s = since launch, to the end of that evaluation"
    )
    header = f"{'seed':>4} | "
    for threshold in args.thresholds:
        label = f">={threshold:.2f}: train s"
        header += f"{label:>15} {'wall s':>8} {'env steps':>10} | "
    header += (
        f"{'final success':>13} {'SPL':>6} {'at step':>10} | "
        f"{'train s':>8} {'evals':>5} {'eval s':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        line = f"{r['seed']:>4} | "
        for threshold in args.thresholds:
            hit = r["reached"][f"{threshold:g}"]
            line += (
                f"{fmt(hit and hit['seconds'], '>15,.1f')} {fmt(hit and hit['wall'], '>8,.1f')} "
                f"{fmt(hit and hit['env_step'], '>10,d')} | "
            )
        final = r["final"] or {}
        stop = " (stopped by --max-wall)" if r["stopped_by_max_wall"] else ""
        print(
            f"{line}{fmt(final.get('success'), '>13.3f')} {fmt(final.get('spl'), '>6.3f')} "
            f"{fmt(final.get('env_step'), '>10,d')} | {r['train_clock']:>8,.1f} "
            f"{r['num_evals']:>5} {r['eval_seconds']:>7,.1f}{stop}"
        )
    for threshold in args.thresholds:
        hits = [r["reached"][f"{threshold:g}"] for r in results]
        got = [h for h in hits if h is not None]
        if got:
            print(
                f"success >= {threshold:g}: reached by {len(got)}/{len(hits)} seeds; median "
                f"{statistics.median(h['seconds'] for h in got):,.1f} s, "
                f"{statistics.median(h['env_step'] for h in got):,.0f} env steps"
            )
        else:
            print(f"success >= {threshold:g}: reached by 0/{len(hits)} seeds")
    total_eval = sum(r["eval_seconds"] for r in results)
    total_evals = sum(r["num_evals"] for r in results)
    print(
        f"total evaluation time: {total_eval:,.1f} s over {total_evals} evaluations "
        f"(excluded from the training clocks); total wall time "
        f"{sum(r['wall'] for r in results):,.1f} s"
    )
    print("\nlearning curves (every evaluation)")
    print(f"{'seed':>4} {'env steps':>10} {'train s':>8} {'wall s':>8} {'success':>8} {'SPL':>6}")
    for r in results:
        for e in r["evals"]:
            print(
                f"{r['seed']:>4} {e['env_step']:>10,d} {e['train_clock']:>8,.1f} "
                f"{e['wall']:>8,.1f} {e['success']:>8.3f} {fmt(e['spl'], '>6.3f')}"
            )


# ------------------------------------------------------------------------ SIGTERM
def sigterm_check(seed: int, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Train one seed, SIGTERM it after ``args.sigterm`` s, evaluate its last checkpoint."""
    from rl.checkpoints.files import latest_checkpoint, parse_checkpoint_name

    run_dir = base / f"seed{seed}"
    log_path = base / f"seed{seed}.out"
    cmd = [
        sys.executable,
        "train.py",
        f"+experiment={args.experiment}",
        f"seed={seed}",
        f"hydra.run.dir={run_dir}",
        *([f"total_env_steps={args.total_env_steps}"] if args.total_env_steps else []),
        *args.override,
    ]
    proc, launched = launch(cmd, log_path)
    signalled: float | None = None
    try:
        proc.wait(timeout=max(0.0, launched + args.sigterm - time.time()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        signalled = time.time()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.time()
    check_exit(proc, (0, 143), log_path)
    checkpoint = latest_checkpoint(run_dir)
    parsed = parse_checkpoint_name(checkpoint)
    env_steps = parsed[1] if parsed is not None else None

    eval_log = base / f"seed{seed}.evaluate.out"
    eval_cmd = [
        sys.executable,
        "evaluate.py",
        f"ckpt={checkpoint}",
        f"hydra.run.dir={base / f'evaluate_seed{seed}'}",
        *(SMOKE_EVALUATE if args.smoke else []),
        *args.evaluate_override,
    ]
    eval_proc, eval_launched = launch(eval_cmd, eval_log)
    eval_proc.wait()
    eval_seconds = time.time() - eval_launched
    check_exit(eval_proc, (0,), eval_log)
    # evaluate.py's result: <checkpoint>.eval.<its settings>.json, beside the training's own.
    (result_file,) = checkpoint.parent.glob(f"{checkpoint.stem}.eval.*-*ep-*.json")
    result = json.loads(result_file.read_text())
    return {
        "seed": seed,
        "exit_code": proc.returncode,
        "wall": ended - launched,
        "stop_latency": None if signalled is None else ended - signalled,
        "checkpoint": checkpoint.name,
        "env_steps": env_steps,
        "success": result["metrics"]["success"],
        "spl": result["metrics"]["spl"],
        "num_episodes": len(result["episodes"]),
        "split": result["settings"].get("split"),
        "eval_seconds": eval_seconds,
    }


def print_sigterm(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nppo_nav stopped by SIGTERM {args.sigterm:g} s after launch, last checkpoint "
        f"evaluated with evaluate.py defaults ({results[0]['num_episodes']} episodes, split "
        f"{results[0]['split']})"
    )
    header = (
        f"{'seed':>4} | {'exit':>4} {'wall s':>7} {'stop s':>6} | {'env steps':>10} | "
        f"{'success':>7} {'SPL':>6} | {'evaluate.py s':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['seed']:>4} | {r['exit_code']:>4} {r['wall']:>7.1f} "
            f"{fmt(r['stop_latency'], '>6.2f')} | {fmt(r['env_steps'], '>10,d')} | "
            f"{r['success']:>7.3f} {r['spl']:>6.3f} | {r['eval_seconds']:>13.1f}"
        )
    print(
        "(exit 143: stopped by SIGTERM after saving; 0: finished before it. stop s: SIGTERM to "
        "exit. evaluate.py s: its wall time, start-up included)"
    )


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--interval", type=int, default=20480, help="env steps between evals")
    parser.add_argument(
        "--total-env-steps", type=int, default=None, help="default: the experiment's (1M)"
    )
    parser.add_argument(
        "--max-wall", type=float, default=None, help="stop a seed after this many training s"
    )
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="Hydra override"
    )
    parser.add_argument(
        "--evaluate-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="evaluate.py override (--sigterm)",
    )
    parser.add_argument(
        "--sigterm", type=float, default=None, metavar="SECONDS", help="the SIGTERM check"
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--experiment", default="ppo_nav", help="the +experiment to train")
    parser.add_argument(
        "--thresholds", type=float, nargs="+", default=[0.9, 0.95], help="success levels"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="time_to_success_") as tmp:
        base = (args.out or Path(tmp)).resolve()
        base.mkdir(parents=True, exist_ok=True)
        results = []
        for seed in args.seeds:
            print(f"seed {seed} ...", flush=True)
            if args.sigterm is not None:
                results.append(sigterm_check(seed, args, base))
            else:
                results.append(time_to_success(seed, args, base))
        if args.sigterm is not None:
            print_sigterm(results, args)
        else:
            print_time_to_success(results, args)
        print(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD_FLAG:
        run_timed_train(sys.argv[2], sys.argv[3:])  # as train.py exits (its time is measured)
    else:
        main()
        gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
