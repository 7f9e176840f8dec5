"""The best checkpoint by a chosen metric and keep-last-N retention (``rl.checkpoints.retention``).

In-process trainers on the small PointNav layout publish a scripted metric (``test/score``, as
evaluation publishes ``eval/*``), so which checkpoint is best is known in advance; one run
through ``train.py``'s engine judges by ``valid/*`` from the real validation process and is
resumed. Crafted ``best.json`` / ``best`` files are refused or ignored, never followed.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from pipelines import ppo_pipeline
from small import SMALL
from test_resume import StopAt

from rl.checkpoints.errors import CheckpointError
from rl.checkpoints.files import (
    best_checkpoint,
    checkpoint_file,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    parse_checkpoint_name,
    save_checkpoint,
)
from rl.checkpoints.retention import BEST_RECORD, CheckpointRetention, load_best_record
from rl.collection import InProcessCollector
from rl.engine import run
from rl.engine.settings import verify_train_cfg
from rl.evaluation.runs import find_checkpoints
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic
from rl.pipeline import PipelineStage, TrainingPipeline
from rl.sampling import SerialSampler
from rl.training import Callback, OnPolicyTrainer, RolloutInfo, RunRecord
from rl.utils.config import ConfigError, to_plain

# 4 environments x 8 steps: a rollout is 32 env steps, and a checkpoint follows each.
STEPS = list(range(32, 257, 32))
# The scripted metric at each rollout's end (so at each checkpoint): highest at 96, lowest at 160.
SCORES = dict(zip(STEPS, [1.0, 2.0, 5.0, 3.0, -4.0, 4.0, 4.5, 0.0], strict=True))


class Score(Callback):
    """Publish ``test/score`` = ``SCORES[step]`` after every rollout (before it is saved)."""

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        trainer.metrics.publish(info.total_steps, {"test/score": SCORES[info.total_steps]})


def make_pipeline(**retention: object) -> TrainingPipeline:
    return ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=256)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        num_steps=8,
        num_mini_batch=2,
        update_repeats=1,
        metric_accumulate_interval=64,
        save_interval=32,
        **retention,
    )


def train(out: Path, *callbacks: Callback, resume: bool = False, **retention: object):
    """Train (or, ``resume``, continue from the newest checkpoint) with ``test/score``."""
    torch.manual_seed(0)
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            cnn_channels=[8],
            trunk_layers=[16],
            rnn="gru",
            rnn_hidden_size=8,
        )
        trainer = OnPolicyTrainer(
            model=model,
            pipeline=make_pipeline(**retention),
            collector=InProcessCollector(model=model, sampler=sampler, device="cpu"),
            logger=MetricsLogger([]),
            output_dir=out,
            run=RunRecord(config={"note": "test"}),
            seed=0,
            callbacks=[Score(), *callbacks],
            device="cpu",
        )
        if resume:
            trainer.load_state_dict(load_checkpoint(latest_checkpoint(out)))
        trainer.train()
    return trainer


def steps_left(out: Path) -> list[int]:
    return [parsed[1] for p in list_checkpoints(out) if (parsed := parse_checkpoint_name(p))]


def record(out: Path) -> dict:
    return json.loads((out / "checkpoints" / BEST_RECORD).read_text())


@pytest.mark.parametrize(("mode", "best"), [("max", 96), ("min", 160)])
def test_best_is_marked_and_keep_last_leaves_n_plus_the_best(
    tmp_path: Path, mode: str, best: int
) -> None:
    out = tmp_path / "run"
    train(out, keep_last=3, best_metric="test/score", best_mode=mode)
    assert steps_left(out) == sorted({best, 192, 224, 256})  # the newest 3, plus the best
    assert record(out) == {
        "checkpoint": checkpoint_name(0, best),
        "metric": "test/score",
        "mode": mode,
        "value": SCORES[best],
        "step": best,
    }
    path = out / "checkpoints" / checkpoint_name(0, best)
    pointer = out / "checkpoints" / "best"
    assert pointer.read_text() == path.name
    assert best_checkpoint(out) == path == checkpoint_file(pointer)  # (InferenceAgent's)
    assert [r.path for r in find_checkpoints(ckpt=str(pointer))] == [path]  # evaluate.py ckpt=
    assert latest_checkpoint(out).name == checkpoint_name(0, 256)


def test_best_and_keep_last_hold_across_a_resume_which_stays_exact(tmp_path: Path) -> None:
    settings = {"keep_last": 2, "best_metric": "test/score"}
    reference = train(tmp_path / "reference")  # retention off, uninterrupted
    assert steps_left(tmp_path / "reference") == STEPS  # off: every checkpoint, no best
    assert not (tmp_path / "reference" / "checkpoints" / BEST_RECORD).exists()
    with pytest.raises(CheckpointError, match="no best checkpoint"):
        checkpoint_file(tmp_path / "reference" / "checkpoints" / "best")
    out = tmp_path / "run"
    train(out, StopAt(128), **settings)
    assert steps_left(out) == [96, 128] and record(out)["step"] == 96
    resumed = train(out, StopAt(192), resume=True, **settings)
    assert steps_left(out) == [96, 160, 192]  # the best (96) kept though older than the last 2
    resumed = train(out, resume=True, **settings)
    assert steps_left(out) == [96, 224, 256]  # 4.5 at 224 never beat 5.0 (read from best.json)
    assert record(out)["step"] == 96 and resumed.retention.best is not None
    uninterrupted = tmp_path / "uninterrupted"
    train(uninterrupted, **settings)
    assert steps_left(uninterrupted) == steps_left(out) and record(uninterrupted) == record(out)
    # Neither the feature nor the resumes changed training: bitwise the run without retention.
    for (name, a), b in zip(
        reference.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    states = [load_checkpoint(latest_checkpoint(d)) for d in (tmp_path / "reference", out)]
    assert states[0].keys() == states[1].keys()  # nothing added to what a checkpoint holds


def test_a_resume_may_change_the_metric_and_the_count(tmp_path: Path, caplog) -> None:
    out = tmp_path / "run"
    train(out, StopAt(128), keep_last=2, best_metric="test/score")
    with caplog.at_level(logging.WARNING):
        train(out, resume=True, keep_last=1, best_metric="test/score", best_mode="min")
    assert "records the best by 'test/score' ('max')" in caplog.text  # another mode: starts over
    assert record(out)["step"] == 160 and steps_left(out) == [160, 256]


# --------------------------------------------------------------- the files themselves
def tiny_run(folder: Path, steps: list[int]) -> list[Path]:
    return [save_checkpoint(folder, {"model": {}, "config": {}}, 0, s) for s in steps]


def test_pending_validation_is_kept_and_its_result_goes_with_the_checkpoint(
    tmp_path: Path,
) -> None:
    first, *_ = paths = tiny_run(tmp_path, [32, 64])
    for p in paths:
        p.with_suffix(".valid.json").write_text("{}")
    first.with_suffix(".eval.json").write_text("{}")  # an evaluation result: stays
    retention = CheckpointRetention(tmp_path, keep_last=1, best_metric="valid/success")
    retention.start()
    retention.hold(first)  # queued for validation
    retention.saved(paths[1], {})
    assert steps_left(tmp_path) == [32, 64]
    newest = tiny_run(tmp_path, [96])[0]
    retention.saved(newest, {"valid/success": 1.0})  # (a valid/* metric: not judged at save)
    assert steps_left(tmp_path) == [32, 96] and retention.best is None
    retention.validated(first, {"valid/success": 0.5})  # its result: the best, so kept
    assert steps_left(tmp_path) == [32, 96] and record(tmp_path)["step"] == 32
    retention.hold(newest)
    retention.validated(newest, {"valid/success": 0.75})
    assert steps_left(tmp_path) == [96]  # the old best goes, with its validation result
    assert not first.with_suffix(".valid.json").exists()
    assert not paths[1].with_suffix(".valid.json").exists()
    assert first.with_suffix(".eval.json").exists()


def test_keep_last_deletes_only_regular_checkpoint_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    foreign = outside / checkpoint_name(0, 1)
    foreign.write_bytes(b"someone else's")
    tiny_run(tmp_path / "run", [32, 64, 96])
    folder = tmp_path / "run" / "checkpoints"
    (folder / checkpoint_name(0, 1)).symlink_to(foreign)  # a link under a checkpoint name
    (folder / "notes.txt").write_text("mine")
    (folder / "superseded_1").mkdir()
    tiny_run(tmp_path / "aside", [8])[0].rename(folder / "superseded_1" / checkpoint_name(0, 8))
    retention = CheckpointRetention(tmp_path / "run", keep_last=1)
    retention.start()
    assert [p.name for p in retention.prune()] == [checkpoint_name(0, 32), checkpoint_name(0, 64)]
    assert (
        foreign.read_bytes() == b"someone else's" and (folder / checkpoint_name(0, 1)).is_symlink()
    )
    assert (folder / "notes.txt").exists()
    assert (folder / "superseded_1" / checkpoint_name(0, 8)).exists()


GOOD = {"checkpoint": checkpoint_name(0, 32), "metric": "test/score", "mode": "max",
        "value": 2.0, "step": 32}  # fmt: skip
CRAFTED = {
    "path traversal": json.dumps({**GOOD, "checkpoint": "../../elsewhere/" + GOOD["checkpoint"]}),
    "absolute path": json.dumps({**GOOD, "checkpoint": "/tmp/" + GOOD["checkpoint"]}),
    "not a checkpoint name": json.dumps({**GOOD, "checkpoint": "config.yaml"}),
    "NaN": json.dumps(GOOD).replace("2.0", "NaN"),
    "infinity": json.dumps(GOOD).replace("2.0", "Infinity"),
    "a string value": json.dumps({**GOOD, "value": "2.0"}),
    "a boolean value": json.dumps({**GOOD, "value": True}),
    "an integer no float holds": json.dumps({**GOOD, "value": 10**400}),
    "a step that is not the name's": json.dumps({**GOOD, "step": 64}),
    "an unknown mode": json.dumps({**GOOD, "mode": "median"}),
    "a missing checkpoint": json.dumps(
        {**GOOD, "checkpoint": checkpoint_name(0, 999), "step": 999}
    ),
    "not JSON": "{",
    "a list": "[1, 2]",
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "too large": json.dumps({**GOOD, "pad": "x" * 10_000}),
}


@pytest.mark.parametrize("content", list(CRAFTED.values()), ids=list(CRAFTED))
def test_a_crafted_best_record_is_refused_and_ignored(
    tmp_path: Path, content: str, caplog
) -> None:
    tiny_run(tmp_path, [32, 64])
    folder = tmp_path / "checkpoints"
    (folder / BEST_RECORD).write_text(content)
    with pytest.raises(CheckpointError, match=BEST_RECORD):
        load_best_record(tmp_path)
    retention = CheckpointRetention(tmp_path, keep_last=1, best_metric="test/score")
    with caplog.at_level(logging.WARNING):
        retention.start()
    assert retention.best is None and "tracking starts over" in caplog.text
    retention.saved(folder / checkpoint_name(0, 64), {"test/score": 1.0})
    assert record(tmp_path)["step"] == 64 and steps_left(tmp_path) == [64]


def test_a_sound_record_is_taken_and_links_are_never_followed(tmp_path: Path, caplog) -> None:
    tiny_run(tmp_path, [32, 64])
    folder = tmp_path / "checkpoints"
    (folder / BEST_RECORD).write_text(json.dumps(GOOD))
    assert load_best_record(tmp_path) is not None  # the sound record itself loads
    sentinel = tmp_path / "sentinel.json"
    sentinel.write_text(json.dumps(GOOD))
    (folder / BEST_RECORD).unlink()
    (folder / BEST_RECORD).symlink_to(sentinel)  # a link to a sound record: refused
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_best_record(tmp_path)
    (folder / "best").symlink_to(folder / checkpoint_name(0, 32))
    with pytest.raises(CheckpointError, match="no best checkpoint"):
        best_checkpoint(tmp_path)  # a link under the pointer's name is no pointer
    retention = CheckpointRetention(tmp_path, best_metric="test/score")
    with caplog.at_level(logging.WARNING):
        retention.start()
    assert retention.best is None
    retention.saved(folder / checkpoint_name(0, 64), {"test/score": 1.0})
    assert sentinel.read_text() == json.dumps(GOOD)  # replaced the links, wrote nothing through
    assert not (folder / BEST_RECORD).is_symlink() and not (folder / "best").is_symlink()
    assert best_checkpoint(tmp_path) == folder / checkpoint_name(0, 64)
    # A pointer holding a path, or a link as the named checkpoint, names nothing either.
    (folder / "best").write_text("../../" + checkpoint_name(0, 64))
    with pytest.raises(CheckpointError, match="no best checkpoint"):
        best_checkpoint(tmp_path)
    os.symlink(folder / checkpoint_name(0, 64), folder / checkpoint_name(0, 7))
    (folder / "best").write_text(checkpoint_name(0, 7))
    with pytest.raises(CheckpointError, match="no best checkpoint"):
        checkpoint_file(folder / "best")
    # A record checked sound is taken on start, and a pointer that disagrees is rewritten.
    (folder / BEST_RECORD).write_text(json.dumps(GOOD))
    retention.start()
    assert retention.best is not None and retention.best.step == 32
    assert best_checkpoint(tmp_path) == folder / checkpoint_name(0, 32)


# --------------------------------------------------------------- config and the engine
SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0",
         "model.cnn_channels=[8]", "pipeline.save_interval=64"]  # fmt: skip


def test_the_config_check_names_each_key(compose_cfg) -> None:
    cfg = to_plain(
        compose_cfg(
            [
                *SMOKE,
                "pipeline.keep_last=-1",
                "pipeline.best_mode=median",
                "pipeline.best_metric=valid/success",
            ]  # fmt: skip
        )
    )
    with pytest.raises(ConfigError) as err:
        verify_train_cfg(cfg)
    text = str(err.value)
    assert "pipeline.keep_last" in text and ">= 0" in text
    assert "pipeline.best_mode" in text and "median" in text
    assert "pipeline.best_metric=valid/success: validation is off" in text
    cfg = to_plain(compose_cfg([*SMOKE, "pipeline.best_metric=eval/success"]))
    with pytest.raises(ConfigError, match="eval.interval > 0"):
        verify_train_cfg(cfg)
    verify_train_cfg(
        to_plain(compose_cfg([*SMOKE, "pipeline.best_metric=charts/episodic_return"]))
    )


def test_best_by_validation_with_keep_last_through_a_resume(compose_cfg, tmp_path: Path) -> None:
    out = tmp_path / "run"
    valid = ["valid.enabled=true", "valid.num_episodes=3", "valid.num_envs=2"]
    best = ["pipeline.best_metric=valid/episodic_return"]
    run.train(compose_cfg([*SMOKE, *valid, *best, "pipeline.keep_last=2"]))
    assert steps_left(out) == sorted({record(out)["step"], 192, 256})
    first = record(out)
    # Resumed with a longer budget and a smaller count (both may change on resume).
    run.train(
        compose_cfg(
            [
                *SMOKE,
                *valid,
                *best,
                "pipeline.keep_last=1",
                f"resume={out}",
                "total_env_steps=384",
                f"hydra.run.dir={tmp_path / 'other'}",
            ]  # fmt: skip
        )
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validated = [
        (r["env_step"], r["valid/episodic_return"]) for r in records if "valid/success" in r
    ]
    assert [s for s, _ in validated] == list(range(64, 385, 64))  # each once, none failed
    values = dict(validated)
    top = max(values.values())
    final = record(out)
    assert final["value"] == top and values[final["step"]] == top
    assert final["step"] == min(s for s, v in values.items() if v == top)  # (ties: the earlier)
    assert final["value"] >= first["value"]
    assert steps_left(out) == sorted({final["step"], 384})
    left = sorted(p.name for p in (out / "checkpoints").glob("*.valid.json"))
    assert left == [checkpoint_name(0, s)[:-3] + ".valid.json" for s in steps_left(out)]
