"""Hangs, orphans and budgets of collection: the hang watchdog of multiprocess samplers and
process collection workers, process workers running multiprocess samplers (no process outlives
the learner, whatever ends it), and asynchronous collection ending exactly at its budget.

The hang tests use :class:`rl_envs.toys.debug.FaultyEnv` in ``hang`` mode with a test-shortened
timeout; the CLI tests run the real ``train.py`` and reuse ``test_collection_workers``'s
helpers to find the process tree, signal it and check that nothing is left.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from pipelines import ppo_pipeline
from test_collection_workers import (
    MODEL,
    ROOT,
    SERIAL,
    SMALL,
    SMOKE,
    StepsSeen,
    live_processes_of,
    make_set,
    sigterm_a_running_train,
    wait_until_gone,
)

from rl.checkpoints import latest_checkpoint, load_checkpoint
from rl.collection import CollectionSpec, RolloutRequest
from rl.collection.worker_set import CollectionWorkerError
from rl.engine import run
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.pipeline import PipelineStage, TrainingPipeline
from rl.sampling import MultiprocessSampler, SamplerProcessError
from rl.training import OnPolicyTrainer
from rl.utils.seeding import env_seeds

# The environments of the learner's processes (this one's are set by pytest's own runs).
ENV = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
# multiprocessing's fork server and resource tracker of this process (they live as long as it).
STDLIB_HELPER = re.compile(r"forkserver|resource_tracker")


def hanging(num_envs: int, seed: int, env: int, at_step: int) -> dict[str, Any]:
    """A FaultyEnv task whose environment ``env`` (of ``num_envs`` seeded with ``seed``)
    sleeps for an hour in its ``at_step``-th step."""
    return {"_target_": "rl_envs.toys.debug.FaultyEnv", "mode": "hang", "max_steps": 10,
            "fail_seed": env_seeds(num_envs, seed)[env], "fail_at_step": at_step}  # fmt: skip


def warnings_naming(caplog: pytest.LogCaptureFixture, label: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and label in r.message]


# ------------------------------------------------------------------ 6: hang watchdog
def test_the_hang_watchdog_is_on_by_default(compose_cfg: Any, resolve_cfg: Any) -> None:
    """A hung environment must not stall a run silently: both timeouts ship set (generous)."""
    sampler = resolve_cfg(compose_cfg(["sampler=multiprocess"]))["sampler"]
    collector = resolve_cfg(compose_cfg(["collector=process"]))["collector"]
    assert sampler["timeout"] is not None and sampler["timeout"] >= 30
    assert collector["timeout"] is not None and collector["timeout"] >= 60


def test_a_hung_environment_of_a_multiprocess_sampler_is_named_after_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    task = hanging(4, 0, env=3, at_step=2)  # worker 1's second environment
    with MultiprocessSampler(task=task, num_processes=2, num_envs=4, seed=0, timeout=2.0) as s:
        label = f"sampler process 1 (pid {s.process_pids[1]}, environments 2..3)"
        s.reset()
        s.step(np.zeros(4, dtype=np.int64))
        start = time.monotonic()
        with pytest.raises(SamplerProcessError) as err:
            s.step(np.zeros(4, dtype=np.int64))
        waited = time.monotonic() - start
    assert f"no reply within 2.0 s while stepping from {label}" in str(err.value)
    assert err.value.process_index == 1
    assert 2.0 <= waited < 30  # the watchdog ended it, not anything else
    (warning,) = warnings_naming(caplog, label)  # once, before the error
    assert "no reply for" in warning.message and "sampler.timeout" in warning.message


def test_a_hung_environment_of_a_process_collection_worker_is_named_after_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    spec = CollectionSpec(task=hanging(4, 2, env=3, at_step=2), sampler=SERIAL, model=MODEL,
                          seed=2)  # fmt: skip
    workers, _ = make_set(spec, "process", num_workers=1, mode="async", timeout=3.0)
    pids = list(workers.pids)
    label = f"collection worker 0 (pid {pids[0]}, environments 0-3)"
    try:
        start = time.monotonic()
        with pytest.raises(CollectionWorkerError) as err:
            workers.collect(RolloutRequest(num_steps=4))
        waited = time.monotonic() - start
    finally:
        workers.close()
    assert str(err.value).startswith(
        f"{label}: did not answer within 3 s while collecting a rollout"
    )
    assert 3.0 <= waited < 30
    (warning,) = warnings_naming(caplog, label)
    assert "no answer for" in warning.message and "collector.timeout" in warning.message
    assert wait_until_gone(set(pids), seconds=10) == []  # the hung worker was killed


# ------------------------------------- 7: process workers with multiprocess samplers
def processes_below(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def forkserver_tree(pids: set[int]) -> set[int]:
    """Fork servers and the workers they forked (which share their command line)."""
    return {p.pid for p in live_processes_of(pids) if "forkserver" in " ".join(p.cmdline())}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_the_learner_stops_workers_and_their_samplers(tmp_path: Path) -> None:
    """The learner saves a checkpoint and exits 143; its worker, the worker's fork server and
    sampler processes are all gone."""
    code, err, tree = sigterm_a_running_train(
        tmp_path / "run", ["collector=process", "sampler=multiprocess"], ENV, whole_group=False
    )
    assert code == 143, err[-3000:]
    assert "stopped by SIGTERM" in err
    assert latest_checkpoint(tmp_path / "run") is not None
    assert len(tree) >= 5, "expected a fork server, a worker, its fork server and 2 samplers"
    assert wait_until_gone(tree, seconds=10) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_9_of_a_learner_whose_worker_waits_on_a_hung_sampler_leaves_no_process(
    tmp_path: Path,
) -> None:
    """SIGKILL of the learner while its collection worker waits, with no timeout, for a
    sampler process stuck in an environment (the learner's watchdog has just warned about the
    worker): neither reads its closed pipe, yet the worker, its fork server and its sampler
    workers all go at once."""
    fail_seed = env_seeds(4, 1)[1]  # +debug=smoke: 4 environments, seed 1
    proc = subprocess.Popen(
        [sys.executable, "train.py", "+experiment=ppo_cartpole", "+debug=smoke",
         "collector=process", "collector.timeout=8", "sampler=multiprocess",
         "sampler.timeout=null", "task._target_=rl_envs.toys.debug.FaultyEnv", "~task.env_id",
         "~task.env_kwargs", "~task.wrappers", "+task.mode=hang", f"+task.fail_seed={fail_seed}",
         "+task.fail_at_step=2", "eval.num_episodes=0", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    tree: set[int] = set()
    try:
        assert proc.stdout is not None
        seen = []
        while "no answer for" not in (line := proc.stdout.readline()):
            assert line, "".join(seen)  # the learner ended before its worker hung
            seen.append(line)
        assert "collection worker 0 (pid" in line and "collecting a rollout" in line
        tree = processes_below(proc.pid)
        # The learner's fork server, the collection worker it forked, the worker's fork server
        # and the two sampler processes that one forked.
        assert len(forkserver_tree(tree)) == 5, tree
        proc.kill()
        proc.wait(timeout=30)
        assert wait_until_gone(tree, seconds=10) == []
    finally:
        proc.kill()
        proc.wait()
        for leftover in live_processes_of(tree):  # (only when the test failed)
            leftover.kill()


# ----------------------------------------------------- 9: async collection budgets
def two_stage_pipeline(second_stage_steps: int) -> TrainingPipeline:
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[
            PipelineStage(loss_names=["ppo"], max_stage_steps=128, num_steps=16),
            PipelineStage(loss_names=["ppo"], max_stage_steps=second_stage_steps, num_steps=8),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_mini_batch=2,
        update_repeats=1,
    )


def test_async_collection_follows_stage_switches_and_ends_at_the_budget(tmp_path: Path) -> None:
    """Stage 1's first rollout is collected ahead with stage 1's length, its last one is cut
    to the budget (56 = 8 + 6 steps x 4 environments), and nothing is collected after it."""
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=3)
    workers, model = make_set(spec, "process", num_workers=1, mode="async")
    seen = StepsSeen()
    trainer = OnPolicyTrainer(
        model=model,
        pipeline=two_stage_pipeline(56),
        collector=workers,
        logger=MetricsLogger([]),
        output_dir=tmp_path,
        callbacks=[seen],
        device="cpu",
    )
    try:
        trainer.train()
        requested = workers.state_dict()["collection_workers"]["requested"]
    finally:
        workers.close()
    assert seen.steps == [(0, 16), (0, 16), (1, 8), (1, 6)]
    assert trainer.pipeline.total_steps == 128 + 56
    assert requested == [4] and workers.dropped == 0


def test_an_async_run_with_multiprocess_samplers_ends_at_its_budget(
    compose_cfg: Any, tmp_path: Path
) -> None:
    """collector=process (async) with sampler=multiprocess trains, and a budget that is not a
    multiple of the rollout (200 = 3 x 64 + 8 env steps) is where it ends: in the final
    checkpoint, in metrics.jsonl, and in the rollouts the worker was asked for."""
    out = tmp_path / "run"
    overrides = [*SMOKE, "collector=process", "sampler=multiprocess", "total_env_steps=200",
                 f"output_dir={out}"]  # fmt: skip
    before = processes_below(os.getpid())
    metrics = run.train(compose_cfg(overrides, set_output_dir=False))
    assert metrics["collection/policy_lag"] == 1.0  # asynchronous indeed
    saved = load_checkpoint(latest_checkpoint(out))
    assert saved["pipeline"]["total_steps"] == 200
    assert saved["collection_workers"]["mode"] == "async"
    assert saved["collection_workers"]["requested"] == [4]  # 16, 16, 16 and 2 steps
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["env_step"] == 200
    started = live_processes_of(processes_below(os.getpid()) - before)
    assert [p for p in started if not STDLIB_HELPER.search(" ".join(p.cmdline()))] == []


def test_sigterm_to_the_process_group_mid_rollout_spares_a_multiprocess_sampler(
    tmp_path: Path,
) -> None:
    """SLURM's SIGTERM reaches every process of the run, sampler processes included: they ignore
    it, the trainer finishes the rollout it is in, saves, exits 143, and closes them. (Workers
    that died of it failed the run mid-rollout: "sampler process 1 ... exited while stepping".)
    Rollouts of 4 x 512 steps: the signal lands inside one."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    overrides = ["sampler=multiprocess", "sampler.num_envs=4", "pipeline.num_steps=512"]
    code, err, workers = sigterm_a_running_train(tmp_path / "run", overrides, env,
                                                 whole_group=True)  # fmt: skip
    assert workers, "the run started no sampler process"
    assert code == 143, err
    assert "stopped by SIGTERM" in err and "SamplerProcessError" not in err
    assert latest_checkpoint(tmp_path / "run") is not None
    assert wait_until_gone(workers) == []
