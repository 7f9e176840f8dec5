"""PyTorchRL's scheme whole: DDP learners each owning collection workers, barrier-free async.

- Barrier-free async: the learner updates on the first ``rollouts_per_update`` rollouts that
  are ready, a slow worker never holds the others up, the lag rule holds per rollout, and the
  budgets end exactly with rollouts in flight.
- Learners x workers: every DDP rank owns a ``CollectionWorkerSet`` (environments of one global
  seed stream), a sync run resumes bitwise, a dead worker names its rank, and the scheme learns.
"""

from __future__ import annotations

import functools
import time
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from collectors import worker_settings
from pipelines import ppo_pipeline
from ranks import WORLD, run_ranks
from small import MODEL, SERIAL, SMALL

from rl.collection import CollectionSpec, RolloutRequest
from rl.collection.worker_set import CollectionWorkerSet
from rl.distributed import DistContext
from rl.distributed.launch import spawn_ranks
from rl.distributed.settings import DistributedSettings
from rl.distributed.setup import checksums_across_ranks
from rl.engine.run import _train_rank
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import build_policy
from rl.pipeline import PipelineStage
from rl.tasks import task_spaces
from rl.training import Callback, OnPolicyTrainer, RolloutInfo
from rl.utils.seeding import env_seeds, set_seed


def make_set(spec: CollectionSpec, **settings: Any) -> CollectionWorkerSet:
    set_seed(spec.seed)
    model = build_policy(spec.model, *task_spaces(spec.task))
    settings.setdefault("backend", "process")
    return CollectionWorkerSet(
        spec=spec, model=model, **worker_settings(compress=False, **settings)
    )


def lag_of(rollout: Any) -> tuple[float, float]:
    stats = rollout.stats["sums"]
    return stats["collection/policy_lag"], stats["collection/policy_lag_max"]


# ------------------------------------------------------------------- barrier-free
@pytest.fixture(params=["ray", "process"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    return str(request.param)


def test_barrier_free_async_takes_the_first_ready_rollouts(backend: str) -> None:
    # Worker 1's first environment sleeps 150 ms a step: a 16-step rollout of it takes 2.4 s,
    # worker 0's a few ms (the margin is for a busy machine: the test passed beside two
    # CPU-bound processes). With one rollout per update the learner never waits for worker 1.
    slow = {"_target_": "rl_envs.toys.debug.SlowEnv", "delay": 0.15, "max_steps": 10,
            "slow_seed": env_seeds(4, 5)[2]}  # fmt: skip
    spec = CollectionSpec(task=slow, sampler=SERIAL, model=MODEL, seed=5)
    workers = make_set(
        spec, backend=backend, num_workers=2, mode="async", rollouts_per_update=1,
        max_policy_lag=1000,
    )  # fmt: skip
    try:
        assert workers.num_envs == 2
        rollouts = [workers.collect(RolloutRequest(num_steps=16)) for _ in range(8)]
        requested = list(workers._requested)
    finally:
        workers.close()
    assert all(r.storage.num_envs == 2 and r.num_steps == 16 for r in rollouts)
    # Worker 0 fed (nearly) every update while worker 1's first rollout was still running.
    assert requested[0] >= 8 and requested[1] <= 2, requested


def test_max_policy_lag_is_enforced_per_rollout() -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=1)
    workers = make_set(spec, num_workers=2, mode="async", rollouts_per_update=1, max_policy_lag=2)
    lags: list[tuple[float, float]] = []
    try:
        request = RolloutRequest(num_steps=4)
        for i in range(12):
            if i == 6:
                # The learner moved on by 3 versions (as after updates on other data): what is
                # in flight is now at least 3 behind, dropped and collected again.
                workers.version += 3
            rollout = workers.collect(request)
            lags.append(lag_of(rollout))
            if i == 6:
                assert workers.dropped >= 1
                assert lag_of(rollout)[0] == 0.0  # collected again with today's weights
    finally:
        workers.close()
    assert lags[0] == (0.0, 0.0)  # nothing in flight before: collected with version 1
    assert all(0 <= mean <= most <= 2 for mean, most in lags), lags
    assert max(most for _, most in lags) >= 1, lags  # the workers collect while it updates


class Seen(Callback):
    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int]] = []

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        self.steps.append((info.stage_index, info.num_steps, info.env_steps))


