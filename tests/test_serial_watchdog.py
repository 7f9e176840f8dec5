"""A hung environment in ``sampler=serial`` never stalls a run for good (issue 34, major point).

The serial sampler's watchdog (:mod:`rl.sampling.watchdog`) ends a step that takes longer than
``sampler.timeout`` with an error naming the environment; a second SIGTERM ends a run whose
rollout boundary never comes (before: a hung environment stayed hung for 20 minutes and ignored
SIGTERM twice).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl.sampling import SerialSampler
from rl.sampling.watchdog import SamplerTimeoutError
from rl.utils.seeding import env_seeds

ROOT = Path(__file__).resolve().parent.parent


def _hanging(num_envs: int, env: int, seed: int = 0) -> dict:
    """Environment ``env`` of ``num_envs`` sleeps an hour on its second step."""
    return {"_target_": "rl_envs.toys.debug.FaultyEnv", "mode": "hang", "fail_at_step": 2,
            "fail_seed": env_seeds(num_envs, seed)[env]}  # fmt: skip


@pytest.mark.timeout(60)
def test_the_watchdog_ends_a_hung_step_naming_the_environment() -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    with SerialSampler(task=_hanging(3, 1), num_envs=3, seed=0, timeout=1.5) as sampler:
        sampler.reset()
        with pytest.raises(SamplerTimeoutError, match=r"environment 1 \(FaultyEnv\) took more "
                                                     r"than 1.5 s stepping"):  # fmt: skip
            for _ in range(3):
                sampler.step(np.zeros(3, dtype=np.int64))
    assert signal.getsignal(signal.SIGUSR2) == previous  # restored once no sampler watches
    with SerialSampler(task=_hanging(3, 1), num_envs=3, seed=0, timeout=None) as sampler:
        sampler.reset()
        sampler.step(np.zeros(3, dtype=np.int64))  # (no watchdog: nothing armed)


def _train(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    seed = env_seeds(4, 1)[2]
    task = ("+task={_target_: rl_envs.toys.debug.FaultyEnv, mode: hang, fail_at_step: 2, "
            f"fail_seed: {seed}}}")  # fmt: skip
    return subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "+experiment=ppo_cartpole",
            "+debug=smoke",
            "~task",
            task,
            "sampler.num_envs=4",
            "eval.num_episodes=0",
            f"hydra.run.dir={tmp_path / 'run'}",
            *overrides,
        ],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "err").open("w"),
        env={**os.environ, "WANDB_MODE": "disabled"},
    )


@pytest.mark.timeout(120)
def test_a_hung_serial_run_ends_with_the_watchdog_s_error(tmp_path: Path) -> None:
    proc = _train(tmp_path, "sampler.timeout=3")
    assert proc.wait(timeout=100) == 1
    assert (
        "environment 2 (FaultyEnv) took more than 3 s stepping" in (tmp_path / "err").read_text()
    )


@pytest.mark.timeout(120)
def test_a_second_sigterm_ends_a_hung_run(tmp_path: Path) -> None:
    proc = _train(tmp_path, "sampler.timeout=null")
    log = tmp_path / "run" / "train.log"
    deadline = time.monotonic() + 60
    while "torch threads" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
        time.sleep(0.2)
    time.sleep(4)  # in the hung step by now (its second step)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert proc.poll() is None  # the first one waits for the rollout boundary
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "SIGTERM again: exiting now without saving" in (tmp_path / "err").read_text()
