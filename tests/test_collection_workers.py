"""Collection workers (``collector=ray`` and ``collector=process``): bitwise sync, async lag
rule, run-time parameters, stragglers, evaluation over workers, faults, joining a running Ray
head.

Tests taking the ``backend`` fixture run with both backends. The Ray ones share one small
private Ray instance (conftest's ``ray_instance`` session fixture); the collectors they build
find it and leave it running. The CLI tests start their own.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from collectors import worker_settings
from pipelines import ppo_pipeline
from small import MODEL, SERIAL, SMALL
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_resume import StopAt

from rl.checkpoints import latest_checkpoint, load_checkpoint
from rl.collection import CollectionSpec, RolloutRequest
from rl.collection.worker_set import CollectionWorkerError, CollectionWorkerSet
from rl.engine import run
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic, build_policy
from rl.pipeline import PipelineStage
from rl.tasks import task_spaces
from rl.training import Callback, OnPolicyTrainer, RolloutInfo
from rl.utils.seeding import env_seeds, set_seed

ROOT = Path(__file__).resolve().parents[1]
SMOKE = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "task=nav_small",
    "model.cnn_channels=[8]",
    "model.trunk_layers=[16]",
    "model.rnn_hidden_size=8",
    "eval.num_episodes=0",
]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(params=["ray", "process"])
def backend(request: pytest.FixtureRequest) -> str:
    """Where the workers live: Ray actors (the session's Ray instance) or child processes."""
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    return str(request.param)


def make_set(
    spec: CollectionSpec, backend: str = "ray", **settings: Any
) -> tuple[CollectionWorkerSet, ActorCritic]:
    set_seed(spec.seed)
    model = build_policy(spec.model, *task_spaces(spec.task))
    workers = CollectionWorkerSet(
        spec=spec, model=model, **worker_settings(backend=backend, **settings)
    )
    return workers, model


# ----------------------------------------------------------------- sync and async
# MAPPO on MPE's simple_spread (3 agents a environment: 12 rows), short episodes, normalised
# values (their statistics travel to the workers with the weights).
SMOKE_AGENTS = [
    "+experiment=mappo_mpe",
    "+debug=smoke",
    "+task.env.max_cycles=10",
    "eval.num_episodes=0",
    "model.value_norm=true",
]
# Two agents of different kinds, one policy each (speaker and listener).
SMOKE_GROUPS = [
    "+experiment=mappo_speaker_listener",
    "+debug=smoke",
    "task.env.max_cycles=10",
    "eval.num_episodes=0",
]
SMOKES = {"one_agent": SMOKE, "three_agents": SMOKE_AGENTS, "two_groups": SMOKE_GROUPS}


@pytest.fixture(scope="module")
def local_weights() -> dict[str, dict[str, torch.Tensor]]:
    """Each task's final weights with local collection: trained by the first test that needs
    them, then compared with by both backends."""
    return {}


@pytest.mark.parametrize("task", list(SMOKES))
def test_one_sync_worker_trains_bitwise_like_local_collection(
    backend: str,
    task: str,
    compose_cfg: Any,
    tmp_path: Path,
    local_weights: dict[str, dict[str, torch.Tensor]],
) -> None:
    # Two updates (PointNav's rollouts are 64 steps, the agents' 132 and 128): the worker
    # collects the second rollout with the weights and statistics the first update sent it.
    smoke = [*SMOKES[task], "total_env_steps=128"] if task == "one_agent" else SMOKES[task]
    if task not in local_weights:
        run.train(compose_cfg([*smoke, f"output_dir={tmp_path / 'local'}"], set_output_dir=False))
        local_weights[task] = final_weights(tmp_path / "local")
    workers = [f"collector={backend}", "collector.num_workers=1", "collector.mode=sync"]
    run.train(
        compose_cfg([*smoke, *workers, f"output_dir={tmp_path / backend}"], set_output_dir=False)
    )
    assert same_weights(local_weights[task], final_weights(tmp_path / backend))


def test_async_workers_collect_for_groups_of_agents(compose_cfg: Any, tmp_path: Path) -> None:
    """Two asynchronous process workers, agents of two kinds: every agent's episodes counted,
    and TensorBoard gets each agent's metrics as any metric."""
    async_workers = ["collector=process", "collector.num_workers=2", "collector.mode=async"]
    cfg = compose_cfg([*SMOKE_GROUPS, *async_workers, "eval.num_episodes=4", "logger=tensorboard"])
    run.train(cfg)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert {"eval/return/speaker_0", "eval/return/listener_0"} <= set(events.Tags()["scalars"])
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    final = [r for r in rows if "eval/return/listener_0" in r][-1]
    assert final["eval/return/speaker_0"] == final["eval/return/listener_0"]  # a team reward
    lags = [r["collection/policy_lag"] for r in rows if "collection/policy_lag" in r]
    assert lags and max(lags) >= 0.5  # rollouts collected while the learner updated
    assert latest_checkpoint(tmp_path / "run") is not None


def test_two_sync_workers_are_reproducible(
    ray_instance: Any, compose_cfg: Any, tmp_path: Path
) -> None:
    for name in ("a", "b"):  # two updates each
        overrides = [
            *SMOKE,
            "collector=ray",
            "total_env_steps=128",
            f"output_dir={tmp_path / name}",
        ]
        run.train(compose_cfg(overrides, set_output_dir=False))
    assert same_weights(final_weights(tmp_path / "a"), final_weights(tmp_path / "b"))


def test_versions_and_the_policy_lag_rule(backend: str) -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=1)
    workers, _ = make_set(
        spec, backend, num_workers=2, mode="async", max_policy_lag=1, compress=False
    )
    try:
        request = RolloutRequest(num_steps=4)
        first = workers.collect(request)  # nothing in flight yet: collected with version 1
        assert first.stats["sums"]["collection/policy_lag"] == 0.0
        second = workers.collect(request)  # the rollouts started before the learner's update
        assert second.stats["sums"]["collection/policy_lag"] == 1.0
        assert workers.dropped == 0
        workers.max_policy_lag = 0  # now one version behind is too old: dropped, collected again
        third = workers.collect(request)
        assert workers.dropped == 2 and third.stats["sums"]["collection/policy_lag"] == 0.0
        assert third.stats["sums"]["collection/dropped"] == 2.0
        assert third.storage.step == 4 and third.storage.num_envs == 4
    finally:
        workers.close()


