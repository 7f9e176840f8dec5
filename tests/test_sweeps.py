"""Hydra multiruns through the real CLI: basic and joblib launchers, Optuna, a failing job that
does not stop the others, and the sweep objective's errors; the sweep folder layout (job folders
named by their overrides) and the SLURM preset as composed (the ``hydra`` node
``train.py ... --cfg hydra`` prints)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict, read_write
from wandb_records import read_run

from rl.engine.sweeps import (
    MAX_JOB_DIR_NAME,
    ObjectiveError,
    check_objective,
    job_dir_name,
    objective,
)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["+experiment=ppo_nav", "+debug=smoke"]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", **env}
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def job_dirs(sweep: Path) -> list[str]:
    """The names of a sweep folder's job folders, in job number order."""
    names = [p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(names, key=lambda name: int(name.split("_", 1)[0]))


def assert_complete_run(job_dir: Path) -> None:
    assert (job_dir / ".hydra" / "config.yaml").is_file()
    assert (job_dir / "config.yaml").is_file()
    assert (job_dir / "checkpoints" / "ckpt_stage00_step000000000256.pt").is_file()
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    assert '"env_step": 256' in lines[-1]


@pytest.mark.slow
def test_basic_multirun_two_seeds_two_folders_two_wandb_runs(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(
        "-m", *SMOKE, "seed=1,2", "logger=wandb", f"hydra.sweep.dir={sweep}", WANDB_MODE="offline"
    )
    assert proc.returncode == 0, proc.stderr
    # Named by the overrides (+debug and logger left out: they do not set a job apart).
    assert job_dirs(sweep) == ["0_+experiment:ppo_nav__seed:1", "1_+experiment:ppo_nav__seed:2"]
    for job, seed in zip(job_dirs(sweep), (1, 2), strict=True):
        assert_complete_run(sweep / job)
        assert yaml.safe_load((sweep / job / "config.yaml").read_text())["seed"] == seed
    # One wandb run per job (the previous one finished), grouped by sweep, tagged `sweep`.
    runs = [read_run(p) for p in sorted(sweep.glob("*/wandb/offline-run-*/run-*.wandb"))]
    assert len(runs) == 2
    assert runs[0].run.run_id != runs[1].run.run_id
    assert {r.run.run_group for r in runs} == {f"ppo_nav__sweep_{sweep.name}"}
    assert all("sweep" in r.run.tags for r in runs)
    assert [r.config["sweep_job"] for r in runs] == [0, 1]


def hydra_node(compose_cfg, *overrides: str) -> dict:
    """The composed ``hydra`` node, unresolved (as ``train.py <overrides> --cfg hydra`` prints
    it): composed in process, no subprocess start."""
    node = OmegaConf.to_container(compose_cfg(list(overrides)).hydra, resolve=False)
    assert isinstance(node, dict)
    return node


def test_default_sweep_dir_layout(compose_cfg) -> None:
    hydra_cfg = hydra_node(compose_cfg, "+experiment=ppo_nav")
    assert hydra_cfg["sweep"]["dir"] == "outputs/${exp_name}/multirun/${now:%Y-%m-%d_%H-%M-%S}"
    subdir = "${job_dir_name:${hydra.job.num},${hydra.job.override_dirname}}"
    assert hydra_cfg["sweep"]["subdir"] == subdir
    assert hydra_cfg["job"]["config"]["override_dirname"]["kv_sep"] == ":"
    assert hydra_cfg["job"]["config"]["override_dirname"]["item_sep"] == "__"
    assert hydra_cfg["job"]["chdir"] is False


def test_a_job_folder_is_named_by_its_overrides(compose_cfg) -> None:
    """As Hydra names a job: its overrides (the fixture adds output_dir=<a path>) with the
    excluded keys left out, ``/`` and ``=`` replaced, one folder below the sweep folder."""
    cfg = compose_cfg(["+experiment=ppo_nav", "+debug=smoke", "seed=3", "logger=wandb"])
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num = 12
    name = OmegaConf.select(cfg, "hydra.sweep.subdir")
    output_dir = str(cfg.output_dir).replace("/", "_")
    assert name == f"12_+experiment:ppo_nav__output_dir:{output_dir}__seed:3"
    # evaluate.py's sweeps name their (bookkeeping) folders the same way
    evaluate = compose_cfg(["ckpt=runs/a/ckpt.pt", "num_episodes=4"], config_name="evaluate")
    with read_write(evaluate.hydra), open_dict(evaluate.hydra):
        evaluate.hydra.job.num = 0
    assert OmegaConf.select(evaluate, "hydra.sweep.subdir") == (
        "0_ckpt:runs_a_ckpt.pt__num_episodes:4"
    )


@pytest.mark.parametrize(
    "overrides",
    [
        "resume:outputs/ppo_nav/2024-01-01_00-00-00__hydra/launcher:slurm",
        "model.hidden:[64,64]__name:'a b'__note:é\\x*?$|\"#!&;<>",
        "__".join(f"pipeline.named_losses.ppo.key_{i}:0.123456789012345" for i in range(40)),
        "x:" + "/" * 300,
        "é" * 300,
    ],
)
def test_any_overrides_give_one_valid_short_folder_name(tmp_path: Path, overrides: str) -> None:
    name = job_dir_name(7, overrides)
    assert name.startswith("7_")
    assert len(name.encode()) <= MAX_JOB_DIR_NAME <= 255
    assert name.isascii() and "/" not in name and "\x00" not in name
    (tmp_path / name).mkdir()  # one valid folder, directly in the sweep folder
    assert [p.name for p in tmp_path.iterdir()] == [name]
    # The job folder is a value `resume=` and `run_dir=` take unquoted.
    override = OverridesParser.create().parse_override(f"resume=outputs/x/multirun/t/{name}")
    assert override.value() == f"outputs/x/multirun/t/{name}"


def test_long_override_lists_differ_by_their_hash_and_short_ones_are_kept_whole() -> None:
    head = "__".join(f"pipeline.key_{i}:0.5" for i in range(40))
    a, b = job_dir_name(3, head + "__seed:1"), job_dir_name(3, head + "__seed:2")
    assert len(a) == len(b) == MAX_JOB_DIR_NAME and a != b
    assert a[:-8] == b[:-8] and a[-10:-8] == "__"
    assert job_dir_name(0, "") == "0"
    assert job_dir_name(10, "pipeline.optimizer.lr:0.001__seed:1") == (
        "10_pipeline.optimizer.lr:0.001__seed:1"
    )


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli("-m", *SMOKE, "seed=1,2", "hydra/launcher=joblib_local", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    assert job_dirs(sweep) == ["0_+experiment:ppo_nav__seed:1", "1_+experiment:ppo_nav__seed:2"]
    for job in job_dirs(sweep):
        assert_complete_run(sweep / job)


@pytest.mark.slow
def test_failing_job_does_not_stop_the_others(tmp_path: Path) -> None:
    # task.size=2 raises ValueError in the environment's constructor (job 0); job 1 must run.
    sweep = tmp_path / "sweep"
    proc = cli("-m", *SMOKE, "task.size=2,9", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1  # the sweep reports the failure at its end
    assert "size=2 is too small" in proc.stderr
    failed, done = (
        sweep / "0_+experiment:ppo_nav__task.size:2",
        sweep / "1_+experiment:ppo_nav__task.size:9",
    )
    assert_complete_run(done)
    log = (failed / "train.log").read_text()
    assert "job 0 (+experiment=ppo_nav +debug=smoke task.size=2) failed" in log
    assert "Traceback" in log and "size=2 is too small" in log
    assert not (failed / "checkpoints").exists()


@pytest.mark.slow
def test_optuna_sweep_two_trials_returns_the_objective(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli(
        *SMOKE,
        "+hparams_search=ppo_nav_optuna",  # turns on multirun by itself
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "Sampler: TPESampler" in proc.stdout + proc.stderr
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["name"] == "optuna"
    assert set(result["best_params"]) == {
        "pipeline.optimizer.lr",
        "pipeline.named_losses.ppo.entropy_coef",
        "pipeline.named_losses.ppo.clip_param",
        "pipeline.num_steps",
    }
    assert 0.0 <= result["best_value"] <= 1.0
    # The best value is a trial's final eval/success, as the trial's run logged it.
    finals = []
    jobs = job_dirs(sweep)
    assert [job.split("_", 1)[0] for job in jobs] == ["0", "1"]
    for job in jobs:
        # Each trial's folder: its parameters (+hparams_search and +debug left out), in full.
        overrides = yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
        named = sorted(o for o in overrides if not o.startswith(("+hparams_search", "+debug")))
        num = int(job.split("_", 1)[0])
        assert job == job_dir_name(num, "__".join(named).replace("=", ":"))
        assert "pipeline.optimizer.lr:" in job and len(job) < MAX_JOB_DIR_NAME  # not cut
        assert_complete_run(sweep / job)
        cfg = yaml.safe_load((sweep / job / "config.yaml").read_text())
        assert cfg["optimized_metric"] == "eval/success"
        last = (sweep / job / "metrics.jsonl").read_text().splitlines()[-1]
        finals.append(yaml.safe_load(last)["eval/success"])
    assert result["best_value"] == max(finals)


def test_slurm_launcher_preset_composes(compose_cfg) -> None:
    launcher = hydra_node(compose_cfg, "+experiment=ppo_nav", "hydra/launcher=slurm")["launcher"]
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert launcher["timeout_min"] > 0
    assert launcher["gpus_per_node"] == 1
    assert launcher["partition"] is None
    assert launcher["additional_parameters"]["signal"] == "USR1@120"


def test_objective_missing_from_the_run_is_a_clear_error(tmp_path: Path) -> None:
    proc = cli(*SMOKE, "optimized_metric=charts/nope", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1
    assert "optimized_metric='charts/nope' was never logged" in proc.stderr
    assert "charts/episodic_return" in proc.stderr  # the logged keys are listed


def test_objective_of_a_section_that_is_off_fails_before_training(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = cli(*SMOKE, "optimized_metric=valid/success", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 1
    assert "only logged with valid.enabled=true" in proc.stderr
    assert not (run_dir / "checkpoints").exists()


# ----------------------------------------------------------------------- in-process
def test_objective_helpers() -> None:
    assert objective({"eval/success": 0.5}, None) is None
    assert objective({"eval/success": 0.5}, "eval/success") == 0.5
    with pytest.raises(ObjectiveError, match="NaN"):
        objective({"eval/success": math.nan}, "eval/success")
    with pytest.raises(ObjectiveError, match="charts/a"):
        objective({"charts/a": 1.0}, "eval/success")
    check_objective({"optimized_metric": "eval/success", "eval": {"num_episodes": 4}})
    check_objective({"optimized_metric": "charts/success"})
    with pytest.raises(ObjectiveError, match="eval.num_episodes > 0"):
        check_objective({"optimized_metric": "eval/success", "eval": {"num_episodes": 0}})


def test_hparams_search_composes_on_the_experiment(compose_cfg, resolve_cfg) -> None:
    cfg = compose_cfg(["+experiment=ppo_nav", "+hparams_search=ppo_nav_optuna"])
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper")
    assert cfg.hydra.sweeper.direction == "maximize"
    assert cfg.hydra.sweeper.sampler._target_.endswith("TPESampler")
    plain = resolve_cfg(cfg)
    assert plain["optimized_metric"] == "eval/success"
    assert plain["eval"]["num_episodes"] > 0
    for key in cfg.hydra.sweeper.params:  # every searched key exists in the config
        node = plain
        for part in key.split("."):
            node = node[part]
