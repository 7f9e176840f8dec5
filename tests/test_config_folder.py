"""A researcher's own config folder, outside the checkout, as part of the user's config tree.

Trained with ``hydra.searchpath=[file://<folder>]``, a run is evaluated and resumed (bitwise)
from the same folder typed again; without it, the error says which folder the run used and what
to type. The folder is never taken from the checkpoint, and a crafted checkpoint still cannot
select code the folder does not name (issue 51, point 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from rl.checkpoints import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from rl.checkpoints.config_tree import ConfigTree
from rl.checkpoints.files import UntrustedCheckpointError, parse_checkpoint_name
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.training import Callback
from rl.training.stopping import TrainingStopped

# The researcher's experiment, kept in their own repository: CartPole with their settings and
# their callback (code their folder names).
EXPERIMENT = """\
# @package _global_
defaults:
  - ppo_cartpole
exp_name: my_cartpole
total_env_steps: 256
pipeline:
  optimizer: {lr: 7.0e-4}
  num_steps: 16
callbacks:
  - {_target_: tests.test_config_folder.StopOnceAt, at: 128}
"""
COMMON = ["+experiment=my_cartpole", "+debug=smoke", "total_env_steps=256",
          "eval.num_episodes=0", "logger.sinks.console.progress_bar=false"]  # fmt: skip


class StopOnceAt(Callback):
    """Stops training (as SIGTERM does: a checkpoint, then the exit) at exactly ``at`` env
    steps; a run resumed past that step never stops here again."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        if info.total_steps == self.at:
            trainer.request_stop("SIGTERM")


class Planted:
    """Code the folder does not name: building it leaves a mark."""

    built: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Planted.built.append("built")


@pytest.fixture
def my_conf(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere" / "my_conf"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "my_cartpole.yaml").write_text(EXPERIMENT)
    return folder


def _search(folder: Path) -> str:
    return f"hydra.searchpath=[file://{folder}]"


def _train(compose_cfg: Callable, folder: Path, out: Path, *extra: str) -> dict[str, float]:
    overrides = [*COMMON, _search(folder), f"output_dir={out}", *extra]
    return run.train(compose_cfg(overrides, set_output_dir=False))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def test_a_run_from_an_outside_folder_is_evaluated_and_resumed_bitwise_from_it(
    compose_cfg: Callable, my_conf: Path, tmp_path: Path
) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    _train(compose_cfg, my_conf, reference, "callbacks=[]")  # uninterrupted
    with pytest.raises(TrainingStopped):  # the folder's callback stops it at 128 env steps
        _train(compose_cfg, my_conf, resumed)
    assert parse_checkpoint_name(latest_checkpoint(resumed)) == (0, 128)
    state = load_checkpoint(latest_checkpoint(resumed))
    assert state["choices"]["experiment"] == "my_cartpole"
    assert state["config_sources"]["searchpath"] == [f"file://{my_conf}"]

    # Resumed without the folder: refused, saying which folder and what to type.
    with pytest.raises(CheckpointError) as caught:
        run.train(compose_cfg([f"resume={resumed}", "sampler.num_envs=4"]))
    message = str(caught.value)
    assert "experiment=my_cartpole" in message
    assert f'"hydra.searchpath=[file://{my_conf}]"' in message
    assert "never taken from a checkpoint" in message

    # With the folder typed again: resumed to the end, bitwise as the uninterrupted run.
    run.train(compose_cfg([f"resume={resumed}", "sampler.num_envs=4", _search(my_conf)]))
    assert parse_checkpoint_name(latest_checkpoint(resumed)) == (0, 256)
    want, got = _weights(reference), _weights(resumed)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name

    # Evaluated from the same folder: evaluate.py's config, and InferenceAgent from Python.
    evaluate = ["num_episodes=2", "num_envs=2", "progress_bar=false", f"run_dir={resumed}",
                f"output_dir={tmp_path / 'eval_out'}"]  # fmt: skip
    with pytest.raises(CheckpointError, match="hydra.searchpath"):
        run.evaluate(compose_cfg(evaluate, config_name="evaluate"))
    metrics = run.evaluate(compose_cfg([*evaluate, _search(my_conf)], config_name="evaluate"))
    assert metrics["eval/episodic_length"] > 0
    agent = InferenceAgent.from_checkpoint(resumed, searchpath=[f"file://{my_conf}"])
    assert agent.act(gym.make("CartPole-v1").reset(seed=0)[0]) in (0, 1)


def test_a_crafted_checkpoint_cannot_select_code_the_folder_does_not_name(
    compose_cfg: Callable, my_conf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    _train(compose_cfg, my_conf, out, "callbacks=[]")
    path = latest_checkpoint(out)
    state = load_checkpoint(path)
    stage, step = parse_checkpoint_name(path)  # type: ignore[misc]
    evaluate = ["num_episodes=2", "num_envs=2", "progress_bar=false", f"ckpt={path}",
                f"output_dir={tmp_path / 'eval_out'}", _search(my_conf)]  # fmt: skip

    # A planted model class: the folder (and conf/) name another there.
    crafted = {**state, "config": {**state["config"], "model": {
        **state["config"]["model"], "_target_": "tests.test_config_folder.Planted"}}}  # fmt: skip
    save_checkpoint(out, crafted, stage, step)
    Planted.built.clear()
    with pytest.raises(UntrustedCheckpointError, match=r"model\._target_"):
        run.evaluate(compose_cfg(evaluate, config_name="evaluate"))
    assert Planted.built == []

    # Recorded sources that point elsewhere (an attacker's folder naming Planted) are never
    # composed: evaluation without a search path still refuses, quoting them as data only.
    theirs = tmp_path / "theirs"
    (theirs / "experiment").mkdir(parents=True)
    (theirs / "experiment" / "my_cartpole.yaml").write_text(
        EXPERIMENT + "model: {_target_: tests.test_config_folder.Planted}\n"
    )
    crafted = {**state, "config_sources": {"config_dir": None, "searchpath": [f"file://{theirs}"]}}
    save_checkpoint(out, crafted, stage, step)
    with pytest.raises(CheckpointError, match="has no option for"):
        run.evaluate(compose_cfg(evaluate[:-1], config_name="evaluate"))
    assert Planted.built == []

    # Sources that are not short printable names are refused as the file is read.
    for bad in ({"searchpath": "file:///x"}, {"searchpath": ["x\n; rm -rf /"]},
                {"config_dir": 3}, {"searchpath": ["x"] * 1000}, {"other": []}):  # fmt: skip
        save_checkpoint(out, {**state, "config_sources": bad}, stage, step)
        with pytest.raises(UntrustedCheckpointError, match="recorded config sources"):
            load_checkpoint(path)


def test_the_tree_of_a_composed_config_carries_its_search_path(
    compose_cfg: Callable, my_conf: Path
) -> None:
    compose_cfg([*COMMON, _search(my_conf)])
    tree = ConfigTree.current()
    assert tree.searchpath == (f"file://{my_conf}",)
    assert dataclasses.replace(tree, searchpath=()).searchpath == ()
    raw, used = tree.compose({"experiment": "my_cartpole"}, "test")
    assert used["experiment"] == "my_cartpole"
    assert raw["pipeline"]["optimizer"]["lr"] == 7.0e-4
