"""The documentation's code runs: the loss of "Adding a loss" trains through the real engine."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf, open_dict

import rl.engine.run
from rl.engine.settings import verify_train_cfg
from rl.utils.config import ConfigError, import_target

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((ROOT / "docs" / page).read_text())


@contextlib.contextmanager
def users_package(root: Path, name: str, modules: dict[str, str]) -> Iterator[None]:
    """``name`` (a package of ``modules``: file name -> code) importable while inside."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, code in modules.items():
        (root / name / f"{module}.py").write_text(code)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[loaded]


@pytest.fixture
def my_package(tmp_path: Path) -> Any:
    """``my_package.losses`` holding the page's example, importable for this test."""
    with users_package(
        tmp_path, "my_package", {"losses": python_blocks("howto/add-a-loss.md")[0]}
    ):
        yield tmp_path / "my_package"


OVERRIDES = [  # CartPole: a reward of 1 every step, what a head that trains learns at once
    "+experiment=ppo_cartpole",
    "total_env_steps=8192",
    "eval.num_episodes=0",
    "valid=null",
    "logger.sinks.console.progress_bar=false",
    "pipeline.metric_accumulate_interval=1024",
    "torch_threads=1",
    "+pipeline.named_losses.reward={_target_: my_package.losses.RewardPredictionLoss}",
    "pipeline.stages.0.loss_names=[ppo,reward]",
    "+pipeline.stages.0.loss_weights=[1.0,0.1]",
    "trusted_targets=[my_package.*]",
]


@pytest.mark.learning
def test_the_auxiliary_loss_of_adding_a_loss_trains(my_package: Path, compose_cfg: Any) -> None:
    cfg = compose_cfg(OVERRIDES)
    rl.engine.run.train(cfg)
    records = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").open()]
    mse = [r["losses/reward/reward_mse"] for r in records if "losses/reward/reward_mse" in r]
    assert len(mse) >= 4, records
    # Its head (in the optimizer) learns the rewards: the last error was 0.1-0.9% of the first
    # for seeds 1-5.
    assert mse[-1] < 0.1 * mse[0], mse


def test_a_wrong_key_of_that_loss_is_named(
    my_package: Path, compose_cfg: Any, resolve_cfg
) -> None:
    cfg = compose_cfg(OVERRIDES)
    with open_dict(cfg):
        cfg.pipeline.named_losses.reward.hiden_size = 32
    with pytest.raises(ConfigError, match=r"pipeline\.named_losses\.reward\.hiden_size"):
        verify_train_cfg(resolve_cfg(cfg))


def test_the_pipeline_pages_own_estimator_trains(compose_cfg, tmp_path: Path) -> None:
    """docs/concepts/pipeline.md: its estimator class and YAML, as written, train a run."""
    code = next(b for b in python_blocks("concepts/pipeline.md") if "class ScaledTD" in b)
    yaml = next(
        b
        for b in re.findall(
            r"```yaml\n(.*?)```", (ROOT / "docs/concepts/pipeline.md").read_text(), re.DOTALL
        )  # fmt: skip
        if "my_pkg.td.ScaledTD" in b
    )
    conf = tmp_path / "conf" / "pipeline" / "advantage"
    conf.mkdir(parents=True)
    (conf / "scaled_td.yaml").write_text(yaml)
    with users_package(tmp_path, "my_pkg", {"td": code}):
        cfg = compose_cfg(
            [
                "+experiment=ppo_classic_control",
                "+debug=smoke",
                f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                "pipeline/advantage=scaled_td",
                "eval.num_episodes=0",
                "logger.sinks.console.progress_bar=false",
            ]
        )
        metrics = rl.engine.run.train(cfg)
    assert metrics["losses/td/mean_abs"] > 0.0


def test_the_layout_pages_loop_from_python_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """docs/layout.md's "The loop from Python", as written but for its budget and folder."""
    code = next(b for b in python_blocks("layout.md") if "OnPolicyTrainer(" in b)
    assert "max_stage_steps=100_000" in code and '"outputs/by_hand"' in code
    code = code.replace("max_stage_steps=100_000", "max_stage_steps=2_048")
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()  # (the snippet sets one thread for the process)
    try:
        exec(compile(code, "docs/layout.md", "exec"), {"__name__": "docs_example"})
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "losses/ppo/policy_loss" in printed, printed
    assert (tmp_path / "outputs" / "by_hand" / "checkpoints").is_dir()


