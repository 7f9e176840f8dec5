"""Distributed training on CPU with gloo and 2 processes: collectives, trainer, faults, CLI.

Workers are spawned with ``torch.multiprocessing`` on a free local port; assertions run inside
the workers (a failing one surfaces as the parent's ``ProcessRaisedException``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml
from pipelines import ppo_pipeline
from ranks import WORLD, run_ranks
from recorded import Recorded
from small import SMALL

from rl.checkpoints.errors import CheckpointError
from rl.checkpoints.invocation import invocation_only
from rl.checkpoints.migrations import migrate
from rl.collection import InProcessCollector
from rl.distributed import (
    DistContext,
    advantage_stats,
    average_gradients,
    distributed_weighted_sum,
    weighted_mean,
)
from rl.distributed.launch import free_port, spawn_ranks
from rl.distributed.reduce import reduce_tracker_states
from rl.distributed.settings import DistributedSettings, distributed_errors
from rl.distributed.setup import checksums_across_ranks
from rl.engine.run import _train_rank
from rl.engine.settings import verify_train_cfg
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic
from rl.pipeline import PipelineStage
from rl.sampling import SerialSampler
from rl.training import Callback, OnPolicyTrainer
from rl.utils.config import ConfigError
from rl.utils.seeding import env_seeds

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ collectives
def _check_reductions(rank: int) -> None:
    torch.manual_seed(0)
    sizes = [3, 7]  # unequal local batch sizes
    xs = [torch.randn(n, 5) for n in sizes]
    ys = [torch.randn(n, 2) for n in sizes]
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ((model(xs[rank]) - ys[rank]) ** 2).mean().backward()
    total = average_gradients(model.parameters(), sizes[rank])
    assert total == sum(sizes)
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ((model(torch.cat(xs)) - torch.cat(ys)) ** 2).mean().backward()
    for got, want in zip(reference, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    advs = [torch.randn(4, n) * 3 + 1 for n in sizes]
    mean, std, count = advantage_stats(advs[rank])
    flat = torch.cat([a.reshape(-1) for a in advs]).double()
    assert count == flat.numel()
    assert mean == pytest.approx(flat.mean().item(), rel=1e-9)
    assert std == pytest.approx(flat.std().item(), rel=1e-9)

    assert distributed_weighted_sum(float(rank + 1), sizes[rank]) == pytest.approx(3 + 14)
    assert weighted_mean(float(rank + 1), sizes[rank]) == pytest.approx(17 / 10)
    tracker = {"sums": {"a": 2.0 * (rank + 1)}, "counts": {"a": 2.0}}
    if rank == 1:
        tracker["sums"]["b"], tracker["counts"]["b"] = 5.0, 1.0  # keys may differ by rank
    merged = reduce_tracker_states(tracker)
    assert merged == {"sums": {"a": 6.0, "b": 5.0}, "counts": {"a": 4.0, "b": 1.0}}


def test_weighted_gradients_and_global_advantage_stats() -> None:
    run_ranks(_check_reductions)


# ----------------------------------------------------------------- trainer level
class Recorder(Callback):
    """Per-rollout steps of this worker, and optionally a stop request at one rollout."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.num_steps: list[int] = []
        self.env_steps: list[int] = []
        self.stop_at = stop_at

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        self.num_steps.append(info.num_steps)
        self.env_steps.append(info.env_steps)
        if self.stop_at is not None and len(self.num_steps) == self.stop_at:
            trainer.request_stop("SIGTERM")


def make_trainer(
    rank: int,
    out: Path,
    *,
    task: dict[str, Any] = SMALL,
    budget: int = 384,
    num_steps: int = 16,
    sync_frac: float | None = None,
    recorder: Recorder | None = None,
    log_every: int = 128,
    sink: Recorded | None = None,
) -> OnPolicyTrainer:
    torch.manual_seed(0)
    num_envs = 4
    sampler = SerialSampler(
        task=task, num_envs=num_envs, seed=3, env_offset=rank * num_envs, total_envs=8
    )
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        image_encoding="scale",
        trunk_layers=[32],
        rnn="gru",
        rnn_hidden_size=16,
    )
    torch.manual_seed(100 + rank)  # action sampling differs by rank (as run.py seeds it)
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=budget)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=num_steps,
        num_mini_batch=2,
        update_repeats=2,
        metric_accumulate_interval=log_every,
        save_interval=128,
    )
    ctx = DistContext(
        rank=rank,
        world_size=WORLD,
        local_rank=rank,
        sync_frac=sync_frac,
        device=torch.device("cpu"),
    )
    return OnPolicyTrainer(
        model=model,
        pipeline=pipe,
        collector=InProcessCollector(model=model, sampler=sampler, dist=ctx, device="cpu"),
        logger=MetricsLogger([] if sink is None else [sink]),
        output_dir=out,
        seed=7,
        callbacks=[recorder] if recorder is not None else [],
        dist=ctx,
        device="cpu",
    )


