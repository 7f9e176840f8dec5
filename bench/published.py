"""Published results, reproduced: our PPO presets next to CleanRL's and the RL Zoo's figures.

For each benchmark of ``BENCHMARKS`` (an environment, the reference's budget, our preset for its
family, the reference's published mean +- std), ``train.py`` trains the preset for 3 seeds at
that budget, ``--jobs`` runs at a time (2 on two cores), each a subprocess with one torch thread
and a progress line every ``--progress`` seconds. Each run is measured as its reference measures:

- **CleanRL** (``ppo_continuous_action.py``, ``ppo.py``): the return of *training* episodes
  (the stochastic policy, raw rewards: the ``charts/episodic_return`` CleanRL logs). Ours: per
  seed, the mean of ``charts/episodic_return`` over the last 10% of the budget; mean +- std over
  seeds (CleanRL's docs: mean +- std over its 3 seeds' curves, openrlbenchmark).
- **RL Zoo** (``benchmark.md``): an evaluation of the trained agent (the Zoo's ``std`` is over
  the evaluation episodes of its single trained agent, not over seeds), made by
  ``rl_zoo3/benchmark.py`` running ``enjoy.py`` with its default actions: *sampled* for MiniGrid
  (and Atari: ``stochastic = args.stochastic or (is_atari or is_minigrid) and not
  args.deterministic``), the argmax otherwise. Ours, the same episodes (``EVAL_EPISODES_ZOO``
  held-out seeds) for both: the final ``eval/episodic_return`` of the engine's own evaluation
  (``eval.deterministic=true``: the argmax, also the curves every tenth of the budget) and the
  final checkpoint's return with sampled actions (``evaluate.py deterministic=false``); the table
  compares the one the reference measured (``Reference.actions``) and shows the other beside it.
  Mean +- std over seeds.

The side-by-side row (``SIDE_BY_SIDE``): Walker2d-v5 at 300k env steps, 3 seeds each of ours
(``ppo_mujoco``) and stable-baselines3 PPO (its defaults: ``PPO("MlpPolicy")`` over
``VecNormalize(make_vec_env(env, n_envs=1))``), both evaluated deterministically over 20 episodes
(SB3: ``evaluate_policy`` on a fresh env normalised with the frozen training statistics), in the
same run of this script, for the ratios of return and training FPS on this machine.

Training FPS = env steps / wall time over the last three quarters of training (the first quarter
is warm-up, as in ``bench/train_fps.py``), from each side's own records.

Written to ``--out`` (default ``docs/results/``, what the docs' page shows; with ``--only``,
``<work>/only_<ENV>/``, so one row never overwrites the page): ``published.md``
(the page: the table, the side-by-side table, the plots, the command), ``published.json`` (the
same figures and every seed's) and ``published/<env>.png`` (our seeds' learning curves and the
reference's figure as a line). Runs go under ``--work`` (default ``outputs/published/``); a run
whose ``result.json`` is there is reused, not retrained (``--fresh`` retrains), so the table can
be built over several sittings. ``--only HalfCheetah-v5 ...`` restricts the benchmarks;
``--report-only`` trains nothing and writes the page from the runs already done (a row with
fewer seeds says how many; one with none says "not run").

``--smoke``: one row per preset and the side-by-side row with tiny budgets (one seed, 2,048 env
steps; a few evaluation episodes) into a temporary folder, to check that the benchmark runs
(``tests/test_bench.py``), not to measure. There the side-by-side row's run of ours is the
Walker2d-v5 row's command (the same budget and episodes): it trains once and serves both.

    python bench/published.py [--only ENV ...] [--seeds 1 2 3] [--jobs 2] [--out docs/results]
                              [--work outputs/published] [--fresh] [--skip-side-by-side]
                              [--report-only] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
CHILD_FLAG = "--sb3-child"  # internal: argv[1] of a stable-baselines3 run's subprocess
EVAL_EPISODES_ZOO = 200  # our deterministic evaluation of an RL Zoo row (the Zoo's: ~150k steps)
EVAL_EPISODES_SIDE = 20  # both sides of the side-by-side row
EVAL_SEED = 1_000_000  # evaluation episodes' seeds (ours: eval.episode_seed; SB3's eval env)
TAIL = 0.1  # CleanRL rows: training episodes over the last 10% of the budget
SMOKE_STEPS = 2048
SMOKE_ROWS = ("Walker2d-v5", "CartPole-v1", "MiniGrid-Unlock-v0")  # --smoke: one per preset


@dataclass(frozen=True)
class Reference:
    """A published figure: mean +- std, where it comes from, and what it measures."""

    mean: float
    std: float
    source: str  # project, file, environment version
    metric: Literal["train", "eval"]  # training episodes' return | an evaluation
    actions: Literal["argmax", "sampled"] = "argmax"  # how an evaluation chose actions


@dataclass(frozen=True)
class Benchmark:
    """One row: an environment at the reference's budget, trained with one of our presets."""

    env_id: str
    budget: int
    experiment: str
    reference: Reference
    overrides: tuple[str, ...] = ()
    eval_curve: bool = False  # evaluate every tenth of the budget (the RL Zoo rows' curves)