def test_async_budgets_end_exactly_and_nothing_is_asked_past_them(tmp_path: Path) -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=3)
    workers = make_set(spec, num_workers=2, mode="async", rollouts_per_update=1, max_policy_lag=8)
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[
            PipelineStage(loss_names=["ppo"], max_stage_steps=100, num_steps=16),
            PipelineStage(loss_names=["ppo"], max_stage_steps=48, num_steps=8),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_mini_batch=2,
        update_repeats=1,
    )
    seen = Seen()
    trainer = OnPolicyTrainer(
        model=workers.model,
        pipeline=pipe,
        collector=workers,
        logger=MetricsLogger([]),
        output_dir=tmp_path,
        callbacks=[seen],
        device="cpu",
    )
    try:
        trainer.train()
        in_flight, requested = len(workers._async.in_flight), sum(workers._requested)
        dropped = workers.dropped
    finally:
        workers.close()
    # Updates of one worker's 2 environments: stage 0's 100 steps as 3 x 32 + 1 x 4 (cut to
    # its budget: ceil(4 / 2) = 2 steps), stage 1's 48 as 3 x 16. Each update takes the first
    # rollout ready, so the short last one of stage 0 may overtake a full one (seen in CI).
    expected = [(0, 16, 32)] * 3 + [(0, 2, 4)] + [(1, 8, 16)] * 3
    assert sorted(seen.steps) == sorted(expected), seen.steps
    assert [stage for stage, _, _ in seen.steps] == [0] * 4 + [1] * 3, seen.steps
    assert pipe.total_steps == 148
    # Every rollout asked for was used or dropped: none past the budget, none left in flight.
    assert in_flight == 0 and requested == len(seen.steps) + dropped


def test_uneven_environments_with_fewer_rollouts_per_update_are_refused() -> None:
    from rl.utils.config import ConfigError

    spec = CollectionSpec(task=SMALL, sampler={**SERIAL, "num_envs": 5}, model=MODEL, seed=1)
    with pytest.raises(ConfigError, match=r"rollouts_per_update=1 < num_workers=2 .*num_envs=5"):
        make_set(spec, num_workers=2, mode="async", rollouts_per_update=1)
    with pytest.raises(ConfigError, match=r"collector.rollouts_per_update: must be in \[1, "):
        make_set(spec, num_workers=2, mode="async", rollouts_per_update=3)


# ------------------------------------------------------------- learners x workers
class StopAt(Callback):
    def __init__(self, rollouts: int | None) -> None:
        self.rollouts, self.seen = rollouts, 0

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        self.seen += 1
        if self.seen == self.rollouts:
            trainer.request_stop("SIGTERM")


def _rank_trainer(rank: int, out: Path, stop_at: int | None = None) -> OnPolicyTrainer:
    ctx = DistContext(rank=rank, world_size=WORLD, local_rank=rank, device=torch.device("cpu"))
    spec = CollectionSpec(
        task=SMALL, sampler=SERIAL, model=MODEL, seed=3, env_offset=rank * 4, total_envs=8
    )
    workers = make_set(spec, num_workers=2, mode="sync", dist=ctx)
    torch.manual_seed(100 + rank)  # action sampling differs by rank (as run.py seeds it)
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=384)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=16,
        num_mini_batch=2,
        update_repeats=2,
        save_interval=128,
    )
    return OnPolicyTrainer(
        model=workers.model,
        pipeline=pipe,
        collector=workers,
        logger=MetricsLogger([]),
        output_dir=out,
        seed=7,
        callbacks=[StopAt(stop_at)],
        dist=ctx,
        device="cpu",
    )


def _ranks_own_workers_and_resume_exactly(rank: int, tmp: str) -> None:
    base = Path(tmp)
    full = _rank_trainer(rank, base / "full")
    try:
        # Each rank's workers step their own blocks of the global seed stream.
        assert full.collector.spec.env_offset == rank * 4  # type: ignore[attr-defined]
        full.train()
    finally:
        full.collector.close()
    assert full.pipeline.total_steps == 384
    sums = checksums_across_ranks(full.model)
    assert sums[0] == sums[1], "parameters differ across ranks"
    part = _rank_trainer(rank, base / "part", stop_at=1)  # agreed at the next rollout
    try:
        part.train()
    finally:
        part.collector.close()
    assert part.pipeline.total_steps == 256
    dist.barrier()
    state = torch.load(part.last_checkpoint, weights_only=True)
    ranks = state["distributed"]["ranks"]
    assert [r["collection_workers"]["num_workers"] for r in ranks] == [2, 2]
    resumed = _rank_trainer(rank, base / "part")
    try:
        resumed.load_state_dict(state)
        resumed.train()
    finally:
        resumed.collector.close()
    assert resumed.pipeline.total_steps == 384
    assert checksums_across_ranks(resumed.model)[rank] == sums[rank], "resume is not exact"


