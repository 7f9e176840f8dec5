"""The GPU-box benchmark in one call: the GPU acceptance rows, a table and logs in one folder.

What runs (each row a subprocess, its output in ``<out>/<row>.log``; the table is rewritten
after every row, so a run cut short still leaves what it measured):

1. ``ppo_nav`` with the batched task and the learner on CUDA (``sampler=batched
   sampler.device=cuda device=cuda``, 2,048 environments x 32-step rollouts, 4 minibatches):
   ``bench/time_to_success.py --sigterm 30`` launches ``train.py`` as a user would, sends SIGTERM
   30 s after launch (start-up included; the trainer saves a checkpoint at the next rollout
   boundary), then ``evaluate.py device=cuda`` scores that checkpoint on 200 episodes of the
   held-out test layouts. Figures: training steps/s (env steps over wall time from the run's
   first metrics record to its last: start-up and the first rollout left out) and the held-out
   success.
   Targets: at least 200,000 steps/s; success 0.95.
2. The same run with the task and the learner on the CPU (``sampler.device=cpu device=cpu``,
   the same settings, ``torch_threads`` = every core in both rows): the CUDA learner's speed-up
   over it. Target: at least 2x.
3. The raw limit of nav3d's layout below (``bench/nav3d_fps.py``'s ``raw_workers``): the same
   process workers stepping the same ``nav3d_small`` depth environments with the shortest-path
   expert's actions, no policy, no learner.
4. ``dagger_ppo_nav3d_depth task=nav3d_small collector.num_workers=auto`` (one process worker a
   core less the learner's, ``rl/utils/threads.py``; ``--envs-per-worker`` environments each),
   learner on CUDA, SIGTERM 120 s after launch, then ``evaluate.py device=cuda`` on 200
   held-out episodes.
   Targets: training steps/s at least 80% of row 3's raw limit; success 0.9.

``<out>`` (``--out``; default ``outputs/bench/gpu_box/<time>``) holds ``table.md`` (machine:
device name, cores, torch; each figure with its target and verdict), ``results.json`` (every
figure, the commands, the settings) and the rows' logs and run folders. Exits 1 when a row
failed to run or none measured (not when a target is missed); a row that cannot run is skipped
with its reason (without CUDA every row, unless ``--cpu-dry-run``; without miniworld or
pyglet, the nav3d rows).

``--cpu-dry-run``: the same rows with tiny budgets on the CPU (``device=cpu`` everywhere, a few
environments and rollouts each, ``+debug=smoke``'s 4-episode evaluations, 0.25 s of raw
stepping), to check the whole chain here, not to measure (verdicts read "dry run"). There the
two ppo_nav rows would run one command (both on the CPU): it runs once, and row 2 reads row 1's
run (its folder and log are ``ppo_nav_cuda``'s). ``--smoke``
(``tests/test_bench.py``) is the dry run with its folder in a temporary directory unless
``--out`` is given. On the GPU box (no network) ``bench/gpu_kit/run.sh`` installs the offline
kit and runs this file; the device call is
``run(command="bash bench/gpu_kit/run.sh", carry=[".gpu-kit"], timeout_s=600)``.

    python bench/gpu_box.py [--out DIR] [--cpu-dry-run] [--nav-seconds 30] [--nav3d-seconds 120]
                            [--raw-seconds 10] [--envs-per-worker 4]
                            [--nav-override KEY=VALUE ...] [--nav3d-override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHILD_RAW = "--child-raw-nav3d"  # internal: argv[1] of the raw-limit child process
NAV3D = "dagger_ppo_nav3d_depth"
NAV3D_TASK = "nav3d_small"
NAV3D_PACKAGES = ("miniworld", "pyglet")  # what a nav3d row needs beyond the project's core


@dataclasses.dataclass(frozen=True)
class Budget:
    """The sizes and seconds of one mode (the GPU box's, or the CPU dry run's)."""

    nav_seconds: float  # SIGTERM this long after launch (ppo_nav rows)
    nav3d_seconds: float  # the same, the nav3d row
    raw_seconds: float  # raw stepping, each worker
    envs_per_worker: int  # nav3d environments in each process worker
    nav: tuple[str, ...]  # ppo_nav's overrides, both devices
    nav3d: tuple[str, ...]  # dagger_ppo_nav3d_depth's overrides
    tts: tuple[str, ...]  # flags of bench/time_to_success.py
    evaluate: tuple[str, ...]  # evaluate.py's overrides
    torch_threads: int | None  # the ppo_nav rows' (both); None: every core this process may use


GPU_BOX = Budget(
    nav_seconds=30,
    nav3d_seconds=120,
    raw_seconds=10,
    envs_per_worker=4,
    nav=(
        "sampler.num_envs=2048",
        "pipeline.num_steps=32",
        "pipeline.num_mini_batch=4",
        "total_env_steps=8000000",  # the learning rate decays to 0 there (~30 s at 250k/s)
    ),
    # 15 workers x 4 envs x 32 steps = 1,920 env steps an update, near the experiment's 16 x 128
    # (with which it reached 0.9 at 460-510k env steps, docs/tasks/nav3d.md): as many updates
    # per env step; its own 128 steps would make them 3.75x fewer.
    nav3d=("pipeline.num_steps=32",),
    tts=(),
    # Its defaults (200 episodes of the test split, sampled actions), the policy on the GPU (as
    # ../shared/gpu-kit's recipe ran it).
    evaluate=("device=cuda",),
    torch_threads=None,
)
# Seconds here are backstops: the tiny runs end by themselves (exit 0) well before.
CPU_DRY_RUN = Budget(
    nav_seconds=90,
    nav3d_seconds=120,
    raw_seconds=0.25,
    envs_per_worker=2,
    nav=(
        "sampler.num_envs=4",
        "pipeline.num_steps=16",
        "pipeline.num_mini_batch=2",
        "pipeline.update_repeats=1",
        "total_env_steps=256",  # 4 rollouts, a metrics record each
    ),
    nav3d=("total_env_steps=128",),  # 4 rollouts of 2 envs x 16 steps: imitation's, then PPO's
    tts=("--smoke",),  # +debug=smoke first (4-episode evaluations), evaluate.py on 4 episodes
    evaluate=("num_envs=2",),
    torch_threads=1,  # two CPU-bound processes would oversubscribe a small machine
)
# Targets (the GPU acceptance).
NAV_FPS = 200_000
NAV_SUCCESS = 0.95
SPEEDUP = 2.0
NAV3D_SHARE = 0.8
NAV3D_SUCCESS = 0.9
WALL = 8 * 60


# ------------------------------------------------------------------------- helpers
def machine() -> dict[str, Any]:
    """What ran it: device name, cores, torch and Python versions, git commit, date."""
    import torch

    from rl.utils.threads import available_cores

    cuda = torch.cuda.is_available()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    try:
        sha = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"no CUDA device; CPU {cpu}",
        "cuda": cuda,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "available_cores": available_cores(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git": sha or "unknown (no git here)",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def run_logged(cmd: list[str], log: Path, timeout: float) -> tuple[int | None, float]:
    """Run ``cmd`` in the repository root, output to ``log``: (exit code or None, seconds).

    The command runs in its own session; at ``timeout`` it and every process it started are
    killed (None).
    """
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with log.open("ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
            f.write(f"\n[gpu_box] killed after {timeout:.0f} s\n".encode())
    return code, time.monotonic() - start


def last_json(log: Path) -> Any:
    """The last line of ``log`` that parses as JSON (what the bench scripts print last)."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def failure(code: int | None, log: Path, timeout: float) -> str:
    """Why a row's command failed: its exit code and last error line."""
    if code is None:
        return f"killed after {timeout:.0f} s (see {log.name})"
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    last = (errors or lines or ["no output"])[-1].strip()
    return f"exit {code}: {last[:160]} (see {log.name})"


