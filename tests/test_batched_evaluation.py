"""Evaluation follows a run's batched sampler (``sampler=batched``), with the serial results.

Every evaluation (periodic and final during training, validation, ``evaluate.py`` and its
expert reference) steps its environments as :meth:`EvalSampler.of_run` says from the run's
sampler config: through the :class:`~rl.sampling.BatchedSampler` where the run trained with
it, else serially. Checked here: a ``ppo_nav`` policy on the held-out ``test`` layouts and a
CartPole policy (through gymnasium's vector environments) run the same episodes in the same
order with the same per-episode results either way, sampled or argmax actions, environments
pausing as their shares end; a run trained with ``sampler=batched`` evaluates through it, in
training and in ``evaluate.py`` (its log says so), with the serial sampler's results.

The batched PointNav gives float32 rewards (the :class:`~rl.tasks.batched.BatchedEnv`
contract allows them), which the sampler sums into returns; the serial sampler sums the
environment's own float64 rewards. A PointNav episode's ``return`` is therefore compared to
float32 rounding (``RETURN_ATOL_PER_STEP``) and every other metric bitwise; CartPole's
(float64 rewards through gymnasium) bitwise.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from omegaconf import OmegaConf

from rl.checkpoints.files import load_checkpoint
from rl.collection.episodes import EvalResult, EvalSampler, episode_seed_list, evaluate_policy
from rl.collection.local import InProcessCollector
from rl.engine.run import evaluate, train
from rl.evaluation.inference import load_trained_policy
from rl.models.policy import Policy, build_policy
from rl.tasks.factory import task_layout, with_split
from rl.utils.config import ConfigError
from rl.utils.seeding import set_seed
from rl_envs.pointnav.env import Actions

# A return summed from float32 rewards against one summed from float64: half a float32 ulp
# of PointNav's largest reward (2.49) a step at most.
RETURN_ATOL_PER_STEP = 1.5e-7
EPISODES = episode_seed_list(13, 1_000_000)  # 13 over 5 environments: shares of 3 and 2


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: small batches, two test processes on two cores (several times faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plain(cfg: Any) -> dict[str, Any]:
    """A composed config resolved, without Hydra's own node."""
    out = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
                                 resolve=True)  # fmt: skip
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def fresh_policy(cfg: dict[str, Any], seed: int = 1, stop_bias: float = 0.0) -> Policy:
    """A fresh policy of the run's model (``seed``); ``stop_bias`` added to PointNav's STOP
    logit (negative: longer episodes than a fresh policy's, which mostly stops at once)."""
    layout = task_layout(cfg["task"])
    set_seed(seed)
    model = build_policy(cfg["model"], *layout.spaces, groups=layout.groups)
    if stop_bias:
        with torch.no_grad():
            model.actor_out.bias[int(Actions.STOP)] += stop_bias  # type: ignore[index, union-attr]
    return model


def assert_same_results(batched: EvalResult, serial: EvalResult, *, exact_return: bool) -> None:
    """The same episodes in the same order, every metric the same (``return``: see above)."""
    assert [e["episode_seed"] for e in batched.episodes] == [
        e["episode_seed"] for e in serial.episodes
    ]
    for got, want in zip(batched.episodes, serial.episodes, strict=True):
        assert got.keys() == want.keys()
        if exact_return:
            assert got == want
        else:
            atol = RETURN_ATOL_PER_STEP * want["length"]
            assert got["return"] == pytest.approx(want["return"], rel=0, abs=atol)
            assert {k: v for k, v in got.items() if k != "return"} == {
                k: v for k, v in want.items() if k != "return"
            }