_CLEANRL_CONT = "CleanRL ppo_continuous_action.py, {}-v4, 3 seeds (docs.cleanrl.dev)"
_ZOO = "RL Zoo benchmark.md (PPO, 1 agent; std over eval episodes), {}"
_ZOO_MINIGRID = "sampled"  # rl_zoo3 enjoy.py's default actions for MiniGrid
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "HalfCheetah-v5",
        1_000_000,
        "ppo_mujoco",
        Reference(1442.6, 46.0, _CLEANRL_CONT.format("HalfCheetah"), "train"),
    ),
    Benchmark(
        "Walker2d-v5",
        1_000_000,
        "ppo_mujoco",
        Reference(2288.0, 571.8, _CLEANRL_CONT.format("Walker2d"), "train"),
    ),
    Benchmark(
        "InvertedPendulum-v5",
        1_000_000,
        "ppo_mujoco",
        Reference(963.1, 22.2, _CLEANRL_CONT.format("InvertedPendulum"), "train"),
    ),
    Benchmark(
        "CartPole-v1",
        500_000,
        "ppo_classic_control",
        Reference(490.0, 6.1, "CleanRL ppo.py, CartPole-v1, 3 seeds (docs.cleanrl.dev)", "train"),
    ),
    Benchmark(
        "MiniGrid-Unlock-v0",
        100_000,
        "ppo_minigrid",
        Reference(0.963, 0.016, _ZOO.format("MiniGrid-Unlock-v0"), "eval", _ZOO_MINIGRID),
        eval_curve=True,
    ),
    Benchmark(
        "MiniGrid-KeyCorridorS3R1-v0",
        500_000,
        "ppo_minigrid",
        Reference(0.949, 0.011, _ZOO.format("MiniGrid-KeyCorridorS3R1-v0"), "eval", _ZOO_MINIGRID),
        eval_curve=True,
    ),
    Benchmark(
        "MiniGrid-RedBlueDoors-6x6-v0",
        1_000_000,
        "ppo_minigrid",
        Reference(
            0.860, 0.313, _ZOO.format("MiniGrid-RedBlueDoors-6x6-v0"), "eval", _ZOO_MINIGRID
        ),
        # the Zoo's own entry for this env: 512-step rollouts (minibatches of 64 kept)
        overrides=("pipeline.num_steps=512", "pipeline.num_mini_batch=64"),
        eval_curve=True,
    ),
    Benchmark(
        "MiniGrid-FourRooms-v0",
        5_000_000,
        "ppo_minigrid",
        Reference(0.573, 0.311, _ZOO.format("MiniGrid-FourRooms-v0"), "eval", _ZOO_MINIGRID),
        eval_curve=True,
    ),
)
SIDE_BY_SIDE = Benchmark(
    "Walker2d-v5",
    300_000,
    "ppo_mujoco",
    Reference(math.nan, math.nan, "stable-baselines3 PPO defaults + VecNormalize", "eval"),
)
NOTE_V5 = (
    "Gymnasium 1.4 has only the v5 MuJoCo environments; CleanRL's figures are for v4 (the same "
    "robots and rewards; v5 fixed bugs and changed some defaults)."
)


