"""Crafted checkpoints and run folders never run code, write outside the run, or hang (issue 34).

Each test crafts one file or folder from a real smoke run, re-signed with the project's digest
(so it passes the archive, digest and ``weights_only`` checks, as an attacker's would), and
feeds it to ``evaluate``, ``resume=`` and ``InferenceAgent``. The fuzz test at the end draws
many such configs from the project's own callables, Hydra's resolvers, interpolations, nested
``_args_`` and links, and checks that a sentinel folder is byte-for-byte unchanged and that no
module the user's config does not name was imported.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from crafted import (
    MARKERS,
    SMOKE,
    copy_run,
    crafted,
    entries,
    file_hashes,
    make_sentinel,
    resign,
)
from hydra.core.hydra_config import HydraConfig

from rl.checkpoints import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from rl.checkpoints.errors import UntrustedCheckpointError
from rl.checkpoints.saved_config import MAX_NODES, config_data
from rl.collection.normalization import Normalizer, NormalizeSettings
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.loggers.base import RunContext
from rl.loggers.files import JsonlSink
from rl.utils.files import UnsafePathError
from rl.utils.finite import NonFiniteError

ROOT = Path(__file__).resolve().parent.parent


def _write_payload(target: Path) -> dict[str, Any]:
    return {
        "_target_": "pathlib.Path.write_text",
        "self": {"_target_": "pathlib.Path", "_args_": [str(target)]},
        "data": "written",
    }


# ------------------------------------------------------------ critical 1: interpolations
@pytest.mark.parametrize("escaped", [False, True])
@pytest.mark.parametrize("where", ["exp_name", "task.split", "model.extra"])
def test_interpolations_in_a_saved_config_are_never_resolved(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, where: str, escaped: bool
) -> None:
    created = tmp_path / "created-by-interpolation"
    value = (
        "${oc.create:{_target_: pathlib.Path.write_text, self: {_target_: pathlib.Path, "
        f"_args_: ['{created}']}}, data: written}}}}"
    )
    folder, path, state = crafted(smoke_run, tmp_path)
    node = state["config"]
    *parents, leaf = where.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = ("\\" if escaped else "") + value
    resign(path, state)
    for name, enter in entries(folder, compose_cfg, tmp_path / "eval"):
        with pytest.raises(CheckpointError, match="interpolation") as info:
            enter()
        assert where in str(info.value), name
        assert not created.exists(), name


def test_a_run_folder_config_yaml_is_data_too(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """test_expert reads a run folder's config.yaml when it has no checkpoint."""
    created = tmp_path / "created"
    folder = tmp_path / "copied"
    folder.mkdir()
    config = load_checkpoint(latest_checkpoint(smoke_run))["config"]
    import yaml

    for task in (
        {**config["task"], "split": "${oc.create:" + str(_write_payload(created)) + "}"},
        _write_payload(created),
    ):
        (folder / "config.yaml").write_text(yaml.safe_dump({**config, "task": task}))
        cfg = compose_cfg([f"run_dir={folder}", "test_expert=true", "num_episodes=1",
                           f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
        with pytest.raises(CheckpointError):
            run.evaluate(cfg)
        assert not created.exists()


# ---------------------------------------------------- critical 2 and 3: dispatchers, imports
@pytest.mark.parametrize(
    "task",
    [
        {"_target_": "rl.tasks.gym.resolve_wrapper", "path": "this.Nope"},
        {"_target_": "rl.collection.ray_runtime._set_env", "env": {"BASH_ENV": "$(touch x)"}},
        {
            "_target_": "rl.collection.hosts.ProcessHosts",
            "cls": {"_target_": "builtins.open", "_args_": ["victim", "w"]},
        },  # fmt: skip
        {"_target_": "gymnasium.make", "_args_": ["this:Nope-v0"]},
        {"_target_": "rl.tasks.make_gym_env", "env_id": "this:Nope-v0"},
        {
            "_target_": "rl_envs.pointnav.PointNavEnv",
            "_args_": [{"_target_": "builtins.open", "_args_": ["victim", "w"]}],
        },  # fmt: skip
    ],
    ids=["resolve_wrapper", "set_env", "ProcessHosts", "make_args", "module_id", "nested_args"],
)
def test_the_project_s_own_callables_and_gymnasium_ids_are_not_for_a_file_to_choose(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, task: dict[str, Any]
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    state["config"]["task"] = {**state["config"]["task"], **task}
    resign(path, state)
    environ = dict(os.environ)
    cwd = Path.cwd()
    for name, enter in entries(folder, compose_cfg, tmp_path / "eval"):
        with pytest.raises(UntrustedCheckpointError, match="task") as info:
            enter()
        assert "does not name" in str(info.value), name
    assert dict(os.environ) == environ
    assert not any(m in sys.modules for m in MARKERS)
    assert not (cwd / "victim").exists() and not (tmp_path / "victim").exists()


def test_a_gym_task_s_wrappers_and_env_id_come_from_the_tree(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    """A saved ``task=gym`` run: its env id and wrappers are the tree's, or trusted."""
    folder, path, state = crafted(smoke_run, tmp_path)
    state["choices"]["task"] = "gym"
    state["config"]["task"] = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1",
                               "wrappers": ["this.Wrapper"]}  # fmt: skip
    resign(path, state)
    with pytest.raises(UntrustedCheckpointError, match=r"task\.wrappers\.0"):
        InferenceAgent.from_checkpoint(path)
    assert "this" not in sys.modules


# --------------------------------------------------------- critical 5: links in a run folder
_LINKED = {
    "eval_summary.csv": "victim.csv",
    "eval_summary.json": "victim.txt",
    "eval_summary.png": "victim.png",
    "config.yaml": "victim.txt",
    "train.log": "victim.log",
    "metrics.jsonl": "victim.jsonl",
}


@pytest.mark.parametrize("lock_linked", [False, True])
def test_links_in_a_copied_run_folder_are_never_written_through(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, lock_linked: bool
) -> None:
    sentinel = make_sentinel(tmp_path)
    before = file_hashes(sentinel)
    folder = copy_run(smoke_run, tmp_path)
    links = {**_LINKED, **({".lock": "victim.txt"} if lock_linked else {})}
    for name, victim in links.items():
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(sentinel / victim)
    evaluate = ["num_episodes=1", "num_envs=1", "progress_bar=false", f"run_dir={folder}",
                f"output_dir={tmp_path / 'e'}"]  # fmt: skip
    for enter in (
        lambda: run.evaluate(compose_cfg(evaluate, "evaluate")),
        lambda: run.train(compose_cfg([*SMOKE, f"resume={folder}", "total_env_steps=384"])),
    ):
        try:
            enter()
        except (UnsafePathError, CheckpointError) as e:  # refused by name: fine
            assert str(folder) in str(e)
        except Exception as e:  # noqa: BLE001  (a ConfigError for metrics.jsonl's link)
            assert "symbolic link" in str(e), e
        assert file_hashes(sentinel) == before
    if not lock_linked:  # evaluate ran: its summaries replaced the links, not the victims
        assert (folder / "eval_summary.csv").is_file()
        assert not (folder / "eval_summary.csv").is_symlink()


# ------------------------------------------------------- majors: bounded, named refusals
def test_configs_of_shared_references_loops_and_aliases_are_refused_at_once(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    shared: list[Any] = ["leaf"]
    for _ in range(12):  # 8**12 paths from 12 lists: the file is a few KB
        shared = [shared] * 8
    state["config"]["task"]["extra"] = shared
    resign(path, state)
    with pytest.raises(CheckpointError, match=f"more than {MAX_NODES:,} nodes"):
        load_checkpoint(path)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(CheckpointError, match="contains itself"):
        config_data({"task": {"x": loop}}, "crafted")
    # A YAML "billion laughs" of 1 KB as a copied run's config.yaml (test_expert reads it).
    laughs = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        laughs.append(f"{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]")
    laughs.append("task: *i")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("\n".join(laughs))
    cfg = compose_cfg([f"run_dir={empty}", "test_expert=true", "num_episodes=1",
                       f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"config\.yaml: refused: an alias \(\*name\) at 2:"):
        run.evaluate(cfg)  # (at its first alias: Hydra writes none)


def test_a_crafted_training_state_is_a_named_error(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    for damage, match in [
        (lambda s: s.pop("pipeline"), "'pipeline' entry is missing"),
        (lambda s: s.__setitem__("rng", {"python": [1, 2], "numpy": "x"}), "does not fit"),
    ]:
        folder, path, state = crafted(smoke_run, tmp_path, f"crafted{id(damage)}")
        damage(state)
        resign(path, state)
        with pytest.raises(CheckpointError, match=match):
            run.train(compose_cfg([*SMOKE, f"resume={folder}", "total_env_steps=384"]))
    state["format_version"] = 99  # from newer code: refused by name (a run folder skips it)
    resign(path, state)
    with pytest.raises(CheckpointError, match="checkpoint format 99; this code reads formats 2"):
        load_checkpoint(path)


def test_non_finite_normaliser_statistics_are_an_error_and_never_saved(tmp_path: Path) -> None:
    import gymnasium as gym
    import numpy as np

    space = gym.spaces.Dict({"x": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)})
    settings = NormalizeSettings(observations=True, rewards=False, clip=10, gamma=0.99,
                                 epsilon=1e-8)  # fmt: skip
    normalizer = Normalizer(space, settings)
    normalizer.record_observations({"x": torch.full((4, 2), 1e200, dtype=torch.float64)})
    with pytest.raises(NonFiniteError, match="observation 'x'"):
        normalizer.commit()
    state = {"model": {}, "config": {}, "normalizer": {"obs": {"x": {"var": torch.tensor([
        float("nan")])}}}}  # fmt: skip
    with pytest.raises(NonFiniteError, match="normalizer"):
        save_checkpoint(tmp_path, state, 0, 1)
    assert not list(tmp_path.rglob("*.pt"))


def test_a_full_disk_on_metrics_jsonl_is_said_as_such(tmp_path: Path) -> None:
    context = RunContext(tmp_path, {}, "x", "task", 1, 1, "run")
    sink = JsonlSink(context=context)
    sink.file._file.close()
    sink.file._file = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115  (the kernel's ENOSPC)
    with pytest.raises(
        OSError, match=r"cannot write metrics file .*metrics\.jsonl: the disk is full"
    ):
        sink.log(1, {"a": 1.0})
    sink.close()


def test_the_cli_reports_a_full_disk_as_its_message_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``train.py`` and ``evaluate.py`` run their work in (in process: the exit and stderr
    are the command's; a single run, not a job of a multirun that an earlier test composed)."""
    import errno

    from rl.engine.cli import config_errors_reported

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    with pytest.raises(SystemExit) as exited, config_errors_reported():
        raise OSError(errno.ENOSPC, "cannot write x: the disk is full")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == "error: cannot write x: the disk is full"
    # A run folder's file the user may not open (a copied run's .lock of mode 000, for one):
    # named, as os.open names it (the suite may run as root, whom permission bits never stop).
    with pytest.raises(SystemExit) as exited, config_errors_reported():
        raise PermissionError(errno.EACCES, "Permission denied", "/runs/x/.lock")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == "error: Permission denied: /runs/x/.lock"


# --------------------------------------------------------------------------- the fuzz test
def _fuzz_call(rng: random.Random, sentinel: Path) -> Any:
    """Code: a call, a dispatcher, an interpolation, nested ``_args_``."""
    victim = str(sentinel / rng.choice(["victim.txt", "victim.csv", "new.txt"]))
    calls = [
        _write_payload(Path(victim)),
        {"_target_": "builtins.open", "_args_": [victim, "w"]},
        {"_target_": "shutil.rmtree", "_args_": [str(sentinel)]},
        {"_target_": "os.remove", "path": victim},
        {"_target_": "rl.tasks.gym.resolve_wrapper", "path": f"{rng.choice(MARKERS)}.X"},
        {"_target_": "rl.collection.ray_runtime._set_env", "env": {"BROWSER": "/bin/sh"}},
        {"_target_": "importlib.import_module", "_args_": [rng.choice(MARKERS)]},
        {"_target_": "gymnasium.make", "_args_": [f"{rng.choice(MARKERS)}:X-v0"]},
        {"_target_": "rl.storage.generate_expert_trajectories", "path": victim},
        {"_target_": "rl.checkpoints.files.save_checkpoint", "run_dir": str(sentinel)},
        {
            "_target_": "hydra.utils.instantiate",
            "config": {"_target_": "os.remove", "path": victim},
        },  # fmt: skip
    ]
    call = rng.choice(calls)
    kind = rng.randrange(5)
    if kind == 0:
        return call
    if kind == 1:
        return {"_target_": "rl_envs.pointnav.PointNavEnv", "_args_": [call]}
    if kind == 2:
        resolver = rng.choice(["oc.create", "oc.decode", "oc.env", "oc.select", "oc.dict.keys"])
        return ("\\" * rng.randrange(2)) + f"${{{resolver}:{call}}}"
    if kind == 3:
        return [rng.choice(["a", 1, None]), call]
    return {"nested": {"deeper": call}}


_GYM_TASK = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1", "env_kwargs": {},
             "wrappers": [], "observations": []}  # fmt: skip


def _choose(group: str, options: list[str], chance: float = 0.5) -> Any:
    """A case's preparation: switch the run's ``group`` choice to one of ``options``."""

    def prepare(rng: random.Random, state: dict[str, Any]) -> None:
        if rng.random() < chance:
            state["choices"][group] = rng.choice(options)
            if state["choices"].get("task") == "gym":
                state["config"]["task"] = dict(_GYM_TASK)

    return prepare


def _fuzz_families(port: int) -> dict[str, tuple[list[str], Any, Any]]:
    """Vector families (issues 34 and 52): where each is put, a payload maker
    ``(rng, sentinel, state)``, and a preparation of the case (the run's group choices, so
    that the user's tree reads the place)."""
    marker = lambda rng: f"{rng.choice(MARKERS)}.X"  # noqa: E731

    def expert_data(rng: random.Random, sentinel: Path, state: dict[str, Any]) -> Any:
        return {"_target_": "rl.pipeline.OffPolicyPipelineComponent", "loss_names": ["ppo"],
                "data_iterator": {"_target_": "rl.storage.ExpertTrajectoryIterator",
                                  "path": str(sentinel / "new.npz"),
                                  "generate": {"task": state["config"]["task"],
                                               "num_episodes": 2, "seed": 0}}}  # fmt: skip

    return {
        "code": (
            [
                "task",
                "task._target_",
                "task.extra",
                "model",
                "model.extra",
                "pipeline",
                "pipeline.named_losses.ppo",
                "pipeline.optimizer",
                "logger.sinks.jsonl",
                "logger.sinks.extra",
                "collector",
                "sampler",
                "exp_name",
                "task.observations",
                "task.wrappers",
                "eval",
                "normalize",
            ],
            lambda rng, sentinel, _: _fuzz_call(rng, sentinel),
            _choose("model", ["mlp", "nav3d_cnn_gru"], 0.3),
        ),  # fmt: skip
        "kinds": (  # a mapping or a string where the tree has a list or a mapping
            [
                "task.wrappers",
                "task.observations",
                "callbacks",
                "tags",
                "pipeline.stages",
                "task",
                "model",
                "logger.sinks",
                "task.wrappers",
                "task.wrappers",
            ],
            lambda rng, *_: rng.choice(
                [{marker(rng): 1}, {marker(rng): 1}, marker(rng), [{marker(rng): [1]}]]
            ),
            _choose("task", ["gym"]),
        ),  # fmt: skip
        "addresses": (
            [
                "collector.address",
                "collector.allow_unauthenticated",
                "task.host",
                "task.url",
                "model.endpoint",
                "task.port",
            ],
            lambda rng, *_: rng.choice(
                [
                    f"ray://127.0.0.1:{port}",
                    f"127.0.0.1:{port}",
                    port,
                    True,
                    f"http://127.0.0.1:{port}/",
                ]
            ),
            _choose("logger", ["wandb"]),
        ),  # fmt: skip
        "paths": (
            [
                "pipeline.stages.0.offpolicy_component",
                "logger.sinks.jsonl.filename",
                "output_dir",
                "logger.sinks.tensorboard",
                "pipeline.stages.0.offpolicy_component",
            ],
            lambda rng, sentinel, state: rng.choice(
                [
                    expert_data(rng, sentinel, state),
                    expert_data(rng, sentinel, state),
                    str(sentinel / "victim.jsonl"),
                    "../../sentinel/victim.jsonl",
                    {
                        "_target_": "rl.loggers.TensorBoardSink",
                        "_partial_": True,
                        "subdir": str(sentinel),
                    },
                ]
            ),
            lambda rng, state: (
                _choose("pipeline", ["bc_offline_ppo"], 1)(rng, state),
                _choose("logger", ["tensorboard"])(rng, state),
            ),
        ),  # fmt: skip
        "amplification": (
            ["task.extra", "model.extra", "tags"],
            lambda rng, *_: ["x" * 60_000] * rng.choice([20, 200]),
            _choose("task", ["nav"], 0),
        ),  # fmt: skip
        "sizes": (
            [
                "eval.num_envs",
                "eval.num_episodes",
                "valid.num_envs",
                "valid.num_episodes",
                "sampler.num_envs",
                "torch_threads",
                "valid.torch_threads",
                "valid.enabled",
            ],
            lambda rng, *_: rng.choice([10**6, 4096, 10**9, True]),
            _choose("sampler", ["multiprocess"]),
        ),  # fmt: skip
        "links": ([], None, _choose("task", ["nav"], 0)),  # (links to files and folders)
    }


# Connections the process opens while a fuzz case runs (an audit hook: nothing is patched).
_CONNECTS: list[Any] = []


def _record_connects(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        _CONNECTS.append(args[1])


@pytest.mark.timeout(600)
def test_fuzz_crafted_checkpoints_and_folders_change_nothing_outside(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    rng = random.Random(52)
    sentinel = make_sentinel(tmp_path)
    (sentinel / "folder").mkdir()
    before, environ = file_hashes(sentinel), dict(os.environ)
    server = socket.create_server(("127.0.0.1", 0))  # where a crafted address points
    port = server.getsockname()[1]
    server.setblocking(False)
    sys.addaudithook(_record_connects)  # (stays: it only appends to a list)
    families = _fuzz_families(port)
    # Every case is crafted at the same paths (the previous case's folders removed first), so
    # the commands typed for it are the same strings each time: each distinct command is
    # composed once and each use gets a fresh copy of it, installed as compose_cfg installs one.
    composed: dict[tuple[Any, ...], Any] = {}

    def compose_once(
        overrides: Any = (), config_name: str = "train", set_output_dir: bool = True
    ) -> Any:
        key = (tuple(overrides), config_name, set_output_dir)
        if key not in composed:
            composed[key] = compose_cfg(overrides, config_name, set_output_dir)
        cfg = copy.deepcopy(composed[key])
        HydraConfig.instance().set_config(cfg)
        return cfg

    tried = 0
    for i in range(21):
        for leftover in ("fuzz", "eval"):
            shutil.rmtree(tmp_path / leftover, ignore_errors=True)
        folder, path, state = crafted(smoke_run, tmp_path, "fuzz")
        family = sorted(families)[i % len(families)]  # (each family in 3 cases)
        places, make, prepare = families[family]
        prepare(rng, state)
        for _ in range(rng.randrange(1, 4) if places else 0):
            node, *rest = rng.choice(places).split(".")
            parent, key = state["config"], node
            for part in rest:
                child = parent.get(key) if isinstance(parent, dict) else None
                if isinstance(child, list) and part.isdigit() and int(part) < len(child):
                    parent, key = child, int(part)
                    continue
                parent = parent.setdefault(key, {}) if isinstance(child, dict) else {}
                key = part
            parent[key] = make(rng, sentinel, state)
        resign(path, state)
        if family == "links":  # into the sentinel, where the run writes files and folders
            for name in rng.sample(sorted(_LINKED), 3):
                (folder / name).unlink(missing_ok=True)
                (folder / name).symlink_to(sentinel / _LINKED[name])
            for name in rng.sample(["videos", "wandb", "tensorboard"], 2):
                (folder / name).symlink_to(sentinel / "folder", target_is_directory=True)
        del _CONNECTS[:]
        # (where the run writes or sizes matter, the resume goes on for one more rollout)
        more = ("total_env_steps=320",) if family in ("links", "sizes") else ()
        ways = entries(folder, compose_once, tmp_path / "eval", more)
        for _name, enter in ways:
            tried += 1
            try:
                enter()
            except Exception:  # noqa: BLE001, S112  (refusals are expected; effects are not)
                pass
            what = f"case {i} ({family}): {_name}"
            assert file_hashes(sentinel) == before, what
            assert dict(os.environ) == environ, what
            assert not [m for m in MARKERS if m in sys.modules], what
            assert not [a for a in _CONNECTS if str(port) in str(a)], what
    with pytest.raises(BlockingIOError):
        server.accept()  # nobody connected
    server.close()
    assert tried == 84
    assert len(composed) == 4  # (3 entries; the resume with and without one more rollout)


@pytest.mark.parametrize(
    "override, key",
    [
        ("sampler.num_envs=100000", "sampler.num_envs"),
        ("sampler.num_envs=null", "sampler.num_envs"),
        ("seed=1180591620717411303424", "seed"),
        ("torch_threads=100000", "torch_threads"),
        ("sampler.timeout=0", "sampler.timeout"),
        ("sampler.timeout=-1", "sampler.timeout"),
    ],
)
def test_out_of_range_settings_are_refused_before_anything_starts(
    compose_cfg: Any, override: str, key: str
) -> None:
    from rl.utils.config import ConfigError

    sampler = ["sampler=multiprocess"] if "timeout" in override else []
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        run.train(compose_cfg([*SMOKE, *sampler, override]))


def test_garbage_normaliser_statistics_are_named_as_such(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any
) -> None:
    folder, path, state = crafted(smoke_run, tmp_path)
    state["normalizer"] = {"settings": {"observations": True}, "obs": "garbage", "return": 3}
    resign(path, state)
    with pytest.raises(CheckpointError, match="normalisation statistics are malformed"):
        InferenceAgent.from_checkpoint(path)
    cfg = compose_cfg([f"ckpt={path}", "num_episodes=1", f"output_dir={tmp_path / 'e'}"],
                      "evaluate")  # fmt: skip
    with pytest.raises(CheckpointError, match="normalisation statistics are malformed"):
        run.evaluate(cfg)


@pytest.mark.timeout(180)
def test_a_nan_reward_with_process_workers_and_multiprocess_samplers_is_named(
    compose_cfg: Any,
) -> None:
    """collector=process sampler=multiprocess: the first worker's error names the value
    (the issue saw "the sampler is closed"; not reproduced here, pinned by this test)."""
    from rl.utils.seeding import env_seeds

    seed = env_seeds(4, 1)[2]
    task = ("+task={_target_: rl_envs.toys.debug.FaultyEnv, mode: nan_reward, fail_at_step: 3, "
            f"fail_seed: {seed}, max_steps: 10}}")  # fmt: skip
    workers = ["collector=process", "collector.num_workers=2", "sampler=multiprocess",
               "sampler.num_processes=2", "sampler.num_envs=4"]  # fmt: skip
    cfg = compose_cfg(
        [
            "+experiment=ppo_cartpole",
            "+debug=smoke",
            "~task",
            task,
            *workers,
            "eval.num_episodes=0",
        ]
    )
    with pytest.raises(Exception) as info:
        run.train(cfg)
    assert "environment 2 returned a non-finite reward (nan)" in str(info.value)
    assert "sampler is closed" not in str(info.value)


def test_the_rebuild_composes_every_saved_choice_in_the_order_typed() -> None:
    """An experiment that overrides a group the run set back to its default, and appended
    groups in the order typed (``+debug=smoke`` after ``+experiment=``: its budget wins)."""
    from rl.checkpoints.saved_config import ConfigTree

    choices = {"experiment": "ppo_nav3d", "debug": "smoke", "task": "nav", "local": "default"}
    raw, used = ConfigTree().compose(choices, "test")
    assert used["task"] == "nav" and raw["task"]["_target_"] == "rl_envs.pointnav.PointNavEnv"
    assert raw["total_env_steps"] == 256  # smoke's, applied after ppo_nav3d's
    with pytest.raises(CheckpointError, match="task=nowhere, which your config tree has no"):
        ConfigTree().compose({"task": "nowhere"}, "test")


def test_a_refused_collector_config_leaves_no_run_folder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "+experiment=ppo_nav", "+debug=smoke", "collector=process",
         "collector.num_workers=0", f"hydra.run.dir={folder}"],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    assert proc.returncode == 1
    assert "collector.num_workers: must be >= 1, got 0" in proc.stderr
    assert not folder.exists()