def _train_stop_resume(rank: int, tmp: str) -> None:
    base = Path(tmp)
    # Uninterrupted: 3 rollouts of 2 workers x 4 envs x 16 steps = 128 env steps each.
    full = make_trainer(rank, base / "full")
    seeds = [None] * WORLD
    dist.all_gather_object(seeds, full.collector.sampler._seeds)
    assert seeds[0] == env_seeds(8, 3)[:4] and seeds[1] == env_seeds(8, 3)[4:]
    assert len(set(seeds[0]) | set(seeds[1])) == 8  # unique across ranks and environments
    obs = [None] * WORLD
    dist.all_gather_object(obs, full.collector.sampler.reset()["obs", "image"].numpy())
    assert not (obs[0] == obs[1]).all()
    # One log point, at the end: the stop below falls inside its interval.
    logged = Recorded()
    full = make_trainer(rank, base / "full", log_every=384, sink=logged)
    full.train()
    full.collector.close()
    assert full.pipeline.total_steps == 384
    sums = checksums_across_ranks(full.model)
    assert sums[0] == sums[1], "parameters differ across ranks after updates"
    if rank == 0:
        names = sorted(p.name for p in (base / "full" / "checkpoints").glob("ckpt_*.pt"))
        assert names[-1].endswith("384.pt") and len(names) == 3

    # Rank 1 alone asks to stop after the first rollout; the workers agree on it at the next
    # rollout's all-reduce, so both stop after the second one, with one checkpoint.
    rec = Recorder(stop_at=1 if rank == 1 else None)
    resumed_logged = Recorded()
    part = make_trainer(rank, base / "part", recorder=rec, log_every=384, sink=resumed_logged)
    part.train()
    part.collector.close()
    assert part.stop_reason == "SIGTERM" and part.pipeline.total_steps == 256
    dist.barrier()
    ckpt = part.last_checkpoint
    state = torch.load(ckpt, weights_only=True)
    assert state["distributed"]["world_size"] == WORLD
    resumed = make_trainer(rank, base / "part", log_every=384, sink=resumed_logged)
    resumed.load_state_dict(state)
    resumed.train()
    resumed.collector.close()
    assert resumed.pipeline.total_steps == 384
    assert checksums_across_ranks(resumed.model)[rank] == sums[rank], "resume is not exact"
    # Each rank's unlogged sums and episodes came back as its own: the same means at 384.
    assert [step for step, _ in logged.logs] == [384]
    assert resumed_logged.logs == logged.logs, rank
    assert resumed_logged.episodes == logged.episodes, rank


class EvalOnRankZero(Callback):
    """What TrainingEvaluation does on rank 0 only: eval/success = 1 after the 2nd rollout."""

    def __init__(self) -> None:
        self.rollouts = 0

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        self.rollouts += 1
        if self.rollouts == 2:
            trainer.metrics.publish(info.total_steps, {"eval/success": 1.0})


class StageEnds(Callback):
    def __init__(self) -> None:
        self.ends: list[tuple[int, int]] = []

    def on_stage_end(self, trainer: Any, stage_index: int) -> None:
        self.ends.append((stage_index, trainer.pipeline.total_steps))


