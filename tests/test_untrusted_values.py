"""A file never chooses code, addresses, paths or sizes (issue 52, the second ring of trust).

Each test crafts a checkpoint or run folder from a real run, re-signed with the project's
digest as an attacker's would be (:mod:`crafted`), and feeds it through the entry points it
applies to: a value of another kind than the tree's is refused before it is judged; network
addresses, authentication switches, loggers, data paths and resource sizes are the command's,
never the file's; a saved config's strings are bounded in total; deep nesting and huge files
in a run folder are named errors.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from crafted import SMOKE, copy_run, crafted, entries, file_hashes, make_sentinel, resign
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from rl.checkpoints import CheckpointError, latest_checkpoint, load_checkpoint
from rl.checkpoints.errors import UntrustedCheckpointError
from rl.checkpoints.resume import plan_start
from rl.checkpoints.saved_config import MAX_CHARS, rebuild_config
from rl.engine import run
from rl.evaluation.expert_reference import load_expert_reference
from rl.evaluation.report import training_curve
from rl.utils.config import ConfigError, to_plain

ROOT = Path(__file__).resolve().parent.parent
# A module shipped inside a shared run folder: importing it leaves a mark.
EVIL = "rl_shipped_module"


def _ship_module(folder: Path, mark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module in ``folder``, which is the working directory and on ``sys.path`` (a notebook
    opened in a shared run folder): importing it writes ``mark``."""
    (folder / f"{EVIL}.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\n"
        "def wrap(env):\n    return env\n"
    )
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))


# --------------------------------------------------------------------- kinds (critical 1)
@pytest.mark.parametrize(
    "choice, wrappers",
    [
        ("gym", {f"{EVIL}.wrap": 1}),  # a mapping where the tree has a list
        ("gym", f"{EVIL}.wrap"),  # a string where the tree has a list
        ("nav_small", {f"{EVIL}.wrap": 1}),  # a key the tree's task lacks
    ],
    ids=["mapping", "string", "new-key"],
)
def test_wrappers_of_another_kind_are_refused_through_every_entry(
    smoke_run: Path,
    tmp_path: Path,
    compose_cfg: Any,
    monkeypatch: pytest.MonkeyPatch,
    choice: str,
    wrappers: Any,
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    state["choices"]["task"] = choice
    state["config"]["task"] = (
        {
            "_target_": "rl.tasks.make_gym_env",
            "env_id": "CartPole-v1",
            "env_kwargs": {},
            "wrappers": wrappers,
            "observations": [],
        }  # fmt: skip
        if choice == "gym"
        else {**state["config"]["task"], "wrappers": wrappers}
    )
    resign(path, state)
    mark = tmp_path / "imported"
    _ship_module(folder, mark, monkeypatch)
    for name, enter in entries(folder, compose_cfg, tmp_path / "eval"):
        with pytest.raises(UntrustedCheckpointError, match=r"task\.wrappers") as info:
            enter()
        # The advice never names what the file names (the attacker's module).
        assert f"trusted_targets='[{EVIL}" not in str(info.value), name
        assert not mark.exists(), name
    assert EVIL not in sys.modules


@pytest.mark.parametrize("section", ["task", "model", "pipeline"])
def test_a_string_where_the_tree_has_a_mapping_is_refused_by_name(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, section: str
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    state["config"][section] = f"{EVIL}.Thing"
    resign(path, state)
    for name, enter in entries(folder, compose_cfg, tmp_path / "eval"):
        if section == "pipeline" and name != "resume":
            continue  # (only a resume builds the pipeline)
        with pytest.raises(UntrustedCheckpointError, match=rf"{section} is a string .* a mapping"):
            enter()


def test_kinds_are_compared_at_every_place_and_none_fits_anywhere(smoke_run: Path) -> None:
    state = load_checkpoint(latest_checkpoint(smoke_run))
    saved, choices = state["config"], state["choices"]

    def rebuilt(place: str, value: Any) -> dict[str, Any]:
        config = json.loads(json.dumps(saved))
        node = config
        *parents, leaf = place.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(leaf) if isinstance(node, list) else leaf] = value
        return rebuild_config(config, choices, "crafted").config

    refused = [
        ("seed", "1"),  # a string where a number is
        ("eval.deterministic", 1),  # a number where a boolean is
        ("tags", {"dev": 1}),  # a mapping where a list is
        ("tags", ["dev", ["nested"]]),  # another length: elements of the tree's kind
        ("pipeline.stages.0", "stage"),  # a string where a mapping is
        ("model.rnn_hidden_size", [128]),  # a list where a number is
    ]
    for place, value in refused:
        with pytest.raises(UntrustedCheckpointError, match=place.replace(".", r"\.")):
            rebuilt(place, value)
    assert rebuilt("eval", None)["eval"] is None  # (null turns evaluation off)
    assert rebuilt("tags", ["a", "b", "c"])["tags"] == ["a", "b", "c"]
    assert rebuilt("pipeline.optimizer.lr", 1)["pipeline"]["optimizer"]["lr"] == 1  # a number


# ------------------------------------------------------------- addresses (critical 2, major 6)
def test_addresses_auth_switches_and_loggers_are_the_command_s(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """A saved ``collector=ray`` joining a cluster the file names, without authentication,
    and a saved ``logger=wandb`` uploading to an entity the file names: a resume takes neither
    (the collector's address and switch are the tree's, the loggers the command's)."""
    folder, path, state = crafted(smoke_run, tmp_path)
    ray = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "collector" / "ray.yaml"))
    state["choices"].update(collector="ray", logger="wandb")
    state["config"]["collector"] = {
        **ray, "address": "ray://127.0.0.1:1", "allow_unauthenticated": True
    }  # fmt: skip
    state["config"]["logger"] = {"sinks": {"wandb": {
        "_target_": "rl.loggers.WandbSink", "_partial_": True, "entity": "attacker",
        "project": "loot", "mode": "online"}}}  # fmt: skip
    state["config"]["task"].update(host="203.0.113.7", port=22, url="http://203.0.113.7/")
    resign(path, state)
    cfg = compose_cfg([*SMOKE, f"resume={folder}"])
    start = plan_start(cfg, to_plain(cfg))
    start.close()
    collector = start.config["collector"]
    assert collector["_target_"].endswith("CollectionWorkerSet")  # (the run's choice, the tree's)
    assert collector["address"] is None and collector["allow_unauthenticated"] is False
    # the command's sinks
    assert set(start.config["logger"]["sinks"]) == {"console", "jsonl", "episodes"}
    assert start.choices["logger"] == "default"
    assert not {"host", "port", "url"} & set(start.config["task"])  # (the tree names none)