def training_fps(metrics: Path) -> dict[str, Any] | None:
    """Training steps/s of a run: env steps over wall time from its first record to its last.

    The first record's interval (start-up, first rollout, warm-up) is left out; with one record
    only, its own ``charts/SPS``. Also the last record's time split (``time/*_fraction``).
    """
    if not metrics.is_file():
        return None
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    rows = [r for r in rows if "charts/SPS" in r.get("metrics", r)]
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    values = last.get("metrics", last)
    if len(rows) > 1 and last["wall_time"] > first["wall_time"]:
        fps = (last["env_step"] - first["env_step"]) / (last["wall_time"] - first["wall_time"])
    else:
        fps = values["charts/SPS"]
    split = {
        k.removeprefix("time/").removesuffix("_fraction"): round(v, 3)
        for k, v in values.items()
        if k.startswith("time/")
    }
    return {"fps": fps, "records": len(rows), "env_steps": last["env_step"], "split": split}


# ---------------------------------------------------------------------------- rows
@dataclasses.dataclass
class Row:
    """One line of the table."""

    name: str
    measure: str
    value: str
    target: str
    verdict: str
    notes: str = ""


@dataclasses.dataclass
class Bench:
    """The run's settings, what it measured so far, and where it writes."""

    out: Path
    dry: bool
    budget: Budget
    info: dict[str, Any]
    nav_override: list[str]
    nav3d_override: list[str]
    rows: list[Row] = dataclasses.field(default_factory=list)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)
    errors: int = 0

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def verdict(self, ok: bool) -> str:
        return "dry run" if self.dry else ("pass" if ok else "FAIL")

    @property
    def measured(self) -> bool:
        """Whether a row measured anything (not all skipped or failed)."""
        return any(r.value not in ("skipped", "error") for r in self.rows)

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)
        self.errors += sum(r.value == "error" for r in rows)

    def write(self, done: bool = False) -> str:
        """Write ``table.md`` and ``results.json`` (after every row); the table's text."""
        wall = time.monotonic() - self.started
        rows = list(self.rows)
        measured = self.measured
        if done:
            rows.append(
                Row(
                    "whole benchmark",
                    "wall time",
                    f"{wall:,.0f} s",
                    f"< {WALL} s",
                    self.verdict(wall < WALL) if measured else "nothing measured",
                )
            )
        info = self.info
        mode = (
            "CPU dry run (tiny budgets: checks the chain, measures nothing)"
            if self.dry
            else "GPU acceptance"
        )
        lines = [
            f"# GPU box benchmark: {mode}",
            "",
            f"device: {info['device']}",
            f"cores: {info['cores']} ({info['available_cores']} this process may use); CPU: "
            f"{info['cpu']}",
            f"torch {info['torch']} (CUDA {info['torch_cuda']}), Python {info['python']}, "
            f"git {info['git']}, {info['date']}",
            "",
            "| row | measure | value | target | verdict | notes |",
            "|---|---|---|---|---|---|",
            *(
                f"| {r.name} | {r.measure} | {r.value} | {r.target} | {r.verdict} | {r.notes} |"
                for r in rows
            ),
        ]
        if not done:
            lines += ["", f"(still running: {wall:,.0f} s so far)"]
        table = "\n".join(lines) + "\n"
        (self.out / "table.md").write_text(table)
        results = {"machine": info, "dry_run": self.dry, "wall_seconds": wall, **self.results}
        results["rows"] = [dataclasses.asdict(r) for r in rows]
        (self.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        return table


def sigterm_run(
    bench: Bench, key: str, experiment: str, seconds: float, overrides: list[str]
) -> dict[str, Any]:
    """``bench/time_to_success.py --sigterm``: train, stop at ``seconds``, evaluate.

    Returns the run's figures (``error`` set where it failed): its time_to_success result,
    training steps/s from its metrics, the command.
    """
    log = bench.out / f"{key}.log"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "time_to_success.py"),
        *bench.budget.tts,
        "--sigterm",
        f"{seconds:g}",
        "--seeds",
        "1",
        "--experiment",
        experiment,
        "--out",
        str(bench.out / key),
        *(f"--override={o}" for o in overrides),
        *(f"--evaluate-override={o}" for o in bench.budget.evaluate),
    ]
    timeout = seconds + 240  # start-up, the stop, evaluate.py on 200 episodes
    code, wall = run_logged(cmd, log, timeout)
    found = last_json(log) if code == 0 else None
    result: dict[str, Any] = {"command": cmd, "wall": wall, "log": log.name}
    if not found:
        result["error"] = failure(code, log, timeout)
        return result
    result.update(found[0])
    result["fps"] = training_fps(bench.out / key / "seed1" / "metrics.jsonl")
    if result["fps"] is None:
        result["error"] = f"no metrics records in {key}/seed1/metrics.jsonl"
    return result