class StepsSeen(Callback):
    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        self.steps.append((info.stage_index, info.num_steps))


def test_a_stage_switch_changes_what_the_workers_collect(backend: str, tmp_path: Path) -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=3)
    workers, model = make_set(spec, backend, num_workers=2, mode="sync")
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[
            PipelineStage(loss_names=["ppo"], max_stage_steps=128, num_steps=16),
            PipelineStage(loss_names=["ppo"], max_stage_steps=64, num_steps=8),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_mini_batch=2,
        update_repeats=1,
    )
    seen = StepsSeen()
    trainer = OnPolicyTrainer(
        model=model,
        pipeline=pipe,
        collector=workers,
        logger=MetricsLogger([]),
        output_dir=tmp_path,
        callbacks=[seen],
        device="cpu",
    )
    try:
        trainer.train()
    finally:
        workers.close()
    assert seen.steps == [(0, 16), (0, 16), (1, 8), (1, 8)]


def train_with_workers(out: Path, callbacks: list[Callback], resume: bool = False) -> Any:
    """Two rollouts of 64 steps with two sync Ray workers (and what ``callbacks`` stop)."""
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=4)
    workers, model = make_set(spec, num_workers=2, mode="sync")
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=128)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=16,
        num_mini_batch=2,
        update_repeats=2,
    )
    trainer = OnPolicyTrainer(
        model=model,
        pipeline=pipe,
        collector=workers,
        logger=MetricsLogger([]),
        output_dir=out,
        callbacks=callbacks,
        device="cpu",
    )
    try:
        if resume:
            trainer.load_state_dict(load_checkpoint(latest_checkpoint(out)))
        trainer.train()
    finally:
        workers.close()
    return trainer