def test_the_layout_pages_ppo_iteration_names_what_is_there() -> None:
    """docs/layout.md's "One PPO iteration": every name it gives exists, and its count of files
    is the files those names live in."""
    text = (ROOT / "docs" / "layout.md").read_text()
    section = text.split("\n## One PPO iteration, in reading order\n", 1)[1].split("\n## ")[0]
    steps, files_paragraph = section.rsplit("\nThat is ", 1)
    named = set(re.findall(r"`(rl\.[\w.]+)`", steps))
    assert len(named) > 15, named
    files = set()
    for dotted in named:
        obj = import_target(dotted)  # (as Hydra's _target_: a class attribute too)
        module = inspect.getmodule(obj)
        assert module is not None and module.__file__ is not None, dotted
        files.add(Path(module.__file__).relative_to(ROOT / "rl").as_posix())
    count, listed = files_paragraph.split(" files of `rl/`: ", 1)
    assert set(re.findall(r"`([\w/]+\.py)`", listed)) == files
    assert int(count) == len(files)


def test_a_local_config_as_the_configs_page_writes_it(compose_cfg, resolve_cfg, tmp_path) -> None:
    """docs/concepts/configs.md's ``conf/local/default.yaml`` applies; without its header, the
    config is refused naming ``local``."""
    page = (ROOT / "docs" / "concepts" / "configs.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    yaml_text = next(b for b in blocks if "@package _global_" in b)
    assert yaml_text.startswith("# @package _global_\n")
    (tmp_path / "conf" / "local").mkdir(parents=True)
    local = tmp_path / "conf" / "local" / "default.yaml"
    local.write_text(yaml_text.split("hydra:")[0])  # (the launcher part needs hydra/launcher)
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", search]))
    assert plain["torch_threads"] == 4
    verify_train_cfg(plain)
    local.write_text("torch_threads: 4\n")  # the header left out
    with pytest.raises(ConfigError, match="local"):
        verify_train_cfg(resolve_cfg(compose_cfg(["+experiment=ppo_nav", search])))


@pytest.mark.parametrize(
    ("module", "cls", "extra"),
    [
        ("policies", "TinyMLP", []),
        ("recurrent", "TinyLSTM", ["pipeline.recurrence=8"]),
    ],
)
def test_the_add_a_model_pages_policies_train(compose_cfg, tmp_path, module, cls, extra) -> None:
    """docs/howto/add-a-model.md: each class as written trains PPO on CartPole (smoke)."""
    code = next(b for b in python_blocks("howto/add-a-model.md") if f"class {cls}(" in b)
    with users_package(tmp_path, "my_package", {module: code}):
        cfg = compose_cfg(
            ["+experiment=ppo_cartpole", "+debug=smoke", "eval.num_episodes=4",
             "logger.sinks.console.progress_bar=false", *extra]
        )  # fmt: skip
        with open_dict(cfg):
            cfg.model = {"_target_": f"my_package.{module}.{cls}", "_partial_": True}
        metrics = rl.engine.run.train(cfg)
    assert metrics["eval/episodic_return"] > 0


@pytest.mark.parametrize(
    ("cls", "module", "group", "option", "overrides"),
    [
        ("TinyConv", "encoders", "encoder", "tiny_conv",
         ["+model/encoder@model.encoders.image=tiny_conv"]),
        ("LeakyCore", "cores", "core", "leaky",
         ["+model/core@model.core=leaky", "model.rnn=null"]),
        ("GatedHead", "heads", "head", "gated",
         ["+model/head@model.policy_head=gated", "+model/head@model.value_head=gated"]),
    ],
    ids=["encoder", "core", "head"],
)  # fmt: skip
def test_the_add_a_model_pages_parts_train_from_their_yaml(
    compose_cfg, tmp_path, cls, module, group, option, overrides
) -> None:
    """docs/howto/add-a-model.md: its encoder, core and head, class and YAML as written, each
    train ppo_nav (smoke) from a folder of one's own."""
    code = next(b for b in python_blocks("howto/add-a-model.md") if f"class {cls}(" in b)
    page = (ROOT / "docs" / "howto" / "add-a-model.md").read_text()
    yaml = next(b for b in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL) if cls in b)
    (tmp_path / "conf" / "model" / group).mkdir(parents=True)
    (tmp_path / "conf" / "model" / group / f"{option}.yaml").write_text(yaml)
    with users_package(tmp_path, "my_package", {module: code}):
        cfg = compose_cfg(
            ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=2",
             f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *overrides]
        )  # fmt: skip
        assert f"my_package.{module}.{cls}" in str(OmegaConf.to_container(cfg.model))
        metrics = rl.engine.run.train(cfg)
    assert metrics["eval/episodic_length"] > 0