def _eval_criterion(rank: int, tmp: str) -> None:
    from rl.pipeline import MetricThresholdCriterion

    torch.manual_seed(0)
    sampler = SerialSampler(task=SMALL, num_envs=4, seed=3, env_offset=rank * 4, total_envs=8)
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        rnn=None,
    )
    criterion = MetricThresholdCriterion(metric="eval/success", threshold=0.9)
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[
            PipelineStage(
                loss_names=["ppo"], max_stage_steps=2048, early_stopping_criterion=criterion
            ),
            PipelineStage(loss_names=["ppo"], max_stage_steps=256),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=16,
        num_mini_batch=2,
        update_repeats=1,
    )
    ctx = DistContext(rank=rank, world_size=WORLD, local_rank=rank, device=torch.device("cpu"))
    ends = StageEnds()
    callbacks = [EvalOnRankZero(), ends] if rank == 0 else [ends]  # as the engine builds them
    trainer = OnPolicyTrainer(
        model=model,
        pipeline=pipe,
        collector=InProcessCollector(model=model, sampler=sampler, dist=ctx, device="cpu"),
        logger=MetricsLogger([]),
        output_dir=Path(tmp) / str(rank),
        callbacks=callbacks,
        dist=ctx,
        device="cpu",
    )
    trainer.train()
    trainer.collector.close()
    # Rollouts of 2 workers x 4 envs x 16 steps = 128 env steps: rank 0's eval/success after
    # the 2nd rollout ends stage 0 on both ranks at 256; stage 1 then runs its 256 steps.
    assert ends.ends == [(0, 256), (1, 512)], ends.ends
    assert checksums_across_ranks(trainer.model)[0] == checksums_across_ranks(trainer.model)[1]


def test_an_eval_criterion_on_rank_zero_ends_the_stage_on_every_rank(tmp_path: Path) -> None:
    run_ranks(_eval_criterion, str(tmp_path))


def test_trainer_identical_parameters_unique_seeds_stop_and_exact_resume(tmp_path: Path) -> None:
    run_ranks(_train_stop_resume, str(tmp_path))


def _preempt(rank: int, tmp: str) -> None:
    delay = 0.02 if rank == 1 else 0.0  # rank 1 is the straggler (4 envs: 0.08 s a step)
    task = {"_target_": "rl_envs.toys.debug.SlowEnv", "delay": delay, "max_steps": 10}
    rec = Recorder()
    trainer = make_trainer(
        rank, Path(tmp), task=task, budget=300, num_steps=20, sync_frac=0.5, recorder=rec
    )
    trainer.train()
    trainer.collector.close()
    steps = [None] * WORLD
    dist.all_gather_object(steps, rec.num_steps)
    # The first two rollouts are full-length (4 envs x (20 + 5) steps = 100 env steps); the
    # rest of the 300-step budget is planned as shorter rollouts (the stage's tail).
    assert steps[0][:2] == [20, 20], steps  # the fast worker completes
    # min_rollout_frac 0.25 of 20 = 5 steps: the straggler is cut, never before its minimum.
    # (How soon after it depends on timing: the fast worker needs ~20 ms, the straggler 1.6 s
    # for a full rollout, so only a machine ~80x slower than usual would let it complete.)
    assert all(5 <= s < 20 for s in steps[1][:2]), steps
    assert all(b <= a for a, b in zip(steps[0], steps[1], strict=True)), steps
    assert rec.env_steps == [4 * (a + b) for a, b in zip(steps[0], steps[1], strict=True)]
    assert trainer.pipeline.total_steps == sum(rec.env_steps)
    sums = checksums_across_ranks(trainer.model)
    assert sums[0] == sums[1]


def test_preemption_cuts_the_straggler_at_the_configured_fractions(tmp_path: Path) -> None:
    run_ranks(_preempt, str(tmp_path))


# ---------------------------------------------------------------- config, faults
def test_distributed_config_is_verified(compose_cfg: Any, resolve_cfg: Any) -> None:
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "distributed.world_size=2"]))
    with pytest.raises(ConfigError, match="needs distributed=ddp"):
        verify_train_cfg(plain)
    plain = resolve_cfg(
        compose_cfg(["+experiment=ppo_nav", "distributed=ddp_preempt", "distributed.sync_frac=2"])
    )
    with pytest.raises(ConfigError, match="sync_frac"):
        verify_train_cfg(plain)
    # The former name of world_size is named with the new one, before anything starts.
    old_name = ["+experiment=ppo_nav", "distributed=ddp", "distributed.workers=3"]
    plain = resolve_cfg(compose_cfg(old_name))
    with pytest.raises(ConfigError, match=r"distributed.workers: renamed distributed.world_size"
                       r" .*write distributed.world_size=3"):  # fmt: skip
        verify_train_cfg(plain)