@dataclass
class Job:
    """One training run: ours (``train.py``) or stable-baselines3's (this script's child)."""

    bench: Benchmark
    impl: Literal["ours", "sb3"]
    seed: int
    folder: Path
    steps: int
    eval_episodes: int
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.folder.with_suffix(".log")

    @property
    def name(self) -> str:
        return f"{self.bench.env_id} {self.impl} seed {self.seed}"

    def command(self) -> list[str]:
        """The command line of the run."""
        if self.impl == "sb3":
            return [
                sys.executable,
                str(Path(__file__).resolve()),
                CHILD_FLAG,
                self.bench.env_id,
                str(self.steps),
                str(self.seed),
                str(self.eval_episodes),
                str(self.folder),
            ]
        return [
            sys.executable,
            str(ROOT / "train.py"),
            f"+experiment={self.bench.experiment}",
            f"task.env_id={self.bench.env_id}",
            f"total_env_steps={self.steps}",
            f"seed={self.seed}",
            f"hydra.run.dir={self.folder}",
            "torch_threads=1",
            "logger.sinks.console.progress_bar=false",
            "logger.sinks.console.summary_every=0",
            f"eval.num_episodes={self.eval_episodes}",
            f"eval.episode_seed={EVAL_SEED}",
            "eval.deterministic=true",  # the Gaussian's mean, the argmax (the RL Zoo's)
            f"eval.interval={self.steps // 10 if self.bench.eval_curve else 0}",
            *self.bench.overrides,
        ]


# --------------------------------------------------------------------------- reading a run
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def training_fps(records: Sequence[dict[str, Any]]) -> float:
    """Env steps / wall time over the last three quarters of the training records."""
    training = [r for r in records if "wall_time" in r and not _is_eval(r)]
    if len(training) < 2:
        return math.nan
    budget = training[-1]["env_step"]
    start = next((r for r in training if r["env_step"] >= budget / 4), training[0])
    if start is training[-1]:
        start = training[0]
    wall = training[-1]["wall_time"] - start["wall_time"]
    return (training[-1]["env_step"] - start["env_step"]) / wall if wall > 0 else math.nan


def _is_eval(record: dict[str, Any]) -> bool:
    return any(str(key).startswith("eval/") for key in record)


def ours_result(job: Job) -> dict[str, Any]:
    """Our run's figure (as its reference measures), curve and FPS, from ``metrics.jsonl``."""
    records = read_jsonl(job.folder / "metrics.jsonl")
    if not records:
        raise RuntimeError(f"{job.name}: no metrics.jsonl in {job.folder} (see {job.log})")
    train_curve = [
        (r["env_step"], r["charts/episodic_return"])
        for r in records
        if "charts/episodic_return" in r and not _is_eval(r)
    ]
    eval_curve = [
        (r["env_step"], r["eval/episodic_return"]) for r in records if "eval/episodic_return" in r
    ]
    tail = [ret for step, ret in train_curve if step > (1 - TAIL) * job.steps] or [
        ret for _, ret in train_curve[-1:]
    ]
    final_eval = eval_curve[-1][1] if eval_curve else math.nan
    final_train = statistics.fmean(tail) if tail else math.nan
    metric = job.bench.reference.metric
    return {
        "final": final_eval if metric == "eval" else final_train,
        "final_train": final_train,
        "final_eval": final_eval,
        "curve": eval_curve if metric == "eval" else train_curve,
        "fps": training_fps(records),
    }


def progress_of(job: Job) -> tuple[int, float]:
    """(env steps so far, latest return) of a running job, from its records."""
    path = job.folder / ("progress.jsonl" if job.impl == "sb3" else "metrics.jsonl")
    records = [r for r in read_jsonl_tolerant(path) if not _is_eval(r)]
    if not records:
        return 0, math.nan
    last = records[-1]
    return int(last.get("env_step", 0)), float(last.get("charts/episodic_return", math.nan))


