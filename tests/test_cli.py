"""The real command lines, as subprocesses: train.py, evaluate.py, wandb offline, bad configs."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rl.engine.run
from rl.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", **env}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def train(tmp_path: Path, *overrides: str, **env: str) -> tuple[Path, subprocess.CompletedProcess]:
    run_dir = tmp_path / "run"
    proc = run(
        [
            "train.py",
            "+experiment=ppo_nav",
            "+debug=smoke",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        tmp_path,
        **env,
    )
    return run_dir, proc


def test_train_then_evaluate(tmp_path: Path) -> None:
    run_dir, proc = train(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "success" in proc.stderr  # the summary line
    # Piped (not a terminal): the line carries the elapsed time and an ETA, and train.log has
    # every summary line and the code's commit, which git.json records for the run.
    summaries = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert summaries and all(" | elapsed " in s and " | eta " in s for s in summaries)
    train_log = (run_dir / "train.log").read_text(encoding="utf-8")
    assert summaries[0].split(" | elapsed ")[0] in train_log
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    code = json.loads((run_dir / "git.json").read_text())
    assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)
    assert f"code: git commit {code['commit']}" in train_log
    # episodes.csv: a row per finished training episode; each log point's return mean and
    # spread are those of its rows.
    with (run_dir / "episodes.csv").open() as f:
        episodes = list(csv.DictReader(f))
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    points = [r for r in logged if "charts/episodic_return" in r]
    assert points and episodes and episodes[0].keys() >= {"env_step", "episodic_return"}
    for point in points:
        returns = [float(e["episodic_return"]) for e in episodes
                   if int(e["env_step"]) == point["env_step"]]  # fmt: skip
        assert point["charts/episodic_return"] == pytest.approx(statistics.fmean(returns))
        assert point["charts/episodic_return_std"] == pytest.approx(statistics.pstdev(returns))
        assert point["charts/episodic_return_min"] == min(returns)
        assert point["charts/episodic_return_max"] == max(returns)
    # The run folder: Hydra's config, the resolved config, checkpoints, metrics, evaluation.
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "config.yaml").is_file()
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert [c.name for c in ckpts] == [
        "ckpt_stage00_step000000000128.pt",
        "ckpt_stage00_step000000000256.pt",
    ]
    assert (run_dir / "checkpoints" / "latest").read_text() == ckpts[-1].name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_step"] for r in records[:4]] == [64, 128, 192, 256]
    keys = set().union(*records)
    for key in (
        "charts/SPS",
        "charts/learning_rate",
        "pipeline/stage",
        "losses/ppo/policy_loss",
        "losses/ppo/value_loss",
        "losses/ppo/entropy",
        "losses/ppo/approx_kl",
        "losses/ppo/clipfrac",
        "losses/ppo/explained_variance",
        "losses/grad_norm",
        "eval/success",
        "eval/spl",
    ):
        assert key in keys, key
    final_eval = json.loads(ckpts[-1].with_suffix(".eval.json").read_text())
    assert len(final_eval["episodes"]) == 4

    # evaluate.py on the run folder (every checkpoint), argmax actions.
    proc = run(
        [
            "evaluate.py",
            f"run_dir={run_dir}",
            "num_episodes=6",
            "deterministic=true",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "success" in proc.stdout  # the summary table
    assert (run_dir / "eval_summary.csv").is_file()
    kept = json.loads(ckpts[-1].with_suffix(".eval.json").read_text())  # training's, apart
    (written,) = ckpts[-1].parent.glob(f"{ckpts[-1].stem}.eval.test-6ep-argmax-*.json")
    result = json.loads(written.read_text())
    assert kept == final_eval  # not replaced by evaluate.py's 6 episodes
    assert [e["episode_seed"] for e in result["episodes"]] == list(range(1_000_000, 1_000_006))
    assert set(result["metrics"]) >= {"success", "spl", "return", "length", "final_distance"}

    assert result["settings"]["deterministic"] is True

    # The newest checkpoint through the run's `latest` pointer, sampled actions: the same seeds
    # give the same result twice (one file: the same settings); Hydra's folder is not kept.
    outs = []
    for i in range(2):
        proc = run(
            [
                "evaluate.py",
                f"ckpt={run_dir / 'checkpoints' / 'latest'}",
                "num_episodes=5",
                f"hydra.run.dir={tmp_path / f'eval{i}'}",
            ],
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        (written,) = ckpts[-1].parent.glob(f"{ckpts[-1].stem}.eval.test-5ep-sampled-*.json")
        outs.append(json.loads(written.read_text())["episodes"])
        assert not (tmp_path / f"eval{i}").exists()
    assert outs[0] == outs[1]
    assert len(list(ckpts[-1].parent.glob(f"{ckpts[-1].stem}.eval*.json"))) == 3


def test_wandb_offline_run_file_holds_metrics_and_config(tmp_path: Path) -> None:
    run_dir, proc = train(tmp_path, "logger=wandb", WANDB_MODE="offline")
    assert proc.returncode == 0, proc.stderr
    files = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, list(run_dir.rglob("*"))
    data = files[0].read_bytes()
    for key in (
        b"charts/episodic_return",
        b"losses/ppo/policy_loss",
        b"charts/SPS",
        b"eval/success",
        b"global_step",
    ):
        assert key in data, key
    for key in (b"exp_name", b"task_id", b"pipeline.num_steps", b"model.rnn"):
        assert key in data, key


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("pipeline.num_steps=abc", "pipeline.num_steps"),
        ("+pipeline.named_losses.ppo.clip=0.3", "pipeline.named_losses.ppo.clip"),
        ("+pipeline.optimizer.lrr=8", "pipeline.optimizer.lrr"),
        ("pipeline.stages.0.loss_names=[nope]", "pipeline.stages.0.loss_names"),
        ("pipeline.num_mini_batch=64", "num_mini_batch"),
        ("pipeline.optimizer.lr=fast", "pipeline.optimizer.lr: expected a number, got 'fast'"),
        ("model.rnn=transformer", "model.rnn: expected one of gru, lstm, got 'transformer'"),
        (  # an auxiliary loss reading a feature the policy lacks: found when it is bound
            "pipeline=ppo_aux pipeline.named_losses.inverse_dynamics.feature=visul",
            "pipeline.named_losses.inverse_dynamics: InverseDynamicsLoss: feature='visul'",
        ),
        (  # a task whose observations hold text: found when the task is built, still no folder
            "task=gym task.env_id=MiniGrid-Empty-5x5-v0 model=mlp",
            "observation entry 'mission' is MissionSpace",
        ),
    ],
)
def test_bad_config_fails_before_training(
    tmp_path: Path, override: str, named: str, compose_cfg: Any
) -> None:
    """Refused before anything starts, naming the key, and no run folder written (in process:
    what ``train.py`` runs; its report of the refusal is the next test's)."""
    cfg = compose_cfg(["+experiment=ppo_nav", "+debug=smoke", *override.split()])
    with pytest.raises(ConfigError) as refused:
        rl.engine.run.train(cfg)
    assert named in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_train_py_reports_a_refused_config_alone(tmp_path: Path) -> None:
    """``train.py``: the message alone on stderr (no traceback), exit 1, no run folder left."""
    run_dir, proc = train(tmp_path, "model.rnn=transformer")
    assert proc.returncode == 1
    assert "model.rnn: expected one of gru, lstm, got 'transformer'" in proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()


def test_unknown_key_is_rejected_by_hydra(tmp_path: Path) -> None:
    _, proc = train(tmp_path, "pipeline.optimizer.lrr=8")
    assert proc.returncode != 0
    assert "Key 'lrr' is not in struct" in proc.stderr
    assert "+pipeline.optimizer.lrr=8" in proc.stderr  # the hint that `+` adds a key
    # ... and with the `+`, the check names the key the optimizer does not accept
    # (test_bad_config_fails_before_training, case "+pipeline.optimizer.lrr=8")


def test_cfg_job_shows_what_runs(tmp_path: Path) -> None:
    proc = run(["train.py", "+experiment=ppo_nav", "--cfg", "job", "--resolve"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "exp_name: ppo_nav" in proc.stdout
    assert "_target_: rl.losses.PPOLoss" in proc.stdout


def test_the_clis_load_torch_only_once_hydra_has_composed() -> None:
    """What train.py and evaluate.py import before Hydra composes (their resolvers) is light:
    ``--help``, ``--cfg`` and Hydra's own errors answer in well under a second."""
    code = (
        "import sys; import rl.utils.config, rl.engine.sweeps, rl.engine, rl.utils; "
        "print(sorted(m for m in ('torch', 'tensordict', 'rl.engine.run') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    for script in ("train.py", "evaluate.py"):  # (nothing heavier at the scripts' top)
        tops = [
            line
            for line in (ROOT / script).read_text().splitlines()
            if line.startswith(("import ", "from "))
        ]
        assert all("rl.engine.run" not in line and "torch" not in line for line in tops), tops


def test_evaluate_without_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    proc = run(["evaluate.py", f"run_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'e'}"], tmp_path)
    assert proc.returncode != 0
    assert "no checkpoint in" in proc.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["+lr=0.1"], ["lr: unknown top-level key"]),
        (
            ["pipeline=dagger_ppo", "pipeline.stages.0.max_stage_steps=256"],  # all of it
            [
                "pipeline.stages.1.max_stage_steps is unset",
                "the other stages take 256 of total_env_steps=256",
            ],
        ),
    ],
    ids=["unknown_top_level_key", "open_stage_left_nothing"],
)
def test_more_refused_configs(
    tmp_path: Path, overrides: list[str], named: list[str], compose_cfg: Any
) -> None:
    """A key of nobody's, a stage budget leaving the open stage nothing (in process)."""
    cfg = compose_cfg(["+experiment=ppo_nav", "+debug=smoke", *overrides])
    with pytest.raises(ConfigError) as refused:
        rl.engine.run.train(cfg)
    assert all(n in str(refused.value) for n in named), refused.value
    assert not (tmp_path / "run").exists()