@pytest.mark.slow
def test_ranks_own_their_workers_and_a_sync_run_resumes_bitwise(tmp_path: Path) -> None:
    run_ranks(_ranks_own_workers_and_resume_exactly, str(tmp_path))


@pytest.mark.slow
def test_a_killed_worker_of_rank_1_names_the_rank_and_leaves_no_process(
    compose_cfg: Any, resolve_cfg: Any
) -> None:
    plain = resolve_cfg(
        compose_cfg(
            ["+experiment=ppo_nav", "+debug=smoke", "model=mlp", "distributed=ddp", "eval=null",
             "collector=process", "collector.num_workers=2", "collector.mode=sync"]
        )
    )  # fmt: skip
    plain["total_env_steps"] = plain["pipeline"]["total_env_steps"] = 100_000
    plain["pipeline"]["stages"][0]["max_stage_steps"] = 100_000
    # Rank 1's environments are global 4..7; its worker 1 has 6 and 7: 7 kills its process.
    doomed = env_seeds(8, plain["seed"])[7]
    plain["task"] = {"_target_": "rl_envs.toys.debug.FaultyEnv", "fail_seed": doomed,
                     "fail_at_step": 40, "mode": "kill"}  # fmt: skip
    plain["logger"] = {"sinks": {}}
    payload = {"config": plain, "choices": None, "resume": None, "init_from": None}
    resource_tracker.ensure_running()  # multiprocessing's own helper of this process stays
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 collection worker 1 \(pid \d+\)") as err:
        settings = DistributedSettings.from_config(plain["distributed"])
        spawn_ranks(2, settings, "cpu", payload, _train_rank)
    assert time.monotonic() - start < 30, "the fault took too long to surface"
    assert "died with SIGKILL" in str(err.value)

    def left() -> list[psutil.Process]:
        children = psutil.Process().children(recursive=True)
        return [p for p in children if p.pid not in before and p.status() != "zombie"]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and left():
        time.sleep(0.1)
    assert not left(), [p.cmdline() for p in left()]


# ------------------------------------------------------------------ run-time hooks
def test_replace_agent_component_swaps_environments_and_policy_of_running_workers() -> None:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=2)
    workers = make_set(spec, num_workers=2, mode="async")
    try:
        request = RolloutRequest(num_steps=20)
        before = workers.collect(request)
        assert max(e.metrics["length"] for e in before.episodes) > 4
        # Environments: episodes of at most 4 steps from the next request on (in flight:
        # one rollout per worker collected with the old ones).
        workers.replace_agent_component("environments", {**SMALL, "max_steps": 4})
        workers.collect(request)
        after = workers.collect(request)
        assert after.episodes and max(e.metrics["length"] for e in after.episodes) <= 4
        # Policy: a wider GRU; the learner's new model's weights reach the workers.
        wider = {**MODEL, "rnn_hidden_size": 16}
        model = build_policy(wider, *task_spaces(SMALL))
        workers.replace_agent_component("policy", wider, model=model)
        workers.collect(request)
        rollout = workers.collect(request)
        assert rollout.storage["state", "h"].shape[-1] == 16
        with pytest.raises(Exception, match="unknown agent component 'critic'"):
            workers.replace_agent_component("critic", {})
    finally:
        workers.close()


def test_update_storage_parameter_reaches_every_worker() -> None:
    from rl.collection.worker import CollectionWorker

    spec = CollectionSpec(
        task=SMALL, sampler=SERIAL, model=MODEL, seed=2,
        normalize={"observations": False, "rewards": True, "clip": 10.0, "gamma": 0.99,
                   "epsilon": 1e-8},
    )  # fmt: skip
    worker = CollectionWorker(index=0, spec=spec, num_envs=2, env_offset=0)
    try:
        worker.update_storage_parameter("gamma", 0.5)
        assert worker.normalizer is not None and worker.normalizer.settings.gamma == 0.5
    finally:
        worker.close()
    workers = make_set(spec, num_workers=2, mode="sync")
    try:
        workers.update_storage_parameter("gamma", 0.5)  # every worker answers
        with pytest.raises(Exception, match=r"collection worker [01]: unknown storage parameter"):
            workers.update_storage_parameter("gae_lambda", 0.9)
    finally:
        workers.close()
