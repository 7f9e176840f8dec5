"""Shared fixtures: composing the Hydra configs of conf/ exactly as train.py does."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import warm_cli
from hydra import compose, initialize
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

os.environ.setdefault("WANDB_MODE", "disabled")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

ComposeFn = Callable[..., DictConfig]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed-offset",
        type=int,
        default=0,
        metavar="K",
        help="add K to every test's seeds: a composed train config's seed, its evaluation's "
        "action seed and episode list, and the seeds of tests that take the seed_offset "
        "fixture. Learning tests must pass for K = 0, 1 and 2: pytest -m learning --seed-offset 1",
    )
    parser.addoption(
        "--cpu-per-test",
        default=None,
        metavar="FILE",
        help="append each test's CPU seconds to FILE (JSON lines: id, cpu, wall): the machine's "
        "busy time while it ran, so its subprocesses, Ray's daemons and forked children count "
        "(and so would other load: run it on an idle machine). One test process only: "
        "make test ARGS='-n 0 --cpu-per-test cpu.jsonl'",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    offset = config.getoption("--seed-offset")
    return f"seed offset: {offset} (every test's seeds are shifted by it)" if offset else None


def _busy_cpu_seconds() -> float:
    """CPU seconds the machine's cores have spent working (user, nice, system, IRQ, soft IRQ):
    not idle, not waiting for I/O, not stolen by a hypervisor for other machines."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def pytest_configure(config: pytest.Config) -> None:
    # The suite's train.py and evaluate.py command lines fork a warm interpreter instead of
    # starting one (tests/warm_cli.py: what that keeps and changes; RL_TEST_COLD_CLI=1: off).
    warm_cli.install()
    path = config.getoption("--cpu-per-test")
    if path is None:
        return
    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(
            "--cpu-per-test counts the machine's busy time: it needs one test process "
            "(-n 0), not several sharing the count"
        )
    if not os.path.exists("/proc/stat"):
        raise pytest.UsageError("--cpu-per-test reads /proc/stat (Linux only)")
    config.pluginmanager.register(_CpuPerTest(Path(path)), "cpu_per_test")


def pytest_unconfigure(config: pytest.Config) -> None:
    warm_cli.uninstall()


@pytest.fixture(scope="session", autouse=True)
def _warm_interpreter() -> None:
    """Start this test process's warm interpreter with its first test: it imports meanwhile."""
    warm_cli.start()


@pytest.fixture(autouse=True)
def _cold_cli(request: pytest.FixtureRequest) -> Iterator[None]:
    """``@pytest.mark.cold_cli``: the test's command lines start real interpreters."""
    if request.node.get_closest_marker("cold_cli") is None:
        yield
        return
    with warm_cli.cold():
        yield


class _CpuPerTest:
    """``--cpu-per-test``: each test's busy CPU seconds and wall seconds, as JSON lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        import json
        import time

        busy, start = _busy_cpu_seconds(), time.monotonic()
        yield
        record = {
            "id": item.nodeid,
            "cpu": round(_busy_cpu_seconds() - busy, 2),
            "wall": round(time.monotonic() - start, 2),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.fixture(scope="session")
def seed_offset(request: pytest.FixtureRequest) -> int:
    """``--seed-offset K``: what a test adds to each seed it sets itself (0 by default)."""
    return int(request.config.getoption("--seed-offset"))


# Evaluation episode lists of two offsets do not overlap (eval.num_episodes is at most 200 here).
EPISODE_SEED_STRIDE = 100_000


@pytest.fixture
def compose_cfg(tmp_path: Path, seed_offset: int) -> Iterator[ComposeFn]:
    """Compose a config of conf/ with overrides (run folder redirected to ``tmp_path``).

    ``${hydra:...}`` interpolations resolve because the composed ``hydra`` node is installed
    as the current HydraConfig. ``output_dir`` is only overridden for ``train``-like configs.
    With ``--seed-offset K``, a ``train`` config's ``seed`` and ``eval.action_seed`` are shifted
    by K (after the test's own overrides) and its evaluation episodes by K lists.
    """

    def _compose(
        overrides: Sequence[str] = (), config_name: str = "train", set_output_dir: bool = True
    ) -> DictConfig:
        overrides = list(overrides)
        if set_output_dir and config_name == "train":
            overrides.append(f"output_dir={tmp_path / 'run'}")
        GlobalHydra.instance().clear()
        with initialize(version_base="1.3", config_path="../conf"):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        if seed_offset and config_name == "train":
            with open_dict(cfg):
                cfg.seed = cfg.seed + seed_offset
                cfg.eval.action_seed = cfg.eval.action_seed + seed_offset
                cfg.eval.episode_seed = cfg.eval.episode_seed + EPISODE_SEED_STRIDE * seed_offset
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


def _resolve_without_hydra(cfg: DictConfig) -> dict[str, Any]:
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(plain, dict)
    return plain


@pytest.fixture
def resolve_cfg() -> Callable[[DictConfig], dict[str, Any]]:
    """Fully resolve a composed config, minus its ``hydra`` node (raises on ``???``)."""
    return _resolve_without_hydra


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[Any]:
    """One small private Ray instance shared by the tests that use collection workers.

    Started as ``collector=ray`` starts its own (loopback only, token authentication:
    :func:`rl.collection.ray_runtime.init_ray`). Collectors built while it runs use it and
    leave it running; it is shut down (by this handle, with everything it started, and the
    environment it changed restored) at the end of the session.
    """
    import logging

    import ray

    from rl.collection.ray_runtime import init_ray

    runtime = init_ray(address=None, num_cpus=2, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        runtime.shutdown()


# The longest files, longest first (test-seconds per file of a full run on 2 cores). With
# `--dist loadfile --no-loadscope-reorder` a file runs whole on one test process and the
# processes take files in the collected order, so starting with the long ones keeps one from
# running alone at the end.
LONGEST_FILES = (
    "test_bench.py",
    "test_collection_workers.py",
    "test_learning_workers.py",
    "test_untrusted_runs.py",
    "test_learning.py",
    "test_auxiliary_losses.py",
    "test_distributed.py",
    "test_spaces.py",
    "test_sweeps.py",
    "test_faults_collection.py",
    "test_experiment_smoke.py",
    "test_learners_by_workers.py",
    "test_resume.py",
    "test_cli.py",
    "test_nav3d_task.py",
    "test_export.py",
    "test_ray_security.py",
    "test_multiprocess_sampler.py",
    "test_open_core.py",
    "test_stages.py",
    "test_configs.py",
    "test_run_lock.py",
    "test_docs_examples.py",
    "test_checkpoint_trust.py",
    "test_wandb.py",
)


def _schedule_key(item: pytest.Item) -> tuple[int, bool]:
    name = item.path.name
    rank = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
    return rank, "ray_instance" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first; within a file, the tests on the shared Ray instance last."""
    items.sort(key=_schedule_key)


# The overrides of the shared smoke run (a tiny PointNav PPO run, two checkpoints).
SMOKE_RUN = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0"]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real smoke run's folder (checkpoints at 128 and 256 env steps), trained once per
    worker: tests that change it work on a copy."""
    from rl.engine import run

    folder = tmp_path_factory.mktemp("smoke") / "run"
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path="../conf"):
        cfg = compose("train", [*SMOKE_RUN, f"output_dir={folder}"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    run.train(cfg)
    GlobalHydra.instance().clear()
    return folder