def test_the_pipeline_pages_callback_runs_from_the_config(
    compose_cfg, resolve_cfg, tmp_path, capsys
) -> None:
    """docs/concepts/pipeline.md: ``StageReport`` as written, named in ``callbacks:``."""
    code = next(b for b in python_blocks("concepts/pipeline.md") if "class StageReport(" in b)
    with users_package(tmp_path, "my_package", {"callbacks": code}):
        cfg = compose_cfg(
            ["+experiment=ppo_cartpole", "+debug=smoke", "eval.num_episodes=0",
             "logger.sinks.console.progress_bar=false",
             "callbacks=[{_target_: my_package.callbacks.StageReport}]"]
        )  # fmt: skip
        rl.engine.run.train(cfg)
        cfg = compose_cfg(["+experiment=ppo_cartpole", "callbacks=[{_target_: my_package.nope}]"])
        with pytest.raises(ConfigError, match=r"callbacks.0._target_: cannot import"):
            verify_train_cfg(resolve_cfg(cfg))
    assert "stage 0 ended at" in capsys.readouterr().out


def test_the_getting_started_python_example_runs(tmp_path, monkeypatch, capsys) -> None:
    """docs/getting-started.md "From Python", as written but for its budget."""
    code = next(b for b in python_blocks("getting-started.md") if "rl.train(" in b)
    assert '"total_env_steps=50_000"' in code
    code = code.replace('"total_env_steps=50_000"', '"total_env_steps=2_048"')
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/getting-started.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert "ppo_CartPole-v1" in out and "eval/episodic_return" in out and "return " in out


@pytest.mark.learning
def test_the_notebook_page_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    """docs/howto/notebook.md: its module and its notebook, as written (budget included).

    A user's env, policy and callback train, the run is evaluated, exported and run with
    onnxruntime: the exported actions equal the framework's on 100 observations. Seeds 1-5
    all reached an evaluation success of 0.99-1.0 at this budget.
    """
    module, cells = python_blocks("howto/notebook.md")
    (tmp_path / "my_corridor.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        exec(compile(cells, "docs/howto/notebook.md", "exec"), {"__name__": "docs_example"})
    finally:
        sys.modules.pop("my_corridor", None)
    out = capsys.readouterr().out
    assert "equal on 100 observations: True" in out
    (run_dir,) = (tmp_path / "outputs" / "ppo_Corridor").iterdir()  # named after the task
    assert json.loads((run_dir / "best_success.json").read_text())["best_success"] > 0.9
    summary = json.loads((run_dir / "eval_summary.json").read_text())
    assert summary["checkpoints"][-1]["success"] >= 0.9
    assert (tmp_path / "corridor.onnx").is_file()


def test_the_samplers_pages_step_example_runs(capsys) -> None:
    """docs/concepts/samplers.md: a sampler's step ``TensorDict`` read as the page reads it."""
    code = next(b for b in python_blocks("concepts/samplers.md") if "finished_episodes" in b)
    exec(compile(code, "docs/concepts/samplers.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out.split("\n")
    assert any(line.endswith(" 1.0") for line in out)  # the expert's episodes succeed