def stop_note(r: dict[str, Any]) -> str:
    """How a SIGTERM run ended, for the notes column."""
    how = "stopped by SIGTERM" if r["exit_code"] == 143 else "ended before SIGTERM"
    return (
        f"{r['env_steps']:,} env steps, {how} (exit {r['exit_code']}), {r['wall']:.1f} s; "
        f"evaluate.py {r['num_episodes']} episodes ({r['split']}) in {r['eval_seconds']:.0f} s"
    )


def nav_overrides(bench: Bench, device: str) -> list[str]:
    """ppo_nav's overrides on ``device``: the batched task and the learner both there."""
    from rl.utils.threads import available_cores

    return [
        "sampler=batched",
        f"sampler.device={device}",
        f"device={device}",
        f"torch_threads={bench.budget.torch_threads or available_cores()}",
        "eval.num_episodes=0",  # evaluate.py scores the checkpoint
        "pipeline.save_interval=0",  # a checkpoint at the stop (and stage ends) only
        "pipeline.metric_accumulate_interval=1",  # a metrics record every rollout
        "logger.sinks.console.progress_bar=false",
        *bench.budget.nav,
        *bench.nav_override,
    ]


def nav_rows(bench: Bench, no_cuda: str | None) -> None:
    """Rows 1 and 2: ppo_nav with the batched task, on CUDA and on the CPU."""
    budget, dry = bench.budget, bench.dry
    settings = dict(o.partition("=")[::2] for o in [*budget.nav, *bench.nav_override])
    envs = f"{int(settings['sampler.num_envs']):,} envs x {settings['pipeline.num_steps']} steps"
    runs: dict[str, dict[str, Any]] = {}
    for key, device in (("ppo_nav_cuda", bench.device), ("ppo_nav_cpu", "cpu")):
        label = "CUDA" if key.endswith("cuda") else "CPU"
        name = f"ppo_nav, batched task and learner on {label} ({envs})"
        if dry and key.endswith("cuda"):
            name += ", dry run: on the CPU"
        if no_cuda:  # the CPU row is the CUDA row's reference, measured on the same box
            target = f">= {NAV_FPS:,}" if label == "CUDA" else "(the 2x reference)"
            bench.add(Row(name, "training steps/s", "skipped", target, no_cuda))
            continue
        if dry and label == "CPU":
            # In a dry run the CUDA row ran this very command on the CPU: its run serves both.
            r = runs[key] = runs["ppo_nav_cuda"]
        else:
            r = runs[key] = sigterm_run(
                bench, key, "ppo_nav", budget.nav_seconds, nav_overrides(bench, device)
            )
        bench.results[key] = r
        if "error" in r:
            bench.add(Row(name, "training steps/s", "error", "", r["error"]))
            continue
        fps = r["fps"]["fps"]
        if label == "CUDA":
            bench.add(
                Row(
                    name,
                    "training steps/s",
                    f"{fps:,.0f}",
                    f">= {NAV_FPS:,}",
                    bench.verdict(fps >= NAV_FPS),
                    f"{r['fps']['records']} records after the first",
                ),
                Row(
                    name,
                    f"held-out success at {budget.nav_seconds:g} s wall",
                    f"{r['success']:.3f} (SPL {r['spl']:.3f})",
                    f">= {NAV_SUCCESS}",
                    bench.verdict(r["success"] >= NAV_SUCCESS),
                    stop_note(r),
                ),
            )
        else:
            bench.add(
                Row(
                    name,
                    "training steps/s",
                    f"{fps:,.0f}",
                    "(the 2x reference)",
                    "",
                    f"success {r['success']:.3f} at {budget.nav_seconds:g} s; {stop_note(r)}"
                    + ("; dry run: the row above's run (the same command)" if dry else ""),
                )
            )
        bench.write()
    name = "CUDA learner / CPU learner, ppo_nav batched (rows above)"
    if all(k in runs and "error" not in runs[k] for k in ("ppo_nav_cuda", "ppo_nav_cpu")):
        ratio = runs["ppo_nav_cuda"]["fps"]["fps"] / runs["ppo_nav_cpu"]["fps"]["fps"]
        bench.results["speedup"] = ratio
        bench.add(
            Row(
                name,
                "training steps/s ratio",
                f"{ratio:.2f}x",
                f">= {SPEEDUP:g}x",
                bench.verdict(ratio >= SPEEDUP),
            )
        )
    else:
        bench.add(
            Row(
                name,
                "training steps/s ratio",
                "skipped",
                f">= {SPEEDUP:g}x",
                "skipped: a row above did not measure",
            )
        )