def test_sync_workers_resume_exactly(ray_instance: Any, tmp_path: Path) -> None:
    reference = train_with_workers(tmp_path / "a", [])
    # Stopped after the first rollout, episodes in flight in the workers (30 steps at most).
    stopped = train_with_workers(tmp_path / "b", [StopAt(64)])
    assert stopped.stop_reason == "test" and stopped.pipeline.total_steps == 64
    saved = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert saved["collection_workers"]["num_workers"] == 2
    resumed = train_with_workers(tmp_path / "b", [], resume=True)
    assert resumed.pipeline.total_steps == 128
    assert same_weights(reference.model.state_dict(), resumed.model.state_dict())


def test_fraction_samples_cuts_a_slow_worker(backend: str) -> None:
    # Environment 3 (worker 1's second) sleeps 50 ms a step: worker 1 is the straggler.
    slow = {"_target_": "rl_envs.toys.debug.SlowEnv", "delay": 0.05, "max_steps": 10,
            "slow_seed": env_seeds(4, 5)[3]}  # fmt: skip
    spec = CollectionSpec(task=slow, sampler=SERIAL, model=MODEL, seed=5)
    workers, _ = make_set(
        spec, backend, num_workers=2, mode="sync", fraction_samples=0.5, min_rollout_frac=0.25
    )
    try:
        rollout = workers.collect(RolloutRequest(num_steps=40))
        # The fast worker finished its 40 steps; the slow one (2 s for all 40) was stopped
        # after >= 10 of them, and the rollout keeps the steps both have.
        assert 10 <= rollout.num_steps < 40
        fractions = rollout.stats
        assert fractions["counts"]["collection/rollout_frac"] == 2
        assert fractions["sums"]["collection/rollout_frac"] < 2.0
    finally:
        workers.close()


def test_evaluation_over_two_workers_runs_each_episode_once(backend: str) -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=1)
    workers, _ = make_set(spec, backend, num_workers=2)
    try:
        seeds = list(range(100, 113))  # 13 episodes: uneven shares
        result = workers.evaluate(
            episode_seeds=seeds, num_envs=4, deterministic=False, action_seed=0
        )
    finally:
        workers.close()
    assert [e["episode_seed"] for e in result.episodes] == seeds
    assert {"success", "spl", "return"} <= set(result.metrics)


# -------------------------------------------------------------------------- faults
def test_a_killed_worker_is_a_clear_error_and_nothing_is_left(backend: str) -> None:
    doomed = env_seeds(4, 2)[3]  # worker 1's second environment
    task = {"_target_": "rl_envs.toys.debug.FaultyEnv", "fail_seed": doomed, "fail_at_step": 6,
            "mode": "kill", "max_steps": 10}  # fmt: skip
    spec = CollectionSpec(task=task, sampler=SERIAL, model=MODEL, seed=2)
    workers, _ = make_set(spec, backend, num_workers=2)
    pids = list(workers.pids)
    start = time.monotonic()
    try:
        with pytest.raises(CollectionWorkerError, match=r"collection worker 1 \(pid \d+\) failed"):
            for _ in range(5):
                workers.collect(RolloutRequest(num_steps=4))
        assert time.monotonic() - start < 10
    finally:
        workers.close()
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
              for p in pids) and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.1)
    assert not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip


def test_a_raising_worker_names_itself_and_the_traceback(backend: str) -> None:
    doomed = env_seeds(4, 2)[0]
    task = {"_target_": "rl_envs.toys.debug.FaultyEnv", "fail_seed": doomed, "fail_at_step": 3,
            "mode": "raise", "max_steps": 10}  # fmt: skip
    spec = CollectionSpec(task=task, sampler=SERIAL, model=MODEL, seed=2)
    workers, _ = make_set(spec, backend, num_workers=2)
    try:
        with pytest.raises(CollectionWorkerError) as err:
            for _ in range(5):
                workers.collect(RolloutRequest(num_steps=4))
    finally:
        workers.close()
    text = str(err.value)
    assert text.startswith("collection worker 0 (pid ")
    assert "ValueError: FaultyEnv failed on purpose at step 3" in text
    assert 'debug.py", line' in text and "in _fail" in text  # the original traceback


