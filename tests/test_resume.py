"""Checkpoints that resume exactly: trainer state round trips, preemption, resume from the CLI.

In-process tests drive :class:`OnPolicyTrainer` directly (fast); the CLI tests run the real
``train.py`` in subprocesses to check signals, ``kill -9`` during checkpoint writes and
``resume=`` / ``init_from=`` end to end.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SMOKE_RUN
from pipelines import ppo_pipeline
from recorded import Recorded
from small import SMALL, obs_of

from rl.checkpoints.files import (
    CheckpointError,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl.checkpoints.resume import plan_start, resolve_resume_path
from rl.collection import InProcessCollector
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.loggers import MetricsLogger, MetricsSink
from rl.losses import ImitationLoss, PPOLoss
from rl.models import ActorCritic, build_policy, policy_input
from rl.pipeline import LinearDecay, PipelineStage, TrainingPipeline
from rl.sampling import SerialSampler
from rl.sampling.agents import agent_rows
from rl.tasks import build_env, task_layout, task_spaces
from rl.training import (
    EXIT_REQUEUE,
    EXIT_SIGTERM,
    Callback,
    OnPolicyTrainer,
    RolloutInfo,
    RunRecord,
)
from rl.utils.config import ConfigError, to_plain
from rl.utils.seeding import env_seeds


class StopAt(Callback):
    """Callback: request a stop once the run reaches ``steps`` env steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        if info.total_steps >= self.steps:
            trainer.request_stop("test")


def make_pipeline() -> TrainingPipeline:
    """Two stages: imitation with teacher forcing, then PPO; LR decays with env steps."""
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss(), "imitation": ImitationLoss()},
        stages=[
            PipelineStage(
                loss_names=["imitation"],
                max_stage_steps=96,
                teacher_forcing=LinearDecay(steps=96, startp=0.8, endp=0.0),
            ),
            PipelineStage(loss_names=["ppo"], max_stage_steps=160),
        ],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        lr_scheduler=functools.partial(
            torch.optim.lr_scheduler.LambdaLR, lr_lambda=LinearDecay(steps=256)
        ),
        num_steps=8,
        num_mini_batch=2,
        update_repeats=2,
        metric_accumulate_interval=48,
        save_interval=32,
    )


def make_trainer(
    tmp_path: Path,
    sampler: SerialSampler,
    callbacks=(),
    groups: dict | None = None,
    sink: MetricsSink | None = None,
) -> OnPolicyTrainer:
    """The resume tests' trainer; ``groups``: a task with groups of agents, one policy each."""
    torch.manual_seed(0)
    if groups is not None:
        layout = task_layout(groups)  # one GRU policy per group, learning normalised values
        model = build_policy(
            GROUPED, layout.observation_space, layout.action_space, groups=layout.groups
        )
    else:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[8],
            trunk_layers=[32],
            rnn="gru",
            rnn_hidden_size=16,
        )
    return OnPolicyTrainer(
        model=model,
        pipeline=make_pipeline(),
        collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
        logger=MetricsLogger([] if sink is None else [sink]),
        output_dir=tmp_path,
        run=RunRecord(config={"note": "test"}),
        seed=0,
        callbacks=list(callbacks),
        device="cpu",
    )


# Two agents in each of two environments (four rows, as four PointNav environments): agent 0
# leaves its episodes after 2 steps, agent 1 after 5, cut at 7; the cue is their expert.
AGENTS = {
    "_target_": "rl.tasks.pettingzoo.ParallelEnvAdapter",
    "env": {"_target_": "rl_envs.toys.agents.CueAgents", "_partial_": True,
            "lifetimes": [2, 5], "max_cycles": 7},
}  # fmt: skip
# Agents of two kinds (cues of 2 and 3 values), one policy each.
GROUPS = {**AGENTS, "env": {**AGENTS["env"], "choices": [2, 3]}, "groups": "prefix"}
GROUPED = {
    "_target_": "rl.models.GroupedPolicy", "_partial_": True,
    "policy": {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [],
               "trunk_layers": [16], "rnn": "gru", "rnn_hidden_size": 8, "value_norm": True},
}  # fmt: skip
SAMPLERS = {
    "one_agent": lambda: SerialSampler(task=SMALL, num_envs=4, seed=3),
    "two_agents": lambda: agent_rows(SerialSampler(task=AGENTS, num_envs=2, seed=3)),
    "two_groups": lambda: agent_rows(SerialSampler(task=GROUPS, num_envs=2, seed=3)),
}