def read_jsonl_tolerant(path: Path) -> list[dict[str, Any]]:
    """The complete records of a file another process is appending to."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return out


def sampled_return(job: Job) -> float:
    """The final checkpoint's return over the same episodes with *sampled* actions.

    ``evaluate.py`` on ``checkpoints/latest`` (``deterministic=false``, the evaluation's
    episode list): the RL Zoo's measure for MiniGrid; where an argmax policy loops, it also
    shows what the stochastic policy it came from does.
    """
    out = job.folder / "sampled_eval"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            f"ckpt={job.folder / 'checkpoints' / 'latest'}",
            f"num_episodes={job.eval_episodes}",
            f"episode_seed={EVAL_SEED}",
            "deterministic=false",
            "progress_bar=false",
            "plot=false",
            f"hydra.run.dir={out}",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    pattern = f"*.eval.*-{job.eval_episodes}ep-sampled-*.json"
    found = sorted((job.folder / "checkpoints").glob(pattern))
    if not found:
        raise RuntimeError(f"{job.name}: evaluate.py wrote no sampled evaluation")
    return float(json.loads(found[-1].read_text())["metrics"]["return"])


# --------------------------------------------------------------------------- running
def run_job(job: Job, fresh: bool, progress_every: float, counter: list[int], total: int) -> dict:
    """Train ``job`` (or reuse its ``result.json``); the result with the run's description."""
    result_path = job.folder / "result.json"
    command = " ".join(job.command()[1:])
    if result_path.exists() and not fresh:
        result = json.loads(result_path.read_text())
        if result.get("command") == command:
            print(f"  {job.name}: reused {result_path}", flush=True)
            if job.impl == "ours" and job.bench.eval_curve and "final_sampled" not in result:
                result["final_sampled"] = sampled_return(job)
                result_path.write_text(json.dumps(result))
            return result
        print(f"  {job.name}: its command changed since {result_path}; training again", flush=True)
    if job.folder.exists():  # a run that did not finish, or one trained again
        shutil.rmtree(job.folder)
    job.folder.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    with job.log.open("wb") as log:
        proc = subprocess.Popen(job.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            try:
                proc.wait(timeout=progress_every)
            except subprocess.TimeoutExpired:
                step, ret = progress_of(job)
                print(
                    f"  {job.name}: {step:>10,} / {job.steps:,} env steps, "
                    f"return {ret:>9.3f}, {_clock(time.perf_counter() - start)}",
                    flush=True,
                )
    if proc.returncode != 0:
        tail = job.log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{job.name} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    if job.impl == "sb3":
        result = json.loads((job.folder / "sb3_result.json").read_text())
    else:
        result = ours_result(job)
        if job.bench.eval_curve:
            result["final_sampled"] = sampled_return(job)
    result.update(
        env_id=job.bench.env_id,
        impl=job.impl,
        seed=job.seed,
        steps=job.steps,
        wall_s=time.perf_counter() - start,
        command=command,
    )
    result_path.write_text(json.dumps(result))
    counter[0] += 1
    print(
        f"[{counter[0]:>2}/{total}] {job.name}: {result['final']:.3f} "
        f"({result['fps']:,.0f} FPS, {_clock(result['wall_s'])})",
        flush=True,
    )
    return result


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def run_all(jobs: list[Job], parallel: int, fresh: bool, progress_every: float) -> list[dict]:
    """Every job, ``parallel`` at a time, the longest first; results in the jobs' order.

    A job of ours whose command is an earlier job's but for its folder (``--smoke``: the
    side-by-side row's and the Walker2d-v5 row's) is not trained again: its result is read from
    that job's run (:func:`twin_result`).
    """
    first: dict[tuple[str, ...], int] = {}
    twin: dict[int, int] = {}  # job -> the earlier job whose run it reads
    for i, job in enumerate(jobs):
        key = _run_key(job)
        if key in first:
            twin[i] = first[key]
        else:
            first[key] = i
    order = sorted(first.values(), key=lambda i: -jobs[i].steps * _cost(jobs[i]))
    counter = [0]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {
            i: pool.submit(run_job, jobs[i], fresh, progress_every, counter, len(order))
            for i in order
        }
        return [
            twin_result(jobs[i], jobs[twin[i]], futures[twin[i]].result())
            if i in twin
            else futures[i].result()
            for i in range(len(jobs))
        ]


def _run_key(job: Job) -> tuple[str, ...]:
    """What makes a job's run: ours, its command but for its folder; SB3's, all of it."""
    command = job.command()
    if job.impl == "ours":
        return tuple(a for a in command if not a.startswith("hydra.run.dir="))
    return tuple(command)


def twin_result(job: Job, ran: Job, ran_result: dict[str, Any]) -> dict[str, Any]:
    """``job``'s result from ``ran``'s run (the same training run), measured as ``job`` measures.

    Its ``wall_s`` is 0 (the run's time is ``ran``'s).
    """
    result = ours_result(replace(job, folder=ran.folder))
    if "final_sampled" in ran_result:  # the same eval.interval: job's row samples as well
        result["final_sampled"] = ran_result["final_sampled"]
    result.update(
        env_id=job.bench.env_id,
        impl=job.impl,
        seed=job.seed,
        steps=job.steps,
        wall_s=0.0,
        command=ran_result["command"],
    )
    print(
        f"  {job.name} ({job.folder.parent.name}): {ran.folder.parent.name}'s run (the same "
        "command), not trained again",
        flush=True,
    )
    return result


def _cost(job: Job) -> float:
    """Rough seconds per env step, for the schedule (SB3 and MiniGrid are the slower)."""
    return 4.0 if job.impl == "sb3" else 2.0 if job.bench.env_id.startswith("MiniGrid") else 1.0


# --------------------------------------------------------------------------- stable-baselines3
def sb3_child(env_id: str, steps: int, seed: int, eval_episodes: int, folder: Path) -> None:
    """stable-baselines3 PPO with its defaults + ``VecNormalize``; writes ``sb3_result.json``."""
    import copy

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    folder.mkdir(parents=True, exist_ok=True)
    progress = (folder / "progress.jsonl").open("a")
    start = time.perf_counter()
    records: list[dict[str, Any]] = []

    class Recorder(BaseCallback):  # type: ignore[misc]
        """Training episodes' raw returns (the Monitor's) and the clock, once per rollout."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_end(self) -> None:
            record = {
                "env_step": int(self.model.num_timesteps),
                "wall_time": time.perf_counter() - start,
            }
            if self.returns:
                record["charts/episodic_return"] = statistics.fmean(self.returns)
                self.returns = []
            records.append(record)
            progress.write(json.dumps(record) + "\n")
            progress.flush()

    env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed))
    agent = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    agent.set_logger(Logger(None, []))  # (SB3's default makes a /tmp/SB3-<time> folder)
    agent.learn(total_timesteps=steps, callback=Recorder())
    eval_env = VecNormalize(
        make_vec_env(env_id, n_envs=1, seed=EVAL_SEED), training=False, norm_reward=False
    )
    eval_env.obs_rms = copy.deepcopy(env.obs_rms)
    returns, _ = evaluate_policy(
        agent,
        eval_env,
        n_eval_episodes=eval_episodes,
        deterministic=True,
        return_episode_rewards=True,
    )
    final_eval = statistics.fmean(float(r) for r in returns)
    train_curve = [
        (r["env_step"], r["charts/episodic_return"])
        for r in records
        if "charts/episodic_return" in r
    ]
    tail = [ret for step, ret in train_curve if step > (1 - TAIL) * steps]
    result = {
        "final": final_eval,
        "final_eval": final_eval,
        "final_train": statistics.fmean(tail) if tail else math.nan,
        "curve": train_curve,
        "fps": training_fps(records),
    }
    (folder / "sb3_result.json").write_text(json.dumps(result))


# --------------------------------------------------------------------------- the report
def summarise(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(value: float, env_id: str) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.3f}" if env_id.startswith("MiniGrid") else f"{value:,.1f}"


def _ours(row: dict[str, Any], env_id: str, seeds: int) -> str:
    """Ours, mean +- std; with how many seeds where fewer than asked; "not run" for none."""
    if row["num_seeds"] == 0:
        return "not run"
    text = f"{_fmt(row['ours_mean'], env_id)} +- {_fmt(row['ours_std'], env_id)}"
    return text if row["num_seeds"] >= seeds else f"{text} ({row['num_seeds']} of {seeds} seeds)"


def _other(row: dict[str, Any], env_id: str) -> str:
    mean, std = row["ours_other_mean"], row["ours_other_std"]
    if math.isnan(mean):
        return "n/a"
    return f"{_fmt(mean, env_id)} +- {_fmt(std, env_id)} ({row['other_actions']})"


def _count(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.0f}"


def _ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def table_rows(results: list[dict], benches: Sequence[Benchmark]) -> list[dict[str, Any]]:
    """One summary per benchmark: ours over seeds against the reference."""
    rows = []
    for bench in benches:
        runs = [r for r in results if r["env_id"] == bench.env_id and r["impl"] == "ours"]
        ref = bench.reference
        # "final": the run's own measure (argmax evaluation or training return); an
        # evaluation row's other action mode is "final_sampled" (evaluate.py's)
        key, other_key = (
            ("final_sampled", "final") if ref.actions == "sampled" else ("final", "final_sampled")
        )
        mean, std = summarise([r.get(key, math.nan) for r in runs])
        other_mean, other_std = summarise([r.get(other_key, math.nan) for r in runs])
        rows.append(
            {
                "env_id": bench.env_id,
                "budget": runs[0]["steps"] if runs else bench.budget,
                "experiment": bench.experiment,
                "metric": ref.metric,
                "actions": ref.actions,
                "ours_mean": mean,
                "ours_std": std,
                "ours_seeds": {r["seed"]: r.get(key, math.nan) for r in runs},
                "num_seeds": len(runs),
                "other_actions": "argmax" if ref.actions == "sampled" else "sampled",
                "ours_other_mean": other_mean,
                "ours_other_std": other_std,
                "ref_mean": ref.mean,
                "ref_std": ref.std,
                "ref_source": ref.source,
                "ratio": mean / ref.mean if ref.mean else math.nan,
                "meets": bool(runs) and bool(mean >= ref.mean - ref.std),
                "fps": statistics.fmean(r["fps"] for r in runs) if runs else math.nan,
                "wall_s": sum(r["wall_s"] for r in runs),
            }
        )
    return rows


METRIC_WORDS = {
    ("train", "argmax"): "training episodes' return, last 10% of the budget",
    ("eval", "argmax"): "evaluation, argmax actions",
    ("eval", "sampled"): "evaluation, sampled actions (the Zoo's for MiniGrid)",
}


def markdown(rows: list[dict], side: dict | None, args: argparse.Namespace, wall: float) -> str:
    """The docs page: the tables, the plots, the command that made them."""
    lines = [
        "# Published results, reproduced",
        "",
        "<!-- Generated by bench/published.py: edit the script, not this page. -->",
        "",
        f"Made by `{args.command_line}`: {_clock(wall * args.jobs)} of training in all, about "
        f"{_clock(wall)} of wall time with {args.jobs} runs at a time (one torch thread each, "
        "on this project's 2-core machine). Ours: mean +- std over seeds "
        f"{', '.join(str(s) for s in args.seeds)}, each measured as its reference measures "
        "(the metric column: the RL Zoo evaluates MiniGrid agents with sampled actions, "
        "`rl_zoo3/enjoy.py`'s default there, and others with the argmax); `meets`: ours >= the "
        "reference's mean - its std. The last column, for the evaluation rows: the same final "
        "checkpoints and episodes with the other action mode (`evaluate.py deterministic=...`). "
        "Training FPS of the evaluation rows includes their periodic evaluations (every tenth of "
        "the budget).",
        "",
        f"{NOTE_V5}",
        "",
        "| environment | budget | preset | metric | ours | reference | source | ours / ref. "
        "| meets | training FPS | ours, other actions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        env = row["env_id"]
        lines.append(
            f"| {env} | {row['budget']:,} | `{row['experiment']}` "
            f"| {METRIC_WORDS[row['metric'], row['actions']]} "
            f"| {_ours(row, env, len(args.seeds))} "
            f"| {_fmt(row['ref_mean'], env)} +- {_fmt(row['ref_std'], env)} "
            f"| {row['ref_source']} | {_ratio(row['ratio'])} "
            f"| {'yes' if row['meets'] else 'no'} | {_count(row['fps'])} "
            f"| {_other(row, env)} |"
        )
    lines += [
        "",
        "The presets and the differences that made continuous control lag, measured: "
        "[continuous control](../howto/continuous-control.md). What was measured about the "
        "MiniGrid rows (argmax loops, RedBlueDoors' 512-step rollouts): "
        "[MiniGrid](../howto/minigrid.md).",
    ]
    if side is not None:
        lines += [
            "",
            "## Side by side: stable-baselines3 in the same run",
            "",
            f"{side['env_id']}, {side['steps']:,} env steps, seeds "
            f"{', '.join(str(s) for s in args.seeds)}; both evaluated deterministically over "
            f"{EVAL_EPISODES_SIDE} episodes (observations normalised with the frozen training "
            "statistics); training FPS over the last three quarters, one torch thread each.",
            "",
            "| implementation | eval return (mean +- std) | per seed | training FPS |",
            "|---|---|---|---|",
        ]
        for impl, label in (("ours", "ours (`ppo_mujoco`)"), ("sb3", "stable-baselines3 PPO")):
            part = side[impl]
            seeds = ", ".join(f"{v:,.0f}" for v in part["seeds"].values())
            lines.append(
                f"| {label} | {part['mean']:,.1f} +- {part['std']:,.1f} | {seeds} "
                f"| {_count(part['fps'])} |"
            )
        lines += [
            "",
            f"Ratios ours / SB3: return {_ratio(side['return_ratio'])}, "
            f"FPS {_ratio(side['fps_ratio'])}.",
        ]
    lines += row_commands(rows)
    lines += ["", "## Learning curves", ""]
    for row in rows:
        lines.append(f"![{row['env_id']}](published/{row['env_id']}.png)")
    return "\n".join(lines) + "\n"


# Flags of a run that are the script's bookkeeping, not the experiment (left out of the
# per-row commands).
BOOKKEEPING_FLAGS = ("hydra.run.dir=", "logger.sinks.console.")


def row_commands(rows: Sequence[dict]) -> list[str]:
    """The page's section on reproducing one row: the command, one seed's train.py, the time."""
    lines = [
        "",
        "## One row at a time",
        "",
        "`python bench/published.py --only ENV` trains and reports that row alone (3 seeds, 2 at "
        "a time); its page, JSON and plot go to `outputs/published/only_ENV/`, so this page "
        "stays as it is, and its runs under `outputs/published/ENV/`, reused by a later full "
        "table. Each seed runs the `train.py` command below with `seed=N` (plus the script's "
        "own run folder and quiet console); the time is one seed's here, at the row's training "
        "FPS above.",
        "",
        "| environment | command | one seed's training run | one seed here |",
        "|---|---|---|---|",
    ]
    by_env = {b.env_id: b for b in BENCHMARKS}
    for row in rows:
        bench = by_env[row["env_id"]]
        episodes = EVAL_EPISODES_ZOO if bench.reference.metric == "eval" else EVAL_EPISODES_SIDE
        job = Job(bench, "ours", 1, Path("run"), bench.budget, episodes)
        args = [a for a in job.command()[2:] if not a.startswith(BOOKKEEPING_FLAGS)]
        train = " ".join(["python train.py", *args])
        fps = row.get("fps")
        took = f"~{_clock(bench.budget / fps)}" if fps and math.isfinite(fps) else "-"
        lines.append(
            f"| {bench.env_id} | `python bench/published.py --only {bench.env_id}` "
            f"| `{train}` | {took} |"
        )
    return lines


def plot(results: list[dict], bench: Benchmark, path: Path) -> None:
    """Our seeds' curves and the reference's figure (mean, +- std band) as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for result in results:
        if result["env_id"] == bench.env_id and result["impl"] == "ours":
            steps, values = zip(*result["curve"], strict=True) if result["curve"] else ((), ())
            ax.plot(steps, values, label=f"ours, seed {result['seed']}", lw=1.2)
    ref = bench.reference
    if ref.actions == "sampled":  # the final checkpoints' sampled evaluation, the table's figure
        finals = [
            (r["steps"], r["final_sampled"])
            for r in results
            if r["env_id"] == bench.env_id and r["impl"] == "ours" and "final_sampled" in r
        ]
        if finals:
            ax.scatter(*zip(*finals, strict=True), marker="o", s=18, color="C3", zorder=3,
                       label="ours, final, sampled actions")  # fmt: skip
    ax.axhline(ref.mean, color="k", ls="--", lw=1, label="reference (final)")
    ax.axhspan(ref.mean - ref.std, ref.mean + ref.std, color="k", alpha=0.08)
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return" if ref.metric == "train" else "eval return (curves: argmax)")
    ax.set_title(f"{bench.env_id} ({bench.experiment})", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def side_summary(results: list[dict], steps: int) -> dict[str, Any]:
    """The side-by-side row: each side's mean +- std, per seed, FPS; the ratios."""
    out: dict[str, Any] = {"env_id": SIDE_BY_SIDE.env_id, "steps": steps}
    for impl in ("ours", "sb3"):
        runs = [r for r in results if r["impl"] == impl]
        mean, std = summarise([r["final_eval"] for r in runs])
        out[impl] = {
            "mean": mean,
            "std": std,
            "seeds": {r["seed"]: r["final_eval"] for r in runs},
            "fps": statistics.fmean(r["fps"] for r in runs),
        }
    out["return_ratio"] = out["ours"]["mean"] / out["sb3"]["mean"]
    out["fps_ratio"] = out["ours"]["fps"] / out["sb3"]["fps"]
    return out


def side_by_side_folder(work: Path, env_id: str, steps: int) -> Path:
    """The folder of the side-by-side row's runs (``mujoco_differences.py`` reuses ours)."""
    return work / f"side_by_side_{env_id}_{steps}"


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, train what is missing, write the page, the JSON and the plots."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, metavar="ENV", help="these rows only")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="default: docs/results (the whole table), outputs/published/only_<ENV> (--only)",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "published")
    parser.add_argument("--fresh", action="store_true", help="retrain runs already done")
    parser.add_argument("--skip-side-by-side", action="store_true")
    parser.add_argument("--progress", type=float, default=60.0, help="seconds between lines")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: the page from the runs already done (a row says how many seeds)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args(argv)
    args.command_line = " ".join(
        ["python bench/published.py", *(sys.argv[1:] if argv is None else argv)]
    )
    if args.report_only:  # the page names the command that trains, not the one that reported
        args.command_line = args.command_line.replace(" --report-only", "")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    known = {b.env_id for b in BENCHMARKS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"--only: {unknown} are not benchmarks ({sorted(known)})")
    benches = [b for b in BENCHMARKS if args.only is None or b.env_id in args.only]
    if args.out is None:  # --only never overwrites the docs' page unless told to
        only = "+".join(b.env_id for b in benches)
        args.out = ROOT / "docs" / "results" if args.only is None else args.work / f"only_{only}"
    if args.smoke and args.only is None:  # one row per preset: each code path, fewer runs
        benches = [b for b in benches if b.env_id in SMOKE_ROWS]
    tmp = None
    if args.smoke:
        tmp = tempfile.TemporaryDirectory(prefix="published-smoke-")
        args.seeds, args.work, args.out, args.fresh = (
            [1],
            Path(tmp.name) / "work",
            Path(tmp.name) / "out",
            True,
        )
        args.progress = min(args.progress, 30.0)
    started = time.perf_counter()

    def steps_of(bench: Benchmark) -> int:
        return SMOKE_STEPS if args.smoke else bench.budget

    def episodes(n: int) -> int:
        return 2 if args.smoke else n

    jobs = [
        Job(
            b,
            "ours",
            s,
            args.work / b.env_id / f"ours_seed{s}",
            steps_of(b),
            episodes(EVAL_EPISODES_ZOO if b.reference.metric == "eval" else EVAL_EPISODES_SIDE),
        )
        for b in benches
        for s in args.seeds
    ]
    side_jobs: list[Job] = []
    if not args.skip_side_by_side:
        side_dir = side_by_side_folder(args.work, SIDE_BY_SIDE.env_id, steps_of(SIDE_BY_SIDE))
        side_jobs = [
            Job(
                SIDE_BY_SIDE,
                impl,
                s,
                side_dir / f"{impl}_seed{s}",
                steps_of(SIDE_BY_SIDE),
                episodes(EVAL_EPISODES_SIDE),
            )
            for impl in ("ours", "sb3")
            for s in args.seeds
        ]
    print(
        f"{len(jobs) + len(side_jobs)} runs, {args.jobs} at a time; runs in {args.work}",
        flush=True,
    )
    if args.report_only:
        jobs = [j for j in jobs if (j.folder / "result.json").exists()]
        side_jobs = [j for j in side_jobs if (j.folder / "result.json").exists()]
        print(f"--report-only: {len(jobs) + len(side_jobs)} runs found", flush=True)
    results = run_all(jobs + side_jobs, args.jobs, args.fresh, args.progress)
    main_results, side_results = results[: len(jobs)], results[len(jobs) :]
    rows = table_rows(main_results, benches)
    side = side_summary(side_results, steps_of(SIDE_BY_SIDE)) if side_results else None
    wall = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    for bench in benches:
        plot(main_results, bench, args.out / "published" / f"{bench.env_id}.png")
    page = markdown(rows, side, args, sum(r["wall_s"] for r in results) / args.jobs)
    (args.out / "published.md").write_text(page)
    payload = {
        "command": args.command_line,
        "seeds": args.seeds,
        "note": NOTE_V5,
        "rows": rows,
        "side_by_side": side,
        "runs": results,
        "benchmarks": [asdict(b) for b in benches],
    }
    (args.out / "published.json").write_text(json.dumps(payload, indent=1, default=str))
    print()
    print(page.split("## Learning curves")[0])
    print(f"wrote {args.out / 'published.md'}, published.json, published/*.png in {_clock(wall)}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        env_id, steps, seed, episodes, folder = sys.argv[2:7]
        sb3_child(env_id, int(steps), int(seed), int(episodes), Path(folder))
        gc.freeze()  # exit without a last garbage collection of the imports (torch), as train.py
    else:
        main()