def nav3d_missing() -> str | None:
    """Why the nav3d rows cannot run here (a package missing), or None."""
    missing = [p for p in NAV3D_PACKAGES if importlib.util.find_spec(p) is None]
    return f"skipped: no package {', '.join(missing)} here" if missing else None


def nav3d_rows(bench: Bench, no_cuda: str | None) -> None:
    """Rows 3 and 4: nav3d's raw limit of the auto layout, then the depth agent in it."""
    from rl.utils.threads import AUTO, auto_count

    budget = bench.budget
    workers = auto_count(AUTO)  # what collector.num_workers=auto gives train.py here
    num_envs = workers * budget.envs_per_worker
    layout = f"{workers} process worker{'s' * (workers != 1)} x {budget.envs_per_worker} envs"
    raw_name = f"nav3d raw limit: {layout} ({NAV3D_TASK}, depth 40x30, expert actions)"
    name = f"{NAV3D} {NAV3D_TASK}, collector.num_workers=auto: {layout}, {bench.device} learner"
    missing = nav3d_missing()
    skip = missing or no_cuda
    overrides = [
        f"task={NAV3D_TASK}",
        "collector=process",
        f"collector.num_workers={AUTO}",
        f"sampler.num_envs={num_envs}",
        *budget.nav3d,
        *bench.nav3d_override,
    ]
    if skip:
        bench.add(
            Row(raw_name, "env steps/s", "skipped", "(the 80% reference)", skip),
            Row(name, "training steps/s", "skipped", f">= {NAV3D_SHARE:.0%} of raw", skip),
        )
        return
    # Row 3: the raw limit (a child process: forkserver workers re-import its __main__).
    log = bench.out / "nav3d_raw.log"
    spec: dict[str, Any] = {
        "seconds": budget.raw_seconds,
        "workers": workers,
        "num_envs": num_envs,
        "overrides": overrides,
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), CHILD_RAW, json.dumps(spec)]
    timeout = 240 + workers * 2 * budget.raw_seconds
    code, wall = run_logged(cmd, log, timeout)
    found = last_json(log) if code == 0 else None
    raw: float | None = found["steps_per_s"] if found else None
    bench.results["nav3d_raw"] = {"command": cmd, "wall": wall, "steps_per_s": raw, **spec}
    if raw is None:
        bench.add(Row(raw_name, "env steps/s", "error", "", failure(code, log, timeout)))
    else:
        bench.add(
            Row(
                raw_name,
                "env steps/s",
                f"{raw:,.0f}",
                "(the 80% reference)",
                "",
                f"{budget.raw_seconds:g} s of stepping, all workers at once",
            )
        )
    bench.write()

    # Row 4: the depth agent in that layout, learner on the device.
    extra = [
        f"device={bench.device}",
        "eval.num_episodes=0",
        # A record every rollout (the experiment's 128 steps unless overridden).
        "pipeline.metric_accumulate_interval=1",
        "logger.sinks.console.progress_bar=false",
    ]
    r = sigterm_run(bench, "nav3d", NAV3D, budget.nav3d_seconds, [*extra, *overrides])
    bench.results["nav3d"] = r
    if "error" in r:
        bench.add(Row(name, "training steps/s", "error", "", r["error"]))
        return
    fps = r["fps"]["fps"]
    split = ", ".join(f"{k} {v:.2f}" for k, v in r["fps"]["split"].items())
    share = fps / raw if raw else None
    bench.add(
        Row(
            name,
            "training steps/s",
            f"{fps:,.0f}",
            f">= {NAV3D_SHARE:.0%} of raw" + (f" = {NAV3D_SHARE * raw:,.0f}" if raw else ""),
            bench.verdict(share is not None and share >= NAV3D_SHARE),
            f"last record's time split: {split}",
        ),
        Row(
            name,
            "share of the raw limit",
            "n/a" if share is None else f"{share:.0%}",
            f">= {NAV3D_SHARE:.0%}",
            bench.verdict(share is not None and share >= NAV3D_SHARE)
            if share is not None
            else "no raw limit",
        ),
        Row(
            name,
            f"held-out success at {budget.nav3d_seconds:g} s wall",
            f"{r['success']:.3f} (SPL {r['spl']:.3f})",
            f">= {NAV3D_SUCCESS}",
            bench.verdict(r["success"] >= NAV3D_SUCCESS),
            stop_note(r),
        ),
    )