def test_a_saved_config_of_the_former_key_is_read_under_the_new_one() -> None:
    """A checkpoint saved when world_size was ``workers`` resumes with its value renamed."""
    section = yaml.safe_load((ROOT / "conf" / "distributed" / "none.yaml").read_text())
    old = {k: v for k, v in section.items() if k != "world_size"}
    saved, _ = migrate({"distributed": {**old, "enabled": True, "workers": 2}}, None)
    assert saved["distributed"]["world_size"] == 2 and saved["distributed"]["workers"] is None
    assert distributed_errors(saved["distributed"]) == []
    assert migrate(saved, None) == (saved, None)  # today's layout passes unchanged


@pytest.mark.parametrize(
    ("crafted", "message"),
    [
        ({"_target_": "os.system", "command": "x"}, "expected int | None"),
        ("2", "expected int | None"),
        (True, "expected int | None"),
        (10**9, "must be <= 1024"),
        (-1, "must be >= 1"),
    ],
    ids=["target", "str", "bool", "huge", "negative"],
)
def test_a_crafted_former_key_is_judged_under_the_new_name(crafted: Any, message: str) -> None:
    """A re-signed checkpoint's ``distributed.workers`` is renamed, then checked as typed: it
    builds nothing, and the count of ranks is the command's, never the file's."""
    section = yaml.safe_load((ROOT / "conf" / "distributed" / "none.yaml").read_text())
    old = {k: v for k, v in section.items() if k != "world_size"}
    saved, _ = migrate({"distributed": {**old, "workers": crafted}}, None)
    errors = distributed_errors(saved["distributed"])
    assert len(errors) == 1 and errors[0].startswith("distributed.world_size: ")
    assert message in errors[0]
    assert invocation_only("distributed.world_size") == "a resource size"


@pytest.mark.parametrize(
    "crafted", [{"_target_": "os.system", "command": "x"}, "2", 3], ids=["target", "str", "int"]
)
def test_a_crafted_former_key_beside_the_new_one_is_refused_not_renamed(crafted: Any) -> None:
    """Both names in one re-signed file: the new one is not overwritten by the former, and
    the former is still refused (typed, or named as renamed), so it never reaches a launcher."""
    section = yaml.safe_load((ROOT / "conf" / "distributed" / "none.yaml").read_text())
    saved, _ = migrate({"distributed": {**section, "world_size": 2, "workers": crafted}}, None)
    assert saved["distributed"]["world_size"] == 2
    errors = distributed_errors(saved["distributed"])
    assert len(errors) == 1 and errors[0].startswith("distributed.workers: "), errors


def test_a_killed_rank_ends_the_job_with_an_error(
    compose_cfg: Any, resolve_cfg: Any, tmp_path: Path
) -> None:
    plain = resolve_cfg(
        compose_cfg(
            ["+experiment=ppo_nav", "+debug=smoke", "model=mlp", "distributed=ddp", "eval=null"]
        )
    )
    plain["total_env_steps"] = plain["pipeline"]["total_env_steps"] = 100_000
    plain["pipeline"]["stages"][0]["max_stage_steps"] = 100_000
    # Rank 1's first environment (global env 4 of 8) SIGKILLs its process at its 40th step.
    doomed = env_seeds(8, plain["seed"])[4]
    plain["task"] = {
        "_target_": "rl_envs.toys.debug.FaultyEnv",
        "fail_seed": doomed,
        "fail_at_step": 40,
        "mode": "kill",
    }
    plain["logger"] = {"sinks": {}}
    payload = {"config": plain, "choices": None, "resume": None, "init_from": None}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 .*SIGKILL"):
        settings = DistributedSettings.from_config(plain["distributed"])
        spawn_ranks(2, settings, "cpu", payload, _train_rank)
    assert time.monotonic() - start < 60


def _rank_1_fails_then_exits_slowly(plan: dict[str, Any], ctx: Any) -> dict[str, Any]:
    if ctx.rank == 1:
        # The launcher's teardown closes its connections at once; its exit then takes a while
        # (as a rank closing its collection workers does), so rank 0's echo exits first.
        atexit.register(time.sleep, 5.0)
        raise ValueError("the cause, on rank 1")
    dist.all_reduce(torch.zeros(1))  # fails once rank 1 has left: "Connection closed by peer"
    return {}