@pytest.mark.parametrize("agents", list(SAMPLERS))
def test_interrupted_and_resumed_run_is_bitwise_equal_to_uninterrupted(
    tmp_path: Path, agents: str
) -> None:
    if agents != "one_agent":
        pytest.importorskip("pettingzoo")
    groups = GROUPS if agents == "two_groups" else None
    logged, resumed_logged = Recorded(), Recorded()
    with SAMPLERS[agents]() as sampler:
        reference = make_trainer(tmp_path / "a", sampler, groups=groups, sink=logged)
        reference.train()
    # Stop at a log point (step 64, episodes in flight), then past the stage switch between two
    # (128; logs at 96 and 160: the episodes finished since 96 are in the checkpoint); resume.
    for stop in (64, 128, None):
        with SAMPLERS[agents]() as sampler:
            callbacks = [StopAt(stop)] if stop else []
            trainer = make_trainer(
                tmp_path / "b", sampler, callbacks, groups=groups, sink=resumed_logged
            )
            found = list_checkpoints(tmp_path / "b")
            if found:
                trainer.load_state_dict(load_checkpoint(found[-1]))
            trainer.train()
            assert trainer.stop_reason == ("test" if stop else None)
            assert trainer.pipeline.total_steps == (stop or 256)
    assert trainer.pipeline.finished and reference.pipeline.finished
    # The interrupted run logged what the uninterrupted one did: every metric, every episode.
    assert [step for step, _ in resumed_logged.logs] == [step for step, _ in logged.logs]
    assert resumed_logged.logs == logged.logs
    assert resumed_logged.episodes == logged.episodes
    assert any(episodes for _, episodes in logged.episodes)
    for (name, a), b in zip(
        reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    for a, b in zip(
        reference.optimizer.state_dict()["state"].values(),
        trainer.optimizer.state_dict()["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert reference.last_metrics.keys() == trainer.last_metrics.keys()
    for key in ("losses/ppo/policy_loss", "charts/episodic_return", "charts/learning_rate"):
        assert reference.last_metrics[key] == trainer.last_metrics[key], key


def test_checkpoint_holds_the_full_training_state(tmp_path: Path) -> None:
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        trainer = make_trainer(tmp_path, sampler, [StopAt(32)])
        trainer.train()
    path = trainer.last_checkpoint
    assert path is not None and path.name == "ckpt_stage00_step000000000032.pt"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    state = torch.load(path, weights_only=True)  # loads without any pickled object
    for key in ("model", "optimizer", "lr_scheduler", "pipeline", "trackers", "rng"):
        assert state[key] is not None, key
    assert state["pipeline"]["total_steps"] == 32
    assert set(state["rng"]) >= {"python", "numpy", "torch", "shuffle"}
    assert state["rollout"]["state"]["h"].shape == (4, 1, 16)  # the GRU's, [N, L, H]
    episodes = state["sampler"]["episodes"]
    assert len(episodes) == 4 and any(len(e["actions"]) > 0 for e in episodes)
    # An env has no recorded action exactly when its episode starts at the rollout boundary.
    starts = state["rollout"]["episode_starts"].tolist()
    assert [len(e["actions"]) == 0 for e in episodes] == starts
    # numpy's PCG64 state holds 128-bit ints; they survive weights_only loading.
    auto_reset = [e for e in episodes if e["seed"] is None]
    for e in auto_reset:
        assert e["np_random"]["state"]["state"] > 2**64


class Pickled:
    pass


def test_checkpoint_that_needs_a_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ckpt_stage00_step000000000001.pt"
    torch.save({"model": {}, "config": {}, "x": Pickled()}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)


def test_resume_picks_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, {"model": {}, "config": {}}, 0, step)
    folder = tmp_path / "checkpoints"
    (folder / "latest").write_text(checkpoint_name(0, 2))  # killed before `latest` moved on
    (folder / checkpoint_name(0, 4)).write_bytes(b"not a checkpoint")  # unreadable: skipped
    run_dir, path, _ = resolve_resume_path(tmp_path)
    assert run_dir == tmp_path.resolve() and path.name == checkpoint_name(0, 3)
    assert resolve_resume_path(folder / checkpoint_name(0, 1))[1].name == checkpoint_name(0, 1)


# ----------------------------------------------------------------- inference agent
MODEL_CFG = {
    "_target_": "rl.models.ActorCritic",
    "_partial_": True,
    "cnn_channels": [8],
    "trunk_layers": [32],
    "rnn": "gru",
    "rnn_hidden_size": 16,
}


def test_inference_agent_reproduces_the_engines_argmax_actions(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = build_policy(MODEL_CFG, *task_spaces(SMALL))
    with torch.no_grad():  # random weights: varied actions that depend on the GRU state
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    path = save_checkpoint(tmp_path, {"model": model.state_dict(), "config": _cfg()}, 0, 0)
    seed = 7
    engine_actions: list[list[int]] = [[]]
    with SerialSampler(task=SMALL, num_envs=1, seed=seed) as sampler:
        obs = obs_of(sampler.reset())
        starts = torch.ones(1, dtype=torch.bool)
        state = model.initial_state(1, "cpu")
        while len(engine_actions) < 3:  # two episodes (the second after an auto-reset)
            step = model.act(policy_input(obs, starts, state), deterministic=True)
            state = step["next_state"]
            engine_actions[-1].append(int(step["actions"][0]))
            result = sampler.step(step["actions"].numpy())
            obs = obs_of(result)
            starts = result["terminated"] | result["truncated"]
            if starts[0]:
                engine_actions.append([])
    agent = InferenceAgent.from_checkpoint(path, deterministic=True)
    env = build_env(SMALL)
    agent_actions = []
    for episode in range(2):
        obs, _ = env.reset(seed=env_seeds(1, seed)[0] if episode == 0 else None)
        agent.reset()
        actions, done = [], False
        while not done:
            actions.append(agent.act(obs))
            obs, _, terminated, truncated, _ = env.step(actions[-1])
            done = terminated or truncated
        agent_actions.append(actions)
    env.close()
    assert agent_actions == engine_actions[:2]
    assert len({a for ep in agent_actions for a in ep}) > 1  # not a constant policy


def _cfg() -> dict:
    return {"model": MODEL_CFG, "task": SMALL}


# --------------------------------------------------------- resume / init_from configs
SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "eval.num_episodes=0", "model.cnn_channels=[8]"]


def test_resume_accepts_safe_overrides_and_refuses_unsafe_ones(
    compose_cfg, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run.train(compose_cfg([*SMOKE, "logger=wandb"]))
    saved = load_checkpoint(latest_checkpoint(run_dir))
    # The config group choices, in the order typed: the config is rebuilt on conf/ with them.
    assert saved["wandb_run_id"] and saved["config"]["total_env_steps"] == 256
    assert list(saved["choices"])[:2] == ["experiment", "debug"]
    assert saved["choices"]["logger"] == "wandb" and "config_unresolved" not in saved
    for override, key in [
        ("pipeline.optimizer.lr=0.1", "pipeline.optimizer.lr: 0.003 -> 0.1"),  # ppo_nav: 3e-3
        ("model.rnn_hidden_size=32", "model.rnn_hidden_size: 128 -> 32"),
    ]:
        with pytest.raises(ConfigError, match="cannot change when resuming") as err:
            run.train(compose_cfg([*SMOKE, "logger=wandb", f"resume={run_dir}", override]))
        assert key in str(err.value)
    # Safe: a larger budget (the stage budget and schedule horizons follow), the same folder,
    # the same wandb run; not-typed differences (no +debug=smoke) keep the saved values, but
    # sizes are the command's (a run folder never chooses them): ppo_nav's 64 environments
    # are refused, naming what to type to resume the run as it ran.
    other = tmp_path / "other"
    resume = ["+experiment=ppo_nav", "logger=wandb", f"resume={run_dir}", "total_env_steps=384"]
    cfg = compose_cfg(resume)
    with pytest.raises(ConfigError, match=r"\(sampler\.num_envs=4\).*\n.*the run used 4, "):
        plan_start(cfg, to_plain(cfg))
    cfg = compose_cfg([*resume, "sampler.num_envs=4"])
    start = plan_start(cfg, to_plain(cfg))
    start.close()
    assert start.wandb_run_id == saved["wandb_run_id"]  # the sink continues it (test_wandb)
    assert start.config["sampler"]["num_envs"] == 4  # typed again
    assert start.config["eval"]["num_episodes"] == 200  # the command's (ppo_nav's), not 4
    caplog.clear()
    with caplog.at_level(logging.INFO):
        run.train(
            compose_cfg(
                [*SMOKE, f"resume={run_dir}", f"hydra.run.dir={other}", "total_env_steps=384"]
            )
        )
    text = caplog.text
    assert "total_env_steps: 256 -> 384" in text
    assert "pipeline.stages.0.max_stage_steps: 256 -> 384  (derived)" in text
    names = [p.name for p in list_checkpoints(run_dir)]
    assert names[-1] == "ckpt_stage00_step000000000384.pt"
    steps = [json.loads(line)["env_step"] for line in (run_dir / "metrics.jsonl").open()]
    assert steps[0] == 64 and steps[-1] == 384  # appended to, not replaced
    assert "resuming" in (run_dir / "train.log").read_text()


def test_init_from_loads_weights_and_restarts_the_pipeline(
    compose_cfg, smoke_run: Path, tmp_path: Path
) -> None:
    first = smoke_run  # (read only: init_from takes its weights)
    ckpt = latest_checkpoint(first)
    weights = load_checkpoint(ckpt)["model"]
    cfg = compose_cfg(
        [*SMOKE_RUN, f"init_from={ckpt}", f"output_dir={tmp_path / 'new'}"], set_output_dir=False
    )
    start = plan_start(cfg, to_plain(cfg))
    start.close()  # the plan holds the new run folder's lock until closed
    model = build_policy(start.config["model"], *task_spaces(start.config["task"]))
    start.init_model(model)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    run.train(cfg)
    names = [p.name for p in list_checkpoints(tmp_path / "new")]
    assert names == ["ckpt_stage00_step000000000128.pt", "ckpt_stage00_step000000000256.pt"]
    state = load_checkpoint(tmp_path / "new" / "checkpoints" / names[0])
    assert state["pipeline"]["total_steps"] == 128
    # A fresh optimizer: 2 rollouts x 2 minibatches so far, not the first run's count too.
    assert int(state["optimizer"]["state"][0]["step"]) == 4
    with pytest.raises(ConfigError, match="exclude each other"):
        run.train(compose_cfg([*SMOKE_RUN, f"init_from={ckpt}", f"resume={first}"]))


# ------------------------------------------------------------ the real CLI: signals
ROOT = Path(__file__).resolve().parents[1]
CLI = [
    "+experiment=ppo_nav",
    "+debug=smoke",
    "total_env_steps=3072",
    "pipeline.save_interval=128",
    "eval.num_episodes=0",
]


def launch(tmp_path: Path, name: str, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    return subprocess.Popen(
        [sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path / name}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / f"{name}.err").open("w"),
    )


def newest_step(run_dir: Path) -> int:
    found = list_checkpoints(run_dir)
    return int(found[-1].name[-15:-3]) if found else -1


def wait_for_checkpoint_after(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    deadline = time.monotonic() + 120
    while newest_step(run_dir) <= step:
        assert proc.poll() is None, "train.py ended before writing a checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.01)


def assert_checkpoints_valid(run_dir: Path) -> None:
    """Every file under a checkpoint name loads, and ``latest`` names a loadable one."""
    for path in list_checkpoints(run_dir):
        load_checkpoint(path)
    pointer = (run_dir / "checkpoints" / "latest").read_text()
    load_checkpoint(run_dir / "checkpoints" / pointer)


@pytest.mark.slow
def test_signals_and_kill9_during_writes_never_lose_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # SIGTERM: a checkpoint at the next rollout boundary, exit code 143.
    proc = launch(tmp_path, "run", *CLI)
    wait_for_checkpoint_after(proc, run_dir, -1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == EXIT_SIGTERM
    assert "stopped by SIGTERM" in (tmp_path / "run.err").read_text()
    assert_checkpoints_valid(run_dir)
    step = newest_step(run_dir)
    assert 0 < step < 3072 and step % 64 == 0  # a rollout boundary, not only save_interval
    # kill -9 at random moments, some while a checkpoint is being written; resume each time.
    rng = random.Random(0)
    for attempt in range(3):
        proc = launch(tmp_path, f"kill{attempt}", *CLI, f"resume={run_dir}")
        wait_for_checkpoint_after(proc, run_dir, step)
        if attempt != 1:  # wait until a temporary checkpoint file exists, then kill
            folder = run_dir / "checkpoints"
            while proc.poll() is None and not any(folder.glob(".*.tmp")):
                time.sleep(0.0005)  # (a spinning loop would take the core the run needs)
        else:
            time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        proc.wait(timeout=30)
        assert_checkpoints_valid(run_dir)
        assert newest_step(run_dir) > step
        step = newest_step(run_dir)
    # SIGUSR1: checkpoint and the requeue exit code.
    proc = launch(tmp_path, "usr1", *CLI, f"resume={run_dir}")
    wait_for_checkpoint_after(proc, run_dir, step)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == EXIT_REQUEUE
    assert_checkpoints_valid(run_dir)
    # The last resume finishes the run in the same folder.
    proc = launch(tmp_path, "final", *CLI, f"resume={run_dir}")
    assert proc.wait(timeout=240) == 0, (tmp_path / "final.err").read_text()
    assert newest_step(run_dir) == 3072
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # stale ones were removed
    steps = [json.loads(line)["env_step"] for line in (run_dir / "metrics.jsonl").open()]
    assert steps[0] == 64 and steps[-1] == 3072


def test_the_inference_agent_takes_a_runs_latest_pointer_and_folder(tmp_path: Path) -> None:
    """``InferenceAgent.from_checkpoint`` takes what ``evaluate.py ckpt=`` takes: ``latest``."""
    from rl.checkpoints.files import checkpoint_file

    torch.manual_seed(0)
    model = build_policy(MODEL_CFG, *task_spaces(SMALL))
    first = save_checkpoint(tmp_path, {"model": model.state_dict(), "config": _cfg()}, 0, 64)
    newest = save_checkpoint(tmp_path, {"model": model.state_dict(), "config": _cfg()}, 0, 128)
    pointer = tmp_path / "checkpoints" / "latest"
    assert first != newest and checkpoint_file(pointer) == newest == checkpoint_file(tmp_path)
    assert checkpoint_file(first) == first
    agent = InferenceAgent.from_checkpoint(pointer, deterministic=True)
    assert agent.act(build_env(SMALL).reset(seed=0)[0]) in range(4)


# The unlogged metrics as a crafted, re-signed checkpoint may hold them: each refused by name.
CRAFTED_METRICS = [
    ({"finished_episodes": "charts/x"}, r"finished_episodes: expected a list"),
    ({"finished_episodes": {"charts/x": 1.0}}, r"finished_episodes: expected a list"),
    ({"finished_episodes": [[1.0, 2.0]]}, r"finished_episodes\[0\]: expected metric names"),
    ({"finished_episodes": [{"charts/x": "1"}]}, r"finished_episodes\[0\]"),
    ({"finished_episodes": [{"charts/x": 1.0}, {"charts/x": True}]}, r"finished_episodes\[1\]"),
    ({"finished_episodes": [{3: 1.0}]}, r"finished_episodes\[0\]"),
    ({"finished_episodes": [{"charts/x": 10**400}]}, r"finished_episodes\[0\]"),
    ({"trackers": ["episode"]}, r"trackers: expected a mapping"),
    ({"trackers": {"episode": "sums"}}, r"trackers\.episode: expected a mapping"),
    ({"trackers": {"train": {"sums": {"x": [1.0]}, "counts": {}}}}, r"trackers\.train\.sums"),
    ({"trackers": {"criteria": {"sums": {}, "counts": None}}}, r"trackers\.criteria\.counts"),
]


@pytest.mark.parametrize(("crafted", "message"), CRAFTED_METRICS)
def test_crafted_unlogged_metrics_in_a_resigned_checkpoint_are_refused_by_name(
    tmp_path: Path, crafted: dict, message: str
) -> None:
    with SAMPLERS["one_agent"]() as sampler:
        trainer = make_trainer(tmp_path / "run", sampler, [StopAt(128)])
        trainer.train()
    genuine = load_checkpoint(trainer.last_checkpoint)
    assert genuine["finished_episodes"]  # episodes finished since the log at 96
    # Written as the project writes checkpoints (signed), then resumed as a user would.
    path = save_checkpoint(tmp_path / "crafted", {**genuine, **crafted}, 1, 128)
    with SAMPLERS["one_agent"]() as sampler:
        resumed = make_trainer(tmp_path / "resumed", sampler)
        with pytest.raises(CheckpointError, match=f"checkpoint entry {message}"):
            resumed.load_state_dict(load_checkpoint(path))
    # The genuine one, re-signed the same way, resumes.
    path = save_checkpoint(tmp_path / "again", genuine, 1, 128)
    with SAMPLERS["one_agent"]() as sampler:
        make_trainer(tmp_path / "resumed2", sampler).load_state_dict(load_checkpoint(path))