def child_raw_nav3d(spec: dict[str, Any]) -> None:
    """Row 3 in its own process: the experiment's task, stepped by its layout; prints JSON."""
    import torch
    from omegaconf import OmegaConf

    sys.path.insert(0, str(ROOT / "bench"))
    import nav3d_fps  # noqa: E402  (this folder's sibling benchmarks)
    import train_fps  # noqa: E402

    torch.set_num_threads(1)
    cfg = train_fps.compose_run(NAV3D, spec["overrides"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    print("task:", json.dumps(task), flush=True)
    value = nav3d_fps.raw_workers(
        "process",
        spec["seconds"],
        workers=spec["workers"],
        actions="expert",
        task=task,  # type: ignore[arg-type]
        num_envs=spec["num_envs"],
    )
    print(json.dumps({"steps_per_s": value}))


# --------------------------------------------------------------------------- main
def key_value(flag: str) -> Callable[[str], str]:
    """An argparse type: ``KEY=VALUE``, else an error naming ``flag``."""

    def check(text: str) -> str:
        if "=" not in text or not text.partition("=")[0]:
            raise argparse.ArgumentTypeError(f"{flag}: expected KEY=VALUE, got {text!r}")
        return text

    return check


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the table and logs go here")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny budgets, on the CPU")
    parser.add_argument("--smoke", action="store_true", help="--cpu-dry-run (tests/test_bench)")
    parser.add_argument("--nav-seconds", type=float, default=None, help="ppo_nav rows' SIGTERM")
    parser.add_argument("--nav3d-seconds", type=float, default=None, help="nav3d row's SIGTERM")
    parser.add_argument("--raw-seconds", type=float, default=None, help="raw nav3d stepping")
    parser.add_argument("--envs-per-worker", type=int, default=None, help="nav3d envs a worker")
    parser.add_argument(
        "--nav-override",
        action="append",
        default=[],
        type=key_value("--nav-override"),
        metavar="KEY=VALUE",
        help="Hydra override for both ppo_nav rows (after this file's)",
    )
    parser.add_argument(
        "--nav3d-override",
        action="append",
        default=[],
        type=key_value("--nav3d-override"),
        metavar="KEY=VALUE",
        help="Hydra override for the nav3d rows (after this file's)",
    )
    args = parser.parse_args(argv)
    for flag in ("nav_seconds", "nav3d_seconds", "raw_seconds", "envs_per_worker"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            parser.error(f"--{flag.replace('_', '-')}: must be positive, got {value}")
    return args


def budget_of(args: argparse.Namespace, dry: bool) -> Budget:
    """The mode's budget with the flags given."""
    base = CPU_DRY_RUN if dry else GPU_BOX
    given = {
        f: getattr(args, f)
        for f in ("nav_seconds", "nav3d_seconds", "raw_seconds", "envs_per_worker")
        if getattr(args, f) is not None
    }
    return dataclasses.replace(base, **given)


def cuda_skip(dry: bool, cuda: bool) -> str | None:
    """Why every row is skipped without ``--cpu-dry-run`` and CUDA (None: they run)."""
    if dry or cuda:
        return None
    return "skipped: no CUDA device (torch.cuda.is_available() is False); --cpu-dry-run runs here"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dry = args.cpu_dry_run or args.smoke
    with tempfile.TemporaryDirectory(prefix="gpu_box_") as tmp:
        if args.out is not None:
            out = args.out
        elif args.smoke:  # the test suite's run leaves nothing behind
            out = Path(tmp)
        else:
            stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            out = ROOT / "outputs" / "bench" / "gpu_box" / stamp
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        info = machine()
        bench = Bench(
            out=out,
            dry=dry,
            budget=budget_of(args, dry),
            info=info,
            nav_override=args.nav_override,
            nav3d_override=args.nav3d_override,
        )
        bench.results["budget"] = dataclasses.asdict(bench.budget)
        print(
            f"gpu_box: {info['device']}, {info['cores']} cores, torch {info['torch']}; "
            f"table and logs in {out}",
            flush=True,
        )
        no_cuda = cuda_skip(dry, info["cuda"])
        nav_rows(bench, no_cuda)
        bench.write()
        nav3d_rows(bench, no_cuda)
        bench.write(done=True)
        # What the folder holds, read back (tests/test_bench.py checks these lines).
        print("\n" + (out / "table.md").read_text(), flush=True)
        print(f"files in {out}: {' '.join(sorted(p.name for p in out.iterdir()))}")
    return 0 if bench.measured and not bench.errors else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD_RAW:
        child_raw_nav3d(json.loads(sys.argv[2]))
        gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
    else:
        code = main()
        gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
        sys.exit(code)
