"""One writer per run folder (issue 19, point 5): a second trainer is refused at once.

Two ``train.py resume=R`` started together used to both run to the end, writing every env step
twice into ``metrics.jsonl`` and interleaving two checkpoint histories.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl.checkpoints import list_checkpoints, load_checkpoint
from rl.checkpoints.files import parse_checkpoint_name
from rl.checkpoints.lock import LOCK_NAME, RunFolderLockedError, RunLock
from rl.engine import run

ROOT = Path(__file__).resolve().parent.parent
SMOKE = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "task=nav_small",
    "eval.num_episodes=0",
    "model.cnn_channels=[8]",
    "model.trunk_layers=[16]",
    "model.rnn_hidden_size=8",
]
HOLD = """
import sys, time
from rl.checkpoints.lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_folder_is_refused_naming_the_holder_and_a_killed_holder_does_not_block(
    tmp_path: Path,
) -> None:
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunFolderLockedError) as info:
            RunLock(tmp_path).acquire()
        assert f"run folder {tmp_path} is in use by another process (pid {proc.pid} " in str(
            info.value
        )
    finally:
        proc.send_signal(signal.SIGKILL)  # no clean-up: the kernel drops its lock
        proc.wait(timeout=10)
    with RunLock(tmp_path) as lock:  # a stale lock file blocks nothing
        assert lock.held and f"pid {os.getpid()} " in (tmp_path / LOCK_NAME).read_text()
        with pytest.raises(RunFolderLockedError):  # not even a second taker in this process
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()  # released at the end of the with


def test_evaluate_and_resume_refuse_a_folder_another_process_holds(
    tmp_path: Path, compose_cfg
) -> None:
    run.train(compose_cfg(SMOKE))  # -> tmp_path / "run"
    proc = _holder(tmp_path / "run")
    try:
        cfg = compose_cfg(
            [f"run_dir={tmp_path / 'run'}", "num_episodes=2", f"output_dir={tmp_path}/e"],
            config_name="evaluate",
        )
        with pytest.raises(RunFolderLockedError, match=f"pid {proc.pid} "):
            run.evaluate(cfg)
        with pytest.raises(RunFolderLockedError, match=f"pid {proc.pid} "):
            run.train(compose_cfg([*SMOKE, f"resume={tmp_path / 'run'}"]))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert not list((tmp_path / "run" / "checkpoints").glob("*.eval*.json"))


def _train(tmp_path: Path, name: str, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    return subprocess.Popen(
        [sys.executable, "train.py", *SMOKE, *overrides, f"hydra.run.dir={tmp_path / name}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / f"{name}.err").open("w"),
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_concurrent_resumes_the_second_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    first = _train(tmp_path, "run")
    assert first.wait(timeout=120) == 0, (tmp_path / "run.err").read_text()
    resume = [f"resume={folder}", "total_env_steps=2048", "pipeline.save_interval=256"]
    a = _train(tmp_path, "a", *resume)
    deadline = time.monotonic() + 120
    while f"pid {a.pid} " not in (folder / LOCK_NAME).read_text():
        assert a.poll() is None and time.monotonic() < deadline, (tmp_path / "a.err").read_text()
        time.sleep(0.05)
    # The first resume holds the lock; it is paused so that it cannot finish (a smoke run
    # takes about a second) before the second one has started and been refused.
    os.kill(a.pid, signal.SIGSTOP)
    try:
        b = _train(tmp_path, "b", *resume)
        assert b.wait(timeout=120) == 1
        assert a.poll() is None, "the refusal came while the first resume was still training"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    refusal = (tmp_path / "b.err").read_text()
    assert f"run folder {folder} is in use by another process (pid {a.pid} " in refusal
    assert a.wait(timeout=240) == 0, (tmp_path / "a.err").read_text()
    # One history: every env step logged once, in order; every checkpoint of one config.
    steps = [json.loads(line)["env_step"] for line in (folder / "metrics.jsonl").open()]
    assert steps == sorted(set(steps)) and steps[-1] == 2048
    resumed = [p for p in list_checkpoints(folder) if parse_checkpoint_name(p)[1] > 256]
    configs = {json.dumps(load_checkpoint(p)["config"], sort_keys=True) for p in resumed}
    assert len(resumed) == (2048 - 256) // 256 and len(configs) == 1


@pytest.mark.slow
def test_a_refused_run_never_removes_a_folder_another_process_holds(tmp_path: Path) -> None:
    """A run refused for its config shares ``hydra.run.dir`` with a live run that has only
    Hydra's files so far: the live folder and its lock stay (issue 34, critical point 6)."""
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    proc = _holder(folder)  # the live run, still building its task
    try:
        refused = _train(tmp_path, "run", "pipeline.num_steps=abc")
        assert refused.wait(timeout=120) == 1
        assert "pipeline.num_steps" in (tmp_path / "run.err").read_text()
        assert (folder / ".hydra" / "config.yaml").exists()
        assert f"pid {proc.pid} " in (folder / LOCK_NAME).read_text()
        with pytest.raises(RunFolderLockedError, match=f"pid {proc.pid} "):
            RunLock(folder).acquire()  # the live lock still keeps a third run out
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # (With nobody holding it, a refused run's folder still goes: test_cli's refused configs.)