def run_both(
    cfg: dict[str, Any], model: Policy, task: dict[str, Any], **kwargs: Any
) -> tuple[EvalResult, EvalResult]:
    """The policy on ``EPISODES`` through the run's sampler and through the serial sampler."""
    sampler = EvalSampler.of_run(cfg["sampler"])
    assert sampler.batched and sampler.config() is not None
    common: dict[str, Any] = {"model": model, "task": task, "episode_seeds": EPISODES,
                              "num_envs": 5, "device": "cpu", **kwargs}  # fmt: skip
    batched = evaluate_policy(**common, sampler=sampler)
    serial = evaluate_policy(**common, sampler=EvalSampler.of_run(None))
    return batched, serial


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled", "argmax"])
@pytest.mark.parametrize("max_steps", [None, 4], ids=["as_configured", "truncating"])
def test_ppo_nav_policy_same_episodes_batched_as_serial(
    compose_cfg: Any, deterministic: bool, max_steps: int | None
) -> None:
    cfg = plain(compose_cfg(["+experiment=ppo_nav", "sampler=batched"]))
    assert cfg["sampler"]["_target_"] == "rl.sampling.BatchedSampler"
    task = with_split(cfg["task"], "test")
    if max_steps is not None:  # episodes cut short: truncations and their final observations
        task["max_steps"] = max_steps
    model = fresh_policy(cfg, stop_bias=-3.0)
    batched, serial = run_both(cfg, model, task, deterministic=deterministic)
    assert_same_results(batched, serial, exact_return=False)
    assert set(batched.metrics) >= {"success", "spl", "return", "length"}
    assert batched.metrics["length"] == serial.metrics["length"]
    if max_steps is not None:
        assert any(e["length"] == max_steps and not e["success"] for e in batched.episodes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_task_through_its_vector_env_same_as_serial(compose_cfg: Any, mode: str) -> None:
    """CartPole through gymnasium's SyncVectorEnv / AsyncVectorEnv: bitwise the serial results."""
    overrides = ["+experiment=ppo_cartpole", "sampler=batched",
                 f"sampler.vectorization_mode={mode}", "sampler.mp_start_method=fork",
                 "+task.env_kwargs.max_episode_steps=30"]  # fmt: skip
    cfg = plain(compose_cfg(overrides))
    assert EvalSampler.of_run(cfg["sampler"]).vectorization_mode == mode
    batched, serial = run_both(cfg, fresh_policy(cfg, seed=3), cfg["task"])
    assert_same_results(batched, serial, exact_return=True)
    assert len({e["length"] for e in batched.episodes}) > 1  # episodes of different lengths


def test_only_a_batched_run_evaluates_batched_and_its_settings_are_checked() -> None:
    """The one decision: the batched sampler's settings for a batched run, else serial."""
    run = {"_target_": "rl.sampling.BatchedSampler", "_partial_": True, "num_envs": 64,
           "device": "cuda", "vectorization_mode": "async", "mp_start_method": "spawn",
           "timeout": 30}  # fmt: skip
    sampler = EvalSampler.of_run(run)
    assert sampler == EvalSampler(True, "cuda", "async", "spawn", 30)
    config = sampler.config()
    assert config is not None and "num_envs" not in config  # evaluation's own count
    assert EvalSampler.of_run(run, device="cpu").device == "cpu"  # evaluate.py's device
    for other in (None, {"_target_": "rl.sampling.SerialSampler", "num_envs": 4},
                  {"_target_": "rl.sampling.MultiprocessSampler", "num_processes": 2},
                  {"_target_": "my.own.BatchedSampler"}):  # fmt: skip
        assert EvalSampler.of_run(other) == EvalSampler.serial()
        assert EvalSampler.of_run(other).config() is None
    with pytest.raises(ConfigError, match="sampler.vectorization_mode"):
        EvalSampler.of_run({**run, "vectorization_mode": "threads"})
    with pytest.raises(ConfigError, match="sampler.timeout"):
        EvalSampler.of_run({**run, "timeout": -1})


class Run(NamedTuple):
    folder: Path
    cfg: dict[str, Any]
    validation_log: list[str]  # what rl.evaluation.validation logged while it trained


@pytest.fixture(scope="module")
def batched_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A tiny ppo_nav run trained with sampler=batched, its checkpoints validated (3 episodes)
    and its final policy evaluated (5 episodes)."""
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    out = tmp_path_factory.mktemp("batched_eval") / "run"
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path="../conf"):
            cfg = compose(
                config_name="train",
                overrides=["+experiment=ppo_nav", "+debug=smoke", "task=nav_small",
                           "sampler=batched", f"output_dir={out}", "total_env_steps=128",
                           "pipeline.stages.0.max_stage_steps=128", "eval.num_episodes=5",
                           "eval.num_envs=2", "valid.enabled=true", "valid.num_episodes=3",
                           "valid.num_envs=2"],
            )  # fmt: skip
    finally:
        GlobalHydra.instance().clear()
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("rl.evaluation.validation")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        train(cfg)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return Run(out, plain(cfg), messages)


def test_training_collector_evaluates_through_the_batched_sampler(batched_run: Run) -> None:
    cfg = batched_run.cfg
    from rl.collection.base import CollectionSpec

    spec = CollectionSpec(**{k: cfg[k] for k in ("task", "sampler", "model", "normalize")},
                          seed=cfg["seed"])  # fmt: skip
    collector = InProcessCollector.from_spec(spec=spec, model=fresh_policy(cfg), device="cpu")
    try:
        assert collector.eval_sampler == EvalSampler(batched=True, device=cfg["sampler"]["device"])
    finally:
        collector.close()


def test_evaluate_py_on_a_batched_run_uses_the_batched_sampler(
    batched_run: Run, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, cfg, _ = batched_run
    final = sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1]
    overrides = {"ckpt": str(final), "num_episodes": 5, "num_envs": 2, "progress_bar": False,
                 "plot": False, "output_dir": str(tmp_path)}  # fmt: skip
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path="../conf"):
            typed = [f"{k}={v}" for k, v in overrides.items()]
            eval_cfg = plain(compose(config_name="evaluate", overrides=typed))
    finally:
        GlobalHydra.instance().clear()
    with caplog.at_level(logging.INFO, logger="rl.evaluation.runs"):
        logged = evaluate(eval_cfg)
    assert "2 environments through the batched sampler (device=cpu" in caplog.text
    written = json.loads(next(final.parent.glob(f"{final.stem}.eval.test-5ep-*.json")).read_text())
    # The same episodes and results as the training's own final evaluation (batched too) ...
    during = json.loads(final.with_suffix(".eval.json").read_text())
    assert written["episodes"] == during["episodes"]
    assert logged["eval/success"] == during["metrics"]["success"]
    # ... and as the serial sampler's, the checkpoint's policy on the same list.
    state = load_checkpoint(final)
    model, normalizer = load_trained_policy(
        state, final, task_layout(cfg["task"]).spaces, model_config=cfg["model"], device="cpu"
    )
    serial = evaluate_policy(
        model=model, task=with_split(cfg["task"], "test"),
        episode_seeds=episode_seed_list(5, cfg["eval"]["episode_seed"]), num_envs=2,
        action_seed=cfg["eval"]["action_seed"], normalizer=normalizer,
        device="cpu",
    )  # fmt: skip
    assert_same_results(EvalResult(written["metrics"], written["episodes"]), serial,
                        exact_return=False)  # fmt: skip


def test_validation_of_a_batched_run_uses_the_batched_sampler(batched_run: Run) -> None:
    """Each checkpoint validated through the batched sampler, with the serial sampler's means."""
    run, cfg, messages = batched_run
    assert any("per checkpoint, batched sampler (device=cpu" in m for m in messages), messages
    valid = cfg["valid"]
    checkpoints = sorted((run / "checkpoints").glob("ckpt_*.pt"))
    assert checkpoints
    for checkpoint in checkpoints:
        metrics = json.loads(checkpoint.with_suffix(".valid.json").read_text())["metrics"]
        model, normalizer = load_trained_policy(
            load_checkpoint(checkpoint), checkpoint, task_layout(cfg["task"]).spaces,
            model_config=cfg["model"],
            device="cpu",
        )  # fmt: skip
        serial = evaluate_policy(
            model=model, task=with_split(cfg["task"], valid["split"]),
            episode_seeds=episode_seed_list(3, valid["episode_seed"]), num_envs=2,
            deterministic=valid["deterministic"], action_seed=valid["action_seed"],
            normalizer=normalizer,
            device="cpu",
        ).as_logged("valid")  # fmt: skip
        returns = serial.pop("valid/episodic_return"), metrics.pop("valid/episodic_return")
        assert returns[1] == pytest.approx(returns[0], rel=0, abs=RETURN_ATOL_PER_STEP * 50)
        assert {k: v for k, v in metrics.items() if k in serial} == serial