# ---------------------------------------------------------------------------- CLI
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live_processes_of(pids: set[int]) -> list[psutil.Process]:
    """Live processes among ``pids`` and their descendants."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def sigterm_a_running_train(
    run_dir: Path, overrides: list[str], env: dict[str, str], *, whole_group: bool
) -> tuple[int, str, set[int]]:
    """Start ``train.py``, SIGTERM it once it logs (the whole process group if ``whole_group``).

    Returns:
        ``(exit code, stderr, pids of the processes it had started)``.
    """
    proc = subprocess.Popen(
        [sys.executable, "train.py", *SMOKE, *overrides, "total_env_steps=100000",
         "pipeline.stages.0.max_stage_steps=100000", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=whole_group,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(run_dir.glob("metrics.jsonl")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)
    children = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    if whole_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, children


def wait_until_gone(pids: set[int], seconds: float = 15) -> list[psutil.Process]:
    """The processes among ``pids`` (and descendants) still alive after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while live_processes_of(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_processes_of(pids)


@pytest.mark.slow
def test_cli_private_ray_instance_ends_with_the_run_even_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "RAY_ADDRESS": ""}
    code, err, tree = sigterm_a_running_train(
        tmp_path / "run", ["collector=ray", "collector.mode=async"], env, whole_group=False
    )
    assert tree, "the run started no Ray processes"
    assert code == 143, err
    assert "stopped by SIGTERM" in err
    assert wait_until_gone(tree) == []


def test_cli_sigterm_to_the_process_group_stops_a_process_worker_run_cleanly(
    tmp_path: Path,
) -> None:
    """SIGTERM to every process of the run (as SLURM or Ctrl-C send it): the learner saves a
    checkpoint and exits 143; its worker process ignores the signal and is ended by it."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    code, err, workers = sigterm_a_running_train(
        tmp_path / "run", ["collector=process"], env, whole_group=True
    )
    assert workers, "the run started no worker process"
    assert code == 143, err
    assert "stopped by SIGTERM" in err
    assert latest_checkpoint(tmp_path / "run") is not None
    assert wait_until_gone(workers) == []


@pytest.mark.slow
def test_cli_joins_a_running_ray_head(tmp_path: Path) -> None:
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    # A cluster with token authentication: the head and the joining run share the token.
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, "WANDB_MODE": "disabled", "RAY_ADDRESS": "", **token}
    temp = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # Ray's socket paths must stay short
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", f"--temp-dir={temp}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # the head is up once its GCS port accepts connections
        while time.monotonic() < deadline:
            assert head.poll() is None, "ray start --head exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        done = subprocess.run(
            [sys.executable, "train.py", *SMOKE, "collector=ray", "total_env_steps=128",
             f"collector.address=127.0.0.1:{port}", f"hydra.run.dir={tmp_path / 'run'}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert (
            load_checkpoint(latest_checkpoint(tmp_path / "run"))["pipeline"]["total_steps"] == 128
        )
        assert head.poll() is None  # the cluster we joined is still there after the run
    finally:
        tree = {head.pid, *(p.pid for p in psutil.Process(head.pid).children(recursive=True))}
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        head.wait(timeout=60)
        deadline = time.monotonic() + 20
        while live_processes_of(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        for leftover in live_processes_of(tree):
            leftover.kill()
        shutil.rmtree(temp, ignore_errors=True)
    assert live_processes_of(tree) == []


def test_weights_sent_to_a_process_worker_are_a_snapshot_the_next_update_leaves_alone() -> None:
    # A process worker's pipe sends a CPU tensor as a handle to its shared storage: weights sent
    # without a copy would change under the worker when the learner's next update runs before
    # the worker has loaded them (the weights torn, and tagged with the wrong version).
    import multiprocessing as mp

    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=1)
    workers, model = make_set(spec, "process", num_workers=1, mode="async", compress=False)
    try:
        workers.collect(RolloutRequest(num_steps=4))
        sent_before = {k: v.clone() for k, v in model.state_dict().items()}
        mine, theirs = mp.Pipe()
        mine.send(workers._shared[1])  # what the worker's pipe carried, as it carries it
        with torch.no_grad():
            for p in model.parameters():  # the learner's next update, in place
                p.add_(1.0)
        received = theirs.recv()
        assert same_weights(received, sent_before)
    finally:
        workers.close()
