"""Untrusted settings, checkpoints and run folders, the minor points of the attack review.

Non-finite float settings and counts beyond any real use are refused up front, naming the key;
a checkpoint whose weights or statistics hold NaN is refused by name wherever it is loaded;
``rl.train("resume=RUN")`` returns the folder it trained in; a NaN reward in a rollout asked
ahead by an asynchronous process worker with a multiprocess sampler is named, not "the sampler
is closed"; a second ``train.py`` given a live run's ``hydra.run.dir`` leaves its ``.hydra/``
as it is.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rl.checkpoints import latest_checkpoint
from rl.checkpoints.errors import UntrustedCheckpointError
from rl.checkpoints.files import parse_checkpoint_name, with_digest
from rl.checkpoints.lock import RunLock
from rl.engine import run
from rl.evaluation import InferenceAgent
from rl.utils.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0"]


def _crafted(run_dir: Path, tmp_path: Path, name: str) -> tuple[Path, Path, dict[str, Any]]:
    """A copy of the run: ``(folder, its newest checkpoint, that checkpoint's state)``."""
    folder = tmp_path / name
    shutil.copytree(run_dir, folder)
    path = latest_checkpoint(folder)
    return folder, path, torch.load(path, weights_only=True)


def _resign(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` under ``path``'s name with the project's digest, as an attacker can
    (save_checkpoint itself refuses non-finite weights)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(with_digest(buffer.getvalue()))


# ------------------------------------------------------------ 1: non-finite float settings
@pytest.mark.parametrize(
    "override, key",
    [
        ("pipeline.optimizer.lr=inf", "pipeline.optimizer.lr"),
        ("pipeline.optimizer.lr=-inf", "pipeline.optimizer.lr"),
        ("pipeline.optimizer.lr=nan", "pipeline.optimizer.lr"),
        ("pipeline.optimizer.lr=-0.001", "pipeline.optimizer.lr"),
        ("pipeline.max_grad_norm=inf", "pipeline.max_grad_norm"),
        ("pipeline.gamma=nan", "pipeline.gamma"),
        ("pipeline.advantage.gae_lambda=nan", "pipeline.advantage.gae_lambda"),
        ("pipeline.named_losses.ppo.clip_param=inf", "pipeline.named_losses.ppo.clip_param"),
        ("pipeline.named_losses.ppo.entropy_coef=inf", "pipeline.named_losses.ppo.entropy_coef"),
        (
            "pipeline.named_losses.ppo.value_loss_coef=nan",
            "pipeline.named_losses.ppo.value_loss_coef",
        ),
        (
            "pipeline.named_losses.ppo.clip_decay.startp=inf",  # (a plain float hint)
            "pipeline.named_losses.ppo.clip_decay.startp",
        ),
        ("+pipeline.stages.0.loss_weights=[inf]", "pipeline.stages.0.loss_weights"),
        ("normalize.clip=inf", "normalize.clip"),
    ],
)
def test_non_finite_float_settings_are_refused_by_name(
    compose_cfg: Any, override: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + r": .*(finite|> 0)") as info:
        run.train(compose_cfg([*SMOKE, override]))
    assert str(info.value).count(key + ":") == 1  # once, though two checks read the lr


# ------------------------------------------------------------ 6: upper bounds of counts
@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.num_envs=5000", "eval.num_envs"),
        ("valid.num_envs=5000", "valid.num_envs"),
        ("eval.num_episodes=1000001", "eval.num_episodes"),
        ("valid.num_episodes=1000001", "valid.num_episodes"),
        ("sampler=multiprocess sampler.num_processes=1025", "sampler.num_processes"),
        ("sampler=multiprocess sampler.envs_per_process=5000", "sampler.envs_per_process"),
        ("collector=process collector.num_workers=1025", "collector.num_workers"),
        ("distributed=ddp distributed.world_size=1025", "distributed.world_size"),
    ],
)
def test_out_of_range_settings_are_refused_before_anything_starts(
    compose_cfg: Any, override: str, key: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ": must be <= "):
        run.train(compose_cfg([*SMOKE, *override.split()]))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["num_envs=5000", "num_episodes=1000001"])
def test_evaluate_s_counts_are_bounded(compose_cfg: Any, tmp_path: Path, override: str) -> None:
    cfg = compose_cfg([f"ckpt={tmp_path / 'none.pt'}", override,
                       f"output_dir={tmp_path / 'e'}"], "evaluate")  # fmt: skip
    with pytest.raises(ConfigError, match=override.split("=")[0] + ": must be <= "):
        run.evaluate(cfg)


def test_the_expert_generator_s_episodes_are_bounded(tmp_path: Path) -> None:
    from rl.storage.expert_data import generate_expert_trajectories

    task = {"_target_": "rl_envs.toys.debug.FaultyEnv"}
    with pytest.raises(ConfigError, match=r"generate\.num_episodes: must be <= 1000000"):
        generate_expert_trajectories(task=task, num_episodes=10**7, seed=0,
                                     path=tmp_path / "x.npz")  # fmt: skip
    assert not (tmp_path / "x.npz").exists()


# ------------------------------------------------------------ 3: non-finite weights
@pytest.mark.parametrize(
    "entry, name",
    [("model", "model."), ("optimizer", "optimizer.state."), ("normalizer", "normalizer.obs.")],
)
def test_a_checkpoint_with_non_finite_weights_is_refused_by_name_everywhere(
    smoke_run: Path, tmp_path: Path, compose_cfg: Any, entry: str, name: str
) -> None:
    folder, path, state = _crafted(smoke_run, tmp_path, "crafted")
    if entry == "model":
        first = next(k for k, v in state["model"].items() if v.is_floating_point())
        state["model"][first] = state["model"][first].clone().fill_(float("nan"))
    elif entry == "optimizer":
        moments = next(iter(state["optimizer"]["state"].values()))
        moments["exp_avg"] = moments["exp_avg"].clone().fill_(float("inf"))
    else:
        state["normalizer"] = {"obs": {"x": {"var": torch.tensor([float("nan")])}}}
    _resign(path, state)
    match = re.escape(f"{path.name}: non-finite values (NaN or infinity) in {name}")
    with pytest.raises(UntrustedCheckpointError, match=match):
        InferenceAgent.from_checkpoint(path)
    out = tmp_path / "e"
    evaluate = [f"ckpt={path}", "num_episodes=1", "num_envs=1", "plot=false", f"output_dir={out}"]
    with pytest.raises(UntrustedCheckpointError, match=match):
        run.evaluate(compose_cfg(evaluate, "evaluate"))
    with pytest.raises(UntrustedCheckpointError, match=match):  # never an older one instead
        run.train(compose_cfg([*SMOKE, f"resume={folder}", "total_env_steps=384"]))
    with pytest.raises(UntrustedCheckpointError, match=match):
        run.train(compose_cfg([*SMOKE, f"init_from={path}"]))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------ 2: the API's resumed folder
def test_the_api_returns_the_resumed_run_s_folder(
    smoke_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl

    folder = tmp_path / "resumed"
    shutil.copytree(smoke_run, folder)
    monkeypatch.chdir(tmp_path)  # (Hydra's folder for the invocation would be under outputs/)
    result = rl.train(*SMOKE, f"resume={folder}", "total_env_steps=384")
    assert result.run_dir == folder.resolve()
    assert parse_checkpoint_name(latest_checkpoint(result.run_dir)) == (0, 384)
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------ 4: NaN in a rollout asked ahead
@pytest.mark.timeout(120)
def test_a_nan_in_a_rollout_asked_ahead_is_named_not_the_closed_sampler(
    compose_cfg: Any, seed_offset: int
) -> None:
    """collector=process (async) with sampler=multiprocess: the learner saves a checkpoint
    while the worker's next rollout is in flight; that rollout meets a NaN reward, the worker's
    sampler closes, and the ``state_dict`` call queued behind it fails with "the sampler is
    closed". The error raised is the worker's first: the NaN, named with its environment,
    sampler process and collection worker."""
    from rl.utils.seeding import env_seeds

    seed = env_seeds(2, 1 + seed_offset)[0]  # (environment 0's, of the run's seed)
    task = ("+task={_target_: rl_envs.toys.debug.FaultyEnv, mode: nan_reward, fail_at_step: 17, "
            f"fail_seed: {seed}, max_steps: 10}}")  # fmt: skip
    workers = ["collector=process", "collector.num_workers=1", "sampler=multiprocess",
               "sampler.num_processes=1", "sampler.num_envs=2"]  # fmt: skip
    budget = ["total_env_steps=64", "pipeline.save_interval=32"]  # a checkpoint after update 1
    smoke = ["+experiment=ppo_cartpole", "+debug=smoke", "~task", task, "eval.num_episodes=0"]
    cfg = compose_cfg([*smoke, *workers, *budget])
    assert cfg.seed == 1 + seed_offset
    with pytest.raises(Exception) as info:  # step 17: the second rollout, asked ahead
        run.train(cfg)
    message = str(info.value)
    assert "sampler is closed" not in message
    assert "environment 0 returned a non-finite reward (nan)" in message
    assert "sampler process 0 (pid" in message and "collection worker 0 (pid" in message


# ------------------------------------------------------------ 5: one run folder, two runs
def test_a_second_run_in_a_live_run_s_folder_leaves_its_hydra_record(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    record = folder / ".hydra"
    record.mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (record / name).write_text(f"# the live run's {name}\n")
    before = {p.name: p.read_bytes() for p in record.iterdir()}
    with RunLock(folder):  # the live run
        proc = subprocess.run(
            [sys.executable, "train.py", *SMOKE, f"hydra.run.dir={folder}"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**os.environ, "WANDB_MODE": "disabled"},
        )  # fmt: skip
    assert proc.returncode == 1
    assert f"run folder {folder} is in use by another process" in proc.stderr
    assert {p.name: p.read_bytes() for p in record.iterdir()} == before
