"""The benchmark scripts (``bench/*.py``) run end to end with ``--smoke`` and print their tables.

Benchmarks are scripts outside the test suite, so a change to a config or an API could break
them silently. Every ``bench/*.py`` (found by glob: a new script is covered without an edit
here) runs as a subprocess with ``--smoke`` (tiny budgets, the same code paths as a real run)
and must exit 0, print its table (header and rows, checked by shape, not by figure; a script
without an entry in ``TABLES`` only has to print something) and leave no process behind (its
private Ray instance, worker processes). The runs go ``PARALLEL`` at a time, the longest first:
a module fixture starts them, and each test waits for its own; a run still going
``RUN_TIMEOUT`` seconds after it started is killed and fails (pytest-timeout is the backstop).

A run whose subprocesses already run another script's mode checks that mode through their logs
(``LOGS``: the run keeps its folder, ``--out``), instead of a run of its own: ``gpu_box``'s
ppo_nav row is ``time_to_success.py --smoke --sigterm`` (train.py, then evaluate.py on its last
checkpoint), so its log holds that mode's table.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))
RUN_TIMEOUT = 300  # seconds per run (alone, the longest takes under a minute here)
PARALLEL = 2  # runs at a time on two cores (they wait for Ray and worker processes to start)
# Every run by its time alone (a run missing here starts last): the long ones first, so that no
# long run starts near the end while the other slot idles (2026-11, wall and CPU seconds alone).
LONGEST_FIRST = [
    "gpu_box",
    "atari_fps",  # with bench/atari_fps.py's reference environment (CleanRL's rows) made
    "published",
    "ddp_fps",
    "learning_comparison",
    "nav3d_fps",
    "collector_fps",
    "continuous_vs_sb3",
    "threads",
    "mujoco_differences",
    "sampler_fps",
    "train_fps",
    "multiagent_fps",
    "eval_fps",
    "device_path",
    "profile_split",
    "nav_batched_fps",
    "time_to_success",
]
NUM = r"-?[\d,]+(?:\.\d+)?"  # a figure: 1,234 or 0.95 (its value is not checked)
_FIG = rf"(?:{NUM}|n/a)"  # a figure, or n/a where nothing was measured


@dataclass(frozen=True)
class SmokeRun:
    """One command line: ``python bench/<script> --smoke``.

    A script with more than one mode prints every mode's table under ``--smoke`` (one
    interpreter start for all: ``collector_fps``'s straggler comparison follows its collectors).
    """

    script: str

    @property
    def id(self) -> str:
        return self.script.removesuffix(".py")


def _start_order(run: SmokeRun) -> int:
    return LONGEST_FIRST.index(run.id) if run.id in LONGEST_FIRST else len(LONGEST_FIRST)


# In start order, so that each test's duration is about its own run's share of the file's time.
RUNS = sorted((SmokeRun(s.name) for s in SCRIPTS), key=_start_order)
# A test waits for the runs started before its own: at worst all of them, to the end.
TEST_TIMEOUT = RUN_TIMEOUT * math.ceil(len(RUNS) / PARALLEL) + 60


def _rows(*labels: str, value: str) -> list[str]:
    """One pattern per label: the label, then ``value`` (a row of the table)."""
    return [rf"^  {re.escape(label)}\s+{value}$" for label in labels]


_OURS_TRAIN_FPS = [
    "ours ppo_nav, CNN + GRU policy (nav_cnn_gru)",
    "ours ppo_nav, memoryless CNN (nav_cnn)",
    "ours ppo_nav, memoryless MLP (mlp)",
    "ours ppo_nav, flattened -> GRU 128",
    "ours ppo_nav default, batched, CNN + GRU",
    "ours batched wide, CNN + GRU",
    "ours batched wide, MLP",
    "ours MLP, async worker (collector=process)",
    "ours flattened -> GRU 128, async worker",
    "stable-baselines3 PPO, MLP, DummyVecEnv",
    "sb3-contrib RecurrentPPO, flattened -> LSTM 128",
]
_SPLIT = rf"\[collect {NUM} env {NUM} inference {NUM} update {NUM}\]"
_RAY = (
    rf" \| lag {NUM}, {NUM} KiB sent per rollout \(x{NUM}, packed in {NUM} ms\), "
    rf"worker {NUM} FPS"
)
_NAV3D_LAYOUTS = [
    "serial sampler, in-process",
    "multiprocess sampler (2 procs)",
    "1 process worker, async",
]
# What each run's table looks like: patterns that must each match a line of its stdout.
TABLES: dict[str, list[str]] = {
    "train_fps": [
        rf"^training FPS on rl/PointNav-v0, {NUM} env steps each \(16 envs x 16 steps, ",
        *_rows("raw environment limit (serial, random actions)", value=f"{NUM} steps/s"),
        *_rows(*_OURS_TRAIN_FPS, value=f"{NUM} FPS"),
        "^ratios$",
        rf"^  ours batched GRU / ours serial GRU: {NUM}x$",
        rf"^  ours batched wide GRU / serial GRU: {NUM}x$",
        rf"^  ours MLP / SB3 PPO:\s+{NUM}x$",
        rf"^  ours batched wide MLP / SB3 PPO:\s+{NUM}x$",
        rf"^  ours flattened-GRU async / RecurrentPPO: {NUM}x$",
    ],
    "multiagent_fps": [
        rf"^PointNav 9x9, 16 environments, {NUM} steps \(rows\) each, 1 thread$",
        *_rows(
            "raw limit, 1 agent (env steps/s)",
            "raw limit, 2 agents (agent-steps/s)",
            value=NUM,
        ),
        *_rows("ppo_nav, task=nav_small (1 agent)", value=f"{NUM} env steps/s"),
        *_rows(
            "mappo_nav_multi (2 agents)",
            "ippo_nav_multi (2 agents)",
            value=f"{NUM} agent-steps/s",
        ),
    ],
    "collector_fps": [
        r"^training FPS on rl/PointNav-v0, .*, 1 Ray worker\(s\)\)$",
        *_rows("ours mlp, local", value=f"{NUM} FPS   {_SPLIT}"),
        *_rows(
            "ours mlp, ray sync",
            "ours mlp, ray async",
            value=f"{NUM} FPS   {_SPLIT}{_RAY}",
        ),
        *_rows("stable-baselines3 PPO, MLP", value=f"{NUM} FPS"),
        # the straggler comparison (--slow-worker's table), in the same run
        r"^learner FPS with a straggler: 2 process workers x 8 envs of "
        r"rl_envs.toys.debug.SlowEnv, ",
        *_rows(
            "barrier (every worker's rollout)",
            "barrier-free (first ready)",
            value=rf"{NUM} FPS \| lag mean {NUM} max {NUM}, dropped {NUM}",
        ),
        rf"^  barrier-free / barrier: {NUM}x$",
    ],
    "continuous_vs_sb3": [
        rf"^PPO on Pendulum-v1, {NUM} env steps each \(8 envs x 256 steps, 10 epochs x 32 "
        r"minibatches of 64, 1 torch thread\), seed 1$",
        *_rows(
            "ours (+experiment=ppo_continuous)",
            "stable-baselines3 PPO (VecNormalize)",
            value=rf"eval return\s+{NUM}\s+{NUM} FPS",
        ),
        "^ratios$",
        rf"^  FPS ours / SB3:\s+{NUM}x$",
        rf"^  return ours - SB3:\s+[+-]?{NUM}$",
    ],
    "published": [
        r"^# Published results, reproduced$",
        r"^\| environment \| budget \| preset \| metric \| ours \| reference \| source \| .+ "
        r"\| ours, other actions \|$",
        *(
            # n/a: no training episode ended within --smoke's budget (MuJoCo's last 1,000 steps)
            rf"^\| {re.escape(env)} \| {NUM} \| `ppo_[a-z_]+` \| [^|]+ \| {_FIG} \+- {_FIG} \| "
            rf"{NUM} \+- {NUM} \| [^|]+ \| {_FIG} \| (yes|no) \| {_FIG} "
            rf"\| (?:{NUM} \+- {NUM} \((?:argmax|sampled)\)|n/a) \|$"
            for env in ("Walker2d-v5", "CartPole-v1", "MiniGrid-Unlock-v0")  # one per preset
        ),
        r"^\| implementation \| eval return \(mean \+- std\) \| per seed \| training FPS \|$",
        rf"^\| ours \(`ppo_mujoco`\) \| {NUM} \+- {NUM} \| {NUM} \| {_FIG} \|$",
        rf"^\| stable-baselines3 PPO \| {NUM} \+- {NUM} \| {NUM} \| {_FIG} \|$",
        rf"^Ratios ours / SB3: return {_FIG}, FPS {_FIG}\.$",
    ],
    "mujoco_differences": [
        r"^\| setting \| eval return \| per seed \| training return \| change in eval return "
        r"\| training FPS \|$",
        *(
            rf"^\| .+ \(\"{key}\"\) \| {NUM} \+- {NUM} \| {NUM} \| {_FIG} \+- {_FIG} \| "
            rf"(?:[+-]?{NUM} vs \"[a-z_]+\")? \| {_FIG} \|$"
            for key in ("shipped", "gamma_lr")  # --smoke's two rows
        ),
    ],
    "ddp_fps": [
        r"^ppo_nav, 4 envs/rank, 16-step rollouts, 256 env steps$",
        r"^\s*ranks\s+FPS\s+wall s$",
        rf"^\s+1\s+{NUM}\s+{NUM}$",
        rf"^\s+2\s+{NUM}\s+{NUM}$",
    ],
    "learning_comparison": [
        r"^env steps to eval success >= 0.9 \(4 episodes, sampled actions, evaluated every 128 ",
        *_rows(
            "ppo_nav",
            "dagger_ppo_nav",
            "bc_offline_ppo_nav",
            "a2c_nav",
            value=rf"(?:not by )?{NUM}   \({NUM} min/run\)",
        ),
    ],
    "nav3d_fps": [
        r"^\(a\) raw steps/s, rl/PointNav3D-v0, 4 envs, random turn/forward actions, ",
        *_rows("serial (1 process, 4 envs)", value=f"{NUM} steps/s"),
        *_rows(
            *(f"{kind} (2 x 2 envs)" for kind in ("multiprocess sampler", "process workers")),
            "Ray workers (2 x 2 envs)",
            value=f"{NUM} steps/s",
        ),
        *_rows("reset (mean of 20, one env)", value=f"{NUM} ms"),
        r"^\(b\) ppo_nav3d from scratch \(short episodes\): training FPS, 128 env steps each",
        r"^\(b\) dagger_ppo_nav3d imitation \(expert-length episodes\): training FPS, 128 env ",
        *_rows(*_NAV3D_LAYOUTS, value=rf"{NUM} FPS of\s+{NUM} raw\s+{NUM}%"),
    ],
    "profile_split": [
        r"^ppo_nav .*: ms per 1,000 env steps \(1 rollouts profiled\)$",
        *_rows(
            "collection",
            "  environment steps",
            "  policy forward (act)",
            "  storage inserts",
            "  the rest",
            "update",
            "  forward and losses",
            "  backward",
            "  optimizer step",
            value=rf"{NUM}\s+{NUM}%",
        ),
        *_rows("total", value=NUM),
        r"^largest operators \(self time, ms per 1,000 env steps, collection and update\):$",
        rf"^  aten::\S+\s+{NUM}  x\d+$",
    ],
    "sampler_fps": [
        r"^\(a\) raw environment steps/s, random actions, no policy$",
        *_rows("serial (1 process)", "multiprocess 2 x 8", value=NUM),
        rf"^  raw limit: {NUM} steps/s \(.+\)$",
        rf"^  mlp\s+serial: {NUM}  mp 2 sync: {NUM}  mp 2 halves overlapped: {NUM}$",
        r"^\(b\) our training FPS, ppo_nav, 512 env steps \(16 envs x 16 steps, ",
        *_rows(
            "ours memoryless MLP (mlp), serial",
            "ours memoryless MLP (mlp), mp 2x8",
            value=rf"{NUM} FPS  (?: [a-z_]+={NUM})+",  # the time split, env=0.32 ...
        ),
        *_rows("stable-baselines3 dummyVecEnv", value=f"{NUM} FPS"),
        r"^  \(--smoke: no SubprocVecEnv row",
        r"^\(m\) peak memory of a ppo_nav training run \(whole process tree\)$",
        rf"^  serial\s+\d+ processes: peak RSS sum {NUM} MiB, peak PSS sum {NUM} MiB$",
        rf"^  best memoryless training FPS: {NUM} \(.+\)$",
        rf"^  stable-baselines3 best: {NUM} -> {NUM}x \(target >= 2x\)$",
    ],
    "time_to_success": [
        r"^time to evaluation success, ppo_nav \+debug=smoke \(budget 256 env steps\), ",
        r"^seed \| >=0.90: train s\s+wall s\s+env steps \| >=0.95: train s\s+wall s\s+env steps "
        r"\| final success\s+SPL\s+at step \|\s+train s evals\s+eval s$",
        rf"^\s+1 \|(?:\s+(?:-|{NUM})){{3}} \|(?:\s+(?:-|{NUM})){{3}} \|\s+{NUM}\s+{NUM}\s+256 \|",
        r"^success >= 0.9: reached by \d/1 seeds",
        r"^seed\s+env steps\s+train s\s+wall s\s+success\s+SPL$",
        rf"^\s+1\s+128(?:\s+{NUM}){{4}}$",
        rf"^\s+1\s+256(?:\s+{NUM}){{4}}$",
    ],
    "nav_batched_fps": [
        r"^raw environment steps/s, PointNav 19x19 \(conf/task/nav.yaml\), uniformly random "
        r"actions, no policy, 1 torch thread\(s\), \d+ CPUs, 0.3 s a row$",
        *_rows(
            "serial sampler, 16 PointNavEnv",
            "BatchedPointNav, 16 envs",
            "BatchedPointNav, 64 envs",
            value=rf"{NUM} steps/s\s+{NUM} ms/step\s+{NUM}x",
        ),
        rf"^  BatchedPointNav 64 envs / serial sampler: {NUM}x$",
    ],
    "atari_fps": [
        r"^Atari throughput, ALE/Breakout-v5, 8 environments; machine: ",
        r"^\(a\) raw environment steps/s \(agent steps, 4 frames each\), random actions, ",
        *_rows(
            "per-env form, serial sampler",
            "batched twin, batched sampler",
            "ale-py AtariVectorEnv alone",
            value=f"{NUM} steps/s",
        ),
        # n/a: no reference environment for CleanRL's script (--smoke never makes one)
        *_rows("envpool 1.2.5 alone (CleanRL's)", value=f"{_FIG} steps/s"),
        rf"^  channels-last copy of a step's frames: {NUM} us \({NUM}% of a twin step\)$",
        r"^\(b\) training FPS, 256 env steps each \(8 envs x 16 steps, 4 epochs x 4 minibatches",
        *_rows("ours +experiment=ppo_atari (sampler=batched)", value=rf"{NUM} FPS   wall {NUM} s"),
        *_rows(
            "CleanRL ppo_atari_envpool.py (envpool 1.2.5)",
            value=rf"{_FIG} FPS   wall {_FIG} s",
        ),
        rf"^  ours / CleanRL: (?:{NUM}x|n/a)$",
    ],
    # --smoke: the CPU dry run; the table as read back from its table.md, then the folder.
    "gpu_box": [
        r"^# GPU box benchmark: CPU dry run",
        r"^device: \S",
        r"^cores: \d+ \(\d+ this process may use\); CPU: ",
        r"^torch \S+ \(CUDA \S+\), Python 3\.\d+",
        r"^\| row \| measure \| value \| target \| verdict \| notes \|$",
        *(
            rf"^\| {re.escape(row)}[^|]* \| {re.escape(measure)}[^|]* \| {value} \| [^|]+ \| "
            r"(?:dry run)? \| [^|]* \|$"
            for row, measure, value in [
                ("ppo_nav, batched task and learner on CUDA", "training steps/s", NUM),
                (
                    "ppo_nav, batched task and learner on CUDA",
                    "held-out success",
                    rf"{NUM} \(SPL {NUM}\)",
                ),
                ("ppo_nav, batched task and learner on CPU", "training steps/s", NUM),
                ("CUDA learner / CPU learner", "training steps/s ratio", f"{NUM}x"),
                ("nav3d raw limit: ", "env steps/s", NUM),
                ("dagger_ppo_nav3d_depth nav3d_small", "training steps/s", NUM),
                ("dagger_ppo_nav3d_depth nav3d_small", "share of the raw limit", f"{NUM}%"),
                (
                    "dagger_ppo_nav3d_depth nav3d_small",
                    "held-out success",
                    rf"{NUM} \(SPL {NUM}\)",
                ),
                ("whole benchmark", "wall time", f"{NUM} s"),
            ]
        ),
        # (the two ppo_nav rows are one run in a dry run: the same command on the CPU)
        r"^files in \S+: nav3d nav3d\.log nav3d_raw\.log ppo_nav_cuda ppo_nav_cuda\.log "
        r"results\.json table\.md$",
    ],
}

# time_to_success.py's SIGTERM mode and its evaluate.py run (the smoke run ends before the
# signal: exit 0), as a run's log in its folder prints it.
_SIGTERM_TABLE = [
    rf"^ppo_nav stopped by SIGTERM {NUM} s after launch, last checkpoint evaluated with "
    r"evaluate.py defaults \(4 episodes, split test\)$",
    r"^seed \| exit\s+wall s\s+stop s \|\s+env steps \| success\s+SPL \| evaluate.py s$",
    rf"^\s+1 \|\s+(?:0|143)\s+{NUM}\s+(?:-|{NUM}) \|\s+{NUM} \|\s+{NUM}\s+{NUM} \|\s+{NUM}$",
]
# Runs given ``--out <their folder>``, and what files there must print (patterns as TABLES').
LOGS: dict[str, dict[str, list[str]]] = {
    # time_to_success.py --smoke --sigterm (gpu_box's CPU dry run of its ppo_nav rows)
    "gpu_box": {"ppo_nav_cuda.log": _SIGTERM_TABLE},
}


# ------------------------------------------------------------------------------ running
@dataclass
class Finished:
    """How a run ended: exit code (None: killed at ``RUN_TIMEOUT``), output, leftovers."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    leftovers: list[str] = field(default_factory=list)


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return set()