def test_a_failure_is_named_by_its_rank_not_by_the_peer_it_disconnected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = yaml.safe_load((ROOT / "conf" / "distributed" / "none.yaml").read_text())
    settings = DistributedSettings.from_config({**section, "enabled": True, "world_size": 2})
    plan = {"config": {"output_dir": str(tmp_path / "run")}}
    errors = tmp_path / "tmp"  # where torch's spawn puts the ranks' error files
    errors.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(errors))
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 \(.*the cause, on rank 1") as err:
        spawn_ranks(2, settings, "cpu", plan, _rank_1_fails_then_exits_slowly)
    assert "Connection closed" not in str(err.value)
    assert list(errors.iterdir()) == []  # the tracebacks were read, then removed


# --------------------------------------------------------------------------- CLI
def _cli(tmp_path: Path, launcher: list[str], *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*launcher, "train.py", "+experiment=ppo_nav", "+debug=smoke", "distributed=ddp",
         f"hydra.run.dir={run_dir}", "eval.num_episodes=2", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["env_step"] for r in records if "charts/SPS" in r]
    assert train_steps == [128, 256]  # logged once (rank 0), global env steps (2 x 4 x 16)
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts == ["ckpt_stage00_step000000000128.pt", "ckpt_stage00_step000000000256.pt"]
    return run_dir


def test_cli_spawned_workers(tmp_path: Path) -> None:
    _cli(tmp_path, [sys.executable], "distributed.world_size=2")


def test_cli_torchrun(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    _cli(tmp_path, [*torchrun, "--master_port", str(free_port())])


def test_cli_spawned_workers_with_several_agents(tmp_path: Path) -> None:
    """DDP over a multi-agent task: each rank's rows are its environments' agents."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", "+experiment=mappo_nav_multi", "+debug=smoke",
         "distributed=ddp", "distributed.world_size=2", f"hydra.run.dir={run_dir}",
         "eval.num_episodes=4", "model.value_norm=true"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # global agent-steps: 2 ranks x 4 environments x 2 agents x 16 steps a rollout
    assert [r["env_step"] for r in records if "charts/SPS" in r] == [256]
    assert "eval/success/agent_1" in records[-1] and "eval/success" in records[-1]


def test_each_rank_resumes_its_own_unlogged_metrics_and_rank_zero_alone_another_layouts() -> None:
    """A checkpoint of this layout: each rank's own entries; of another: rank 0's metrics once."""
    from rl.training.state import rank_view

    def ctx(rank: int) -> DistContext:
        return DistContext(
            rank=rank, world_size=WORLD, local_rank=rank, device=torch.device("cpu")
        )

    ranks = [{"trackers": {"r": r}, "finished_episodes": [{"r": float(r)}]} for r in range(WORLD)]
    saved = {"trackers": {"r": 0}, "finished_episodes": [{"r": 0.0}], "sampler": {"s": 0}}
    same = {**saved, "distributed": {"world_size": WORLD, "ranks": ranks}}
    for r in range(WORLD):
        view = rank_view(same, ctx(r))
        assert view["trackers"] == {"r": r} and view["finished_episodes"] == [{"r": float(r)}]
    other = {**saved, "distributed": {"world_size": WORLD + 1, "ranks": [*ranks, ranks[0]]}}
    for layout in (saved, other):  # one process's checkpoint, or another number of ranks
        zero, one = rank_view(layout, ctx(0)), rank_view(layout, ctx(1))
        assert zero["trackers"] == {"r": 0} and zero["finished_episodes"] == [{"r": 0.0}]
        assert one["trackers"] is None and one["finished_episodes"] is None
        assert zero["sampler"] is None and one["sampler"] is None  # fresh episodes everywhere
    # A crafted, re-signed checkpoint: another kind where a rank's entries are is refused.
    crafted = {**saved, "distributed": {"world_size": WORLD, "ranks": [ranks[0], "x"]}}
    assert rank_view(crafted, ctx(0))["trackers"] == {"r": 0}
    with pytest.raises(CheckpointError, match=r"distributed\.ranks\[1\]: expected a mapping"):
        rank_view(crafted, ctx(1))
    assert rank_view({**saved, "distributed": "x"}, ctx(1))["trackers"] is None  # none of them