# ------------------------------------------------------------------- paths (critical 3)
_EXPERT = "pipeline.stages.0.offpolicy_component.data_iterator"


def _at(config: Any, path: str) -> Any:
    for key in path.split("."):
        config = config[int(key)] if isinstance(config, list) else config[key]
    return config


@pytest.fixture(scope="module")
def bc_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real smoke run of ``bc_offline_ppo_nav`` and its expert data file."""
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    base = tmp_path_factory.mktemp("bc")
    folder, data = base / "run", base / "expert" / "e.npz"
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path="../conf"):
        cfg = compose("train", [
            "+experiment=bc_offline_ppo_nav", "+debug=smoke", "task=nav_small",
            "eval.num_episodes=0", f"output_dir={folder}", f"{_EXPERT}.path={data}",
            f"{_EXPERT}.generate.num_episodes=4"], return_hydra_config=True)  # fmt: skip
    HydraConfig.instance().set_config(cfg)
    run.train(cfg)
    GlobalHydra.instance().clear()
    return folder, data


def test_a_saved_expert_data_path_is_never_written_and_a_resume_never_generates(
    bc_run: tuple[Path, Path], tmp_path: Path, compose_cfg: Any
) -> None:
    run_dir, data = bc_run
    sentinel = make_sentinel(tmp_path)
    dangling = sentinel / "data.npz"  # a dangling link where the file says to write
    dangling.symlink_to(sentinel / "nowhere.npz")
    fifo = sentinel / "fifo.npz"
    os.mkfifo(fifo)
    before = file_hashes(sentinel)
    command = ["+experiment=bc_offline_ppo_nav", "+debug=smoke", "task=nav_small",
               "eval.num_episodes=0", "total_env_steps=320"]  # fmt: skip
    ours = Path(_at(to_plain(compose_cfg(command)), f"{_EXPERT}.path"))  # the command's path
    assert not ours.exists()
    for i, target in enumerate((dangling, fifo)):
        folder, path, state = crafted(run_dir, tmp_path, f"crafted{i}")
        iterator = state["config"]["pipeline"]["stages"][0]["offpolicy_component"]
        iterator["data_iterator"]["path"] = str(target)
        iterator["data_iterator"]["generate"]["num_episodes"] = 10**8
        resign(path, state)
        with pytest.raises(Exception, match="never generates data"):  # (wrapped by Hydra)
            run.train(compose_cfg([*command, f"resume={folder}"]))
        assert dangling.is_symlink() and not (sentinel / "nowhere.npz").exists()
        assert file_hashes(sentinel) == before and not ours.exists()
    # The run's own data, typed again: the resume reads it and goes on.
    folder = copy_run(run_dir, tmp_path, "genuine")
    run.train(compose_cfg([*command, f"resume={folder}", f"{_EXPERT}.path={data}"]))
    assert load_checkpoint(latest_checkpoint(folder))["pipeline"]["total_steps"] >= 320


# -------------------------------------------------------------------- sizes (major 8)
def test_saved_sizes_are_the_command_s_and_a_run_s_shape_is_typed_again(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    config = state["config"]
    config["eval"].update(num_envs=10**6, num_episodes=10**6)
    config["valid"].update(num_envs=10**6, num_episodes=10**6, torch_threads=4096)
    config["torch_threads"] = 1000
    resign(path, state)
    cfg = compose_cfg([*SMOKE, f"resume={folder}"])
    start = plan_start(cfg, to_plain(cfg))
    start.close()
    plain = to_plain(cfg)
    for key in ("eval", "valid"):
        for size in ("num_envs", "num_episodes"):
            assert start.config[key][size] == plain[key][size]
    assert start.config["torch_threads"] == "auto"
    # Sizes that shape the run: the command's differ, so the resume says what to type.
    state["choices"]["sampler"] = "multiprocess"
    config["sampler"] = {**to_plain(compose_cfg([*SMOKE, "sampler=multiprocess"]))["sampler"],
                         "num_processes": 4096, "num_envs": 8}  # fmt: skip
    resign(path, state)
    with pytest.raises(ConfigError, match=r"sampler\.num_envs=8 sampler\.num_processes=4096"):
        plan_start(cfg, to_plain(cfg))


# ------------------------------------------------------------ amplification (major 7)
def test_a_long_string_shared_by_many_nodes_is_refused_by_its_total(
    smoke_run: Path, tmp_path: Path
) -> None:
    """~60 KB on disk (pickle stores a shared string once) would expand to 3 MB of config,
    and gigabytes in ``json.dumps`` with more nodes: refused by the characters budget."""
    folder, path, state = crafted(smoke_run, tmp_path)
    size = path.stat().st_size
    state["config"]["task"]["extra"] = ["x" * 60_000] * 50
    resign(path, state)
    assert path.stat().st_size < size + 70_000
    with pytest.raises(UntrustedCheckpointError, match=f"more than {MAX_CHARS:,} characters"):
        load_checkpoint(path)


# ----------------------------------------------------- recursion and capped reads (major 9)
def test_deep_nesting_and_huge_files_in_a_run_folder_are_named_or_skipped(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("task: " + "[" * 100_000)
    cfg = compose_cfg([f"run_dir={empty}", "test_expert=true", "num_episodes=1",
                       f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
    with pytest.raises(CheckpointError, match="nested too deeply"):
        run.evaluate(cfg)
    folder = copy_run(smoke_run, tmp_path)
    settings = {"num_episodes": 1, "episode_seed": 0}
    expert = folder / "expert.eval.json"
    beyond_a_float = '{"episodes": [], "metrics": {"success": 1' + "0" * 400 + "}}"
    for content in ("[" * 100_000, '{"episodes": 3, "metrics": []}', beyond_a_float):
        expert.write_text(content)
        assert load_expert_reference(folder, settings) is None
    with expert.open("wb") as f:  # a sparse 20 GiB file: never read whole
        f.truncate(20 * 2**30)
    assert load_expert_reference(folder, settings) is None
    assert "ignoring unreadable expert reference" in caplog.text
    with (folder / "metrics.jsonl").open("a") as f:
        f.write("[" * 100_000 + "\n" + '{"env_step": 1e999, "charts/success": 1}\n[1]\n')
    assert len(training_curve(folder / "metrics.jsonl")) == len(
        training_curve(smoke_run / "metrics.jsonl")
    )


def _merge_key_bomb(keys: int = 5_000, aliases: int = 10_000) -> str:
    """YAML of ~100 KB that ``yaml.safe_load`` expands to ``keys x aliases`` copies (minutes)."""
    anchor = ", ".join(f"k{i}: {i}" for i in range(keys))
    return f"a: &a {{{anchor}}}\nb: {{<<: [{', '.join(['*a'] * aliases)}]}}\n"


def test_yaml_aliases_in_a_run_folder_are_refused_at_once(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """A merge-key bomb as a run folder's ``config.yaml`` (``evaluate.py test_expert=true``)
    or a sweep job's ``.hydra/overrides.yaml`` (``python -m rl.compare``): refused at its first
    alias (Hydra writes none), not expanded."""
    from rl.evaluation.compare import read_run

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text(_merge_key_bomb())
    cfg = compose_cfg([f"run_dir={empty}", "test_expert=true", "num_episodes=1",
                       f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"config\.yaml: refused: an alias \(\*name\) at 2:"):
        run.evaluate(cfg)
    job = copy_run(smoke_run, tmp_path, "job")
    (job / ".hydra").mkdir(exist_ok=True)
    (job / ".hydra" / "overrides.yaml").write_text(_merge_key_bomb())
    found = read_run(job)
    assert found.overrides == [] and found.points  # its metrics are still read


# ------------------------------------------- major 10: the expert on a run without checkpoints
def test_expert_of_a_genuine_run_folder_without_checkpoints(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """A run folder as train.py leaves it before its first checkpoint: config.yaml and Hydra's
    own .hydra/hydra.yaml, which always holds interpolations (only its choices are read)."""
    folder = tmp_path / "young"
    (folder / ".hydra").mkdir(parents=True)
    composed = compose_cfg(SMOKE)
    (folder / "config.yaml").write_text((smoke_run / "config.yaml").read_text())
    OmegaConf.save(HydraConfig.instance().cfg, folder / ".hydra" / "hydra.yaml")
    assert "${" in (folder / ".hydra" / "hydra.yaml").read_text()
    assert composed.hydra.runtime.choices.task == "nav_small"
    cfg = compose_cfg([f"run_dir={folder}", "test_expert=true", "num_episodes=2", "num_envs=1",
                       f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
    metrics = run.evaluate(cfg)
    assert metrics["expert/success"] == 1.0
    assert json.loads((folder / "expert.eval.json").read_text())["settings"]["expert"] is True


# ----------------------------------------------- minor: a typed override, typed again on resume
def test_a_run_trained_with_typed_wrappers_resumes_when_they_are_typed_again(
    tmp_path: Path, compose_cfg: Any
) -> None:
    wrappers = "task.wrappers=[gymnasium.wrappers.RecordEpisodeStatistics]"
    command = ["+experiment=ppo_cartpole", "+debug=smoke", "eval.num_episodes=0", wrappers]
    run.train(compose_cfg(command))
    folder = tmp_path / "run"
    with pytest.raises(UntrustedCheckpointError, match=r"task\.wrappers\.0"):
        run.train(compose_cfg([*command[:-1], f"resume={folder}", "total_env_steps=384"]))
    run.train(compose_cfg([*command, f"resume={folder}", "total_env_steps=384"]))
    state = load_checkpoint(latest_checkpoint(folder))
    assert state["pipeline"]["total_steps"] >= 384
    assert state["config"]["task"]["wrappers"] == ["gymnasium.wrappers.RecordEpisodeStatistics"]