def _alive(procs: set[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue


class SmokeRunner:
    """Runs ``PARALLEL`` at a time, outputs in ``out_dir``; :meth:`result` waits for one."""

    def __init__(self, runs: list[SmokeRun], out_dir: Path) -> None:
        self.out_dir = out_dir
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL)
        self.futures: dict[SmokeRun, Future[Finished]] = {
            run: self.pool.submit(self._run, run) for run in sorted(runs, key=_start_order)
        }

    def result(self, run: SmokeRun) -> Finished:
        return self.futures[run].result()

    def folder(self, run: SmokeRun) -> Path:
        """Where a run of ``LOGS`` keeps its files (``--out``)."""
        return self.out_dir / run.id

    def close(self) -> None:
        self.stopping.set()  # the runs still going are killed
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, run: SmokeRun) -> Finished:
        """Run ``run`` in its own session, noting every process it starts; then its leftovers."""
        env = {
            **os.environ,
            "WANDB_MODE": "disabled",
            "WANDB_SILENT": "true",
            "RAY_ADDRESS": "",  # a private Ray instance, never a cluster that happens to run
        }
        name = run.id
        out, err = self.out_dir / f"{name}.out", self.out_dir / f"{name}.err"
        start = time.monotonic()
        with out.open("wb") as stdout, err.open("wb") as stderr:
            folder = ["--out", str(self.folder(run))] if run.id in LOGS else []
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / run.script), "--smoke", *folder],
                cwd=ROOT,
                env=env,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        seen: set[psutil.Process] = set()
        while proc.poll() is None:
            if self.stopping.is_set() or time.monotonic() - start > RUN_TIMEOUT:
                seen |= _descendants(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _kill(_alive(seen))
                break
            seen |= _descendants(proc.pid)
            time.sleep(0.5)
        seconds = time.monotonic() - start
        code = None if proc.returncode == -signal.SIGKILL else proc.returncode
        deadline = time.monotonic() + 20  # what it started must end with it
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = _alive(seen)
        names = []
        for p in leftovers:
            try:
                names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                continue
        _kill(leftovers)
        return Finished(
            code, out.read_text(errors="replace"), err.read_text(errors="replace"), seconds, names
        )


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SmokeRunner]:
    """The runs of the selected ``test_smoke_run`` tests, started at once, ``PARALLEL`` going."""
    selected = [
        item.callspec.params["run"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_smoke_run" and hasattr(item, "callspec")
    ]
    runner = SmokeRunner(selected, tmp_path_factory.mktemp("bench_smoke"))
    yield runner
    runner.close()


# -------------------------------------------------------------------------------- tests
def test_every_script_has_smoke_and_every_table_a_run() -> None:
    assert SCRIPTS, "no bench/*.py found"
    missing = [s.name for s in SCRIPTS if '"--smoke"' not in s.read_text()]
    assert not missing, f"bench scripts without a --smoke flag: {missing}"
    assert set(TABLES) | set(LOGS) <= {r.id for r in RUNS}, "TABLES or LOGS names no run"


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_smoke_run(run: SmokeRun, smoke_runs: SmokeRunner) -> None:
    done = smoke_runs.result(run)
    command = f"python bench/{run.script} --smoke"
    assert done.returncode is not None, f"{command} still running after {RUN_TIMEOUT} s"
    if done.returncode == 2 and "unrecognized arguments: --smoke" in done.stderr:
        pytest.fail(f"bench/{run.script} has no --smoke flag")
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{command} printed nothing"
    missing = [p for p in TABLES.get(run.id, []) if not re.search(p, done.stdout, re.MULTILINE)]
    assert not missing, f"{command}: no line matches {missing} in its output:\n{done.stdout}"
    for name, patterns in LOGS.get(run.id, {}).items():
        log = (smoke_runs.folder(run) / name).read_text(errors="replace")
        missing = [p for p in patterns if not re.search(p, log, re.MULTILINE)]
        assert not missing, f"{command}: no line of its {name} matches {missing}:\n{log}"
    assert not done.leftovers, f"{command} left processes running: {done.leftovers}"
