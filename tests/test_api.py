"""The Python API (rl.api): train and evaluate with the command line's overrides, then use the
policy with an explicit state (``InferenceAgent.predict``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rl
from rl.evaluation import InferenceAgent
from rl.tasks import build_env

SMOKE = ("+experiment=ppo_cartpole", "+debug=smoke", "eval.num_episodes=4",
         "logger.sinks.console.progress_bar=false")  # fmt: skip


def test_train_then_evaluate_from_python(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # runs go to outputs/<exp_name>/<time>, as with train.py
    run = rl.train(*SMOKE, "seed=3")
    assert run.run_dir.parent == (tmp_path / "outputs" / "ppo_CartPole-v1").resolve()
    assert "eval/episodic_return" in run.metrics
    saved = (run.run_dir / "config.yaml").read_text()
    assert "seed: 3" in saved and "torch_threads: 1" in saved  # one thread unless told
    results = rl.evaluate(f"run_dir={run.run_dir}", "num_episodes=6", "plot=false")
    assert "eval/episodic_return" in results
    summary = json.loads((run.run_dir / "eval_summary.json").read_text())
    assert summary["settings"]["num_episodes"] == 6 and summary["checkpoints"]  # as evaluate.py


def test_predict_with_an_explicit_state_equals_act(tmp_path: Path) -> None:
    run = rl.train(  # a recurrent policy (ppo_nav's GRU): the state matters
        "+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "model.cnn_channels=[8]",
        "eval.num_episodes=0", "valid=null", "logger.sinks.console.progress_bar=false",
        f"output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    agent = InferenceAgent.from_checkpoint(run.run_dir, deterministic=True)
    other = InferenceAgent.from_checkpoint(run.run_dir / "checkpoints" / "latest")
    env = build_env({"_target_": "rl_envs.pointnav.PointNavEnv", "size": 9, "rooms_per_side": 2,
                     "max_steps": 20})  # fmt: skip
    obs, _ = env.reset(seed=5)
    state, start = None, True
    agent.reset()
    for _ in range(20):
        expected = agent.act(obs)
        action, state = other.predict(obs, state, start)
        start = False
        assert action == expected
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    env.close()


def test_inside_a_hydra_app_the_api_says_what_to_call() -> None:
    from hydra import initialize_config_dir

    from rl.api import PROJECT_CONF

    with initialize_config_dir(version_base="1.3", config_dir=str(PROJECT_CONF)):
        with pytest.raises(RuntimeError, match=r"call rl.engine.train\(cfg\)"):
            rl.train("+experiment=ppo_cartpole")


def test_evaluation_acts_as_the_run_evaluated_while_training(tmp_path: Path) -> None:
    """evaluate.py's default (``deterministic: null``): the run's own ``eval.deterministic``."""
    run = rl.train(*SMOKE, "eval.deterministic=true", f"output_dir={tmp_path / 'run'}")
    rl.evaluate(f"run_dir={run.run_dir}", "num_episodes=3", "plot=false")
    first = {p.name for p in run.run_dir.glob("checkpoints/*.eval.*.json")}
    assert first and all("-argmax-" in name for name in first), first
    rl.evaluate(f"run_dir={run.run_dir}", "num_episodes=3", "plot=false", "deterministic=false")
    tags = sorted(p.name.split(".eval.")[1] for p in run.run_dir.glob("checkpoints/*.eval.*.json"))
    assert sorted({t.split("-")[2] for t in tags}) == ["argmax", "sampled"], tags


def test_a_config_edited_in_python_trains_under_its_own_name(tmp_path: Path, monkeypatch) -> None:
    """rl.compose, a whole node replaced in Python, rl.train(cfg=): the run folder follows."""
    monkeypatch.chdir(tmp_path)
    cfg = rl.compose(*SMOKE)
    cfg.task = {"_target_": "rl.tasks.make_gym_env", "env_id": "Acrobot-v1"}
    run = rl.train(cfg=cfg)
    assert run.run_dir.parent.name == "ppo_Acrobot-v1"  # not the composed ppo_CartPole-v1
    assert "env_id: Acrobot-v1" in (run.run_dir / "config.yaml").read_text()
    with pytest.raises(TypeError, match="not both"):
        rl.train("seed=2", cfg=cfg)
