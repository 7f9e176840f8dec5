"""The device path: pinned host <-> device staging, where the policy acts, the compiled update.

CPU tests: the staging's packing (every dtype and shape back bit for bit, earlier results
untouched by later copies), no staging and no policy copy on a CPU run, a rollout collected by
a separate acting copy of the policy equal bit for bit to one collected by the learner's own
module through several updates (its weights taken before every rollout), the config keys'
errors, and a compiled update's parameters close to an eager one's (skipped, with the reason,
where ``torch.compile`` cannot run). CUDA tests (skipped without CUDA): the staging buffers
are pinned and used once a step each way, and a rollout collected through them equals one
whose tensors were moved one by one; a CPU actor beside a CUDA learner hands its rollouts
over on the GPU.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from pipelines import ppo_pipeline
from small import SMALL

from rl.collection import InProcessCollector
from rl.collection.base import RolloutRequest
from rl.collection.local import resolve_inference_device
from rl.loggers import MetricsLogger
from rl.losses import PPOLoss
from rl.models import ActorCritic
from rl.pipeline import PipelineStage, TrainingPipeline
from rl.sampling import Sampler, SerialSampler
from rl.training import Callback, OnPolicyTrainer, RolloutInfo
from rl.utils.config import ConfigError
from rl.utils.staging import PinnedTransfers, pinned_transfers

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def step_like_tensors() -> dict[object, torch.Tensor]:
    """What a step carries, and the awkward cases: odd byte counts, 0-d, empty, strided."""
    g = torch.Generator().manual_seed(0)
    return {
        ("obs", "view"): torch.randint(0, 11, (16, 7, 7, 3), generator=g, dtype=torch.uint8),
        ("obs", "goal"): torch.randn(16, 2, generator=g),
        "rewards": torch.randn(16, generator=g),
        "terminated": torch.rand(16, generator=g) < 0.3,
        "truncated": torch.zeros(16, dtype=torch.bool),
        "expert_actions": torch.randint(-1, 3, (16,), generator=g),
        "odd": torch.randint(0, 255, (5, 3), generator=g, dtype=torch.uint8),
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.zeros(0, 4, dtype=torch.int32),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
        "half": torch.randn(3, generator=g).to(torch.float16),
    }


def weights(model: Any) -> dict[str, torch.Tensor]:
    """A policy's ``state_dict`` (the trainer and collector hold it as a Policy)."""
    return model.state_dict()  # type: ignore[no-any-return]


def assert_bitwise(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.cpu().reshape(-1).view(torch.uint8).numpy().tobytes() == (
        b.cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    )


def test_staging_packs_every_dtype_and_shape_into_one_copy_bit_for_bit() -> None:
    # Without CUDA the staging runs its packing with plain (unpinned) buffers.
    transfers = PinnedTransfers("cpu", pin=False)
    assert not transfers.pinned
    sent = step_like_tensors()
    got = transfers.to_device(sent)
    assert list(got) == list(sent)  # the caller's keys, in order
    for key, value in sent.items():
        assert_bitwise(got[key], value)
    assert transfers.copies_to_device == 1
    assert len({v.untyped_storage().data_ptr() for v in got.values()}) == 1  # one buffer
    assert all(got[k].data_ptr() != v.data_ptr() for k, v in sent.items() if v.numel())
    # Later copies (the same layout, then another) leave earlier results as they were: each
    # call's tensors are views of a buffer of their own.
    first = {k: v.clone() for k, v in got.items()}
    again = transfers.to_device(
        {k: v + 1 if v.dtype != torch.bool else ~v for k, v in sent.items()}
    )
    other = transfers.to_device({"x": torch.arange(1000, dtype=torch.int64)})
    for key, value in first.items():
        assert_bitwise(got[key], value)
    assert_bitwise(again["rewards"], sent["rewards"] + 1)
    assert_bitwise(other["x"], torch.arange(1000, dtype=torch.int64))
    assert transfers.copies_to_device == 3


def test_staging_back_to_the_host_keeps_a_result_for_the_next_call() -> None:
    transfers = PinnedTransfers("cpu", pin=False)
    a = transfers.to_host(torch.tensor([1, 2, 3]))
    b = transfers.to_host(torch.tensor([4, 5, 6]))
    assert a.tolist() == [1, 2, 3] and b.tolist() == [4, 5, 6]  # (double buffering)
    c = transfers.to_host(torch.tensor([[7.0], [8.0]]))
    assert c.shape == (2, 1) and c.dtype == torch.float32 and c.flatten().tolist() == [7.0, 8.0]
    assert transfers.copies_to_host == 3
    with pytest.raises(ValueError, match="buffers must be at least 2"):
        PinnedTransfers("cpu", buffers=1)


def make_model(sampler: Sampler, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[8],
        trunk_layers=[16],
        rnn="gru",
        rnn_hidden_size=8,
    )


def test_a_cpu_run_stages_nothing_and_acts_with_the_learners_own_policy() -> None:
    assert pinned_transfers("cpu") is None
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        model = make_model(sampler)
        collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
        assert collector.transfers is None and collector.acting_model is model
        assert collector.inference_device == collector.device == torch.device("cpu")
        rollout = collector.collect(RolloutRequest(num_steps=4))
        # The storage the policy recorded into is the one the learner gets (no hand-over).
        assert rollout.storage is collector.storage


class Rollouts(Callback):
    """Keeps a copy of every rollout (its recorded rows) and the policy's weights after it."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        rows = info.rollout.storage.rows()
        self.rows.append(
            {k: v.clone() for k, v in rows.items(include_nested=True, leaves_only=True)}
        )


def small_ppo(
    model: Any,
    collector: InProcessCollector,
    tmp_path: Path,
    rollouts: int,
    callbacks: list[Callback] | None = None,
    **pipeline: Any,
) -> OnPolicyTrainer:
    """PPO on 4 environments x 8 steps, 2 minibatches x 2 epochs, for ``rollouts`` rollouts."""
    return OnPolicyTrainer(
        model=model,
        pipeline=ppo_pipeline(
            named_losses={"ppo": PPOLoss()},
            stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=4 * 8 * rollouts)],
            num_steps=8,
            num_mini_batch=2,
            update_repeats=2,
            metric_accumulate_interval=32,
            save_interval=0,
            **pipeline,
        ),
        collector=collector,
        logger=MetricsLogger([]),
        output_dir=tmp_path,
        seed=0,
        callbacks=callbacks or [],
        device="cpu",
    )


def train_with(actor_copy: bool, tmp_path: Path) -> tuple[OnPolicyTrainer, Rollouts]:
    sampler = SerialSampler(task=SMALL, num_envs=4, seed=3)
    model = make_model(sampler)
    # A separate acting copy on the same device: the path a CPU actor beside a CUDA learner
    # takes (weights copied before every rollout, the rollout handed over).
    actor = copy.deepcopy(model).requires_grad_(False) if actor_copy else None
    collector = InProcessCollector(model=model, sampler=sampler, acting_model=actor, device="cpu")
    kept = Rollouts()
    trainer = small_ppo(model, collector, tmp_path, rollouts=4, callbacks=[kept])
    try:
        trainer.train()
    finally:
        collector.close()
    return trainer, kept


def test_an_acting_copy_collects_the_same_rollouts_as_the_learners_policy(tmp_path: Path) -> None:
    own, own_rollouts = train_with(False, tmp_path / "own")
    copied, copied_rollouts = train_with(True, tmp_path / "copy")
    assert copied.collector.acting_model is not copied.model  # type: ignore[attr-defined]
    assert len(own_rollouts.rows) == len(copied_rollouts.rows) == 4
    for rows, other in zip(own_rollouts.rows, copied_rollouts.rows, strict=True):
        assert rows.keys() == other.keys()
        for key in rows:
            assert torch.equal(rows[key], other[key]), key
    for (name, a), b in zip(
        weights(own.model).items(), weights(copied.model).values(), strict=True
    ):
        assert torch.equal(a, b), name
    # The copy holds the weights of the last rollout's policy, not the learner's since.
    actor = copied.collector.acting_model  # type: ignore[attr-defined]
    assert any(
        not torch.equal(a, b)
        for a, b in zip(weights(actor).values(), weights(copied.model).values(), strict=True)
    )


def test_inference_device_values_and_errors_name_the_key() -> None:
    cpu = torch.device("cpu")
    assert resolve_inference_device("auto", cpu) == cpu
    assert resolve_inference_device("cpu", cpu) == cpu
    for bad in ("gpu", "cuda:x", "cpu:1", "", "CUDA"):
        with pytest.raises(ConfigError, match="collector.inference_device: expected auto, cpu"):
            resolve_inference_device(bad, cpu)
    if not CUDA:
        with pytest.raises(ConfigError, match="collector.inference_device: 'cuda:1'.*not avail"):
            resolve_inference_device("cuda:1", cpu)


def test_inference_device_and_compile_are_config_keys(compose_cfg, resolve_cfg) -> None:
    from rl.engine.settings import verify_train_cfg

    cfg = resolve_cfg(compose_cfg(["+experiment=ppo_cartpole"]))
    assert cfg["collector"]["inference_device"] == "auto"
    assert cfg["pipeline"]["compile"] is False
    verify_train_cfg(cfg)
    bad = resolve_cfg(compose_cfg(["+experiment=ppo_cartpole", "pipeline.compile=maybe"]))
    with pytest.raises(ConfigError, match="pipeline.compile: expected bool"):
        verify_train_cfg(bad)
    with pytest.raises(ValueError, match="pipeline.compile: expected true or false"):
        TrainingPipeline(**{**_pipeline_kwargs(), "compile": "yes"})


def _pipeline_kwargs() -> dict:
    from pipelines import ppo_settings

    return dict(
        named_losses={"ppo": PPOLoss()},
        stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=64)],
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        **ppo_settings(),
    )


# ------------------------------------------------------------------------------- compile
@functools.cache
def compile_unavailable() -> str | None:
    """Why ``torch.compile`` cannot run here (None: it can)."""
    try:
        torch.compile(lambda x: x * 2)(torch.ones(3))
    except Exception as e:  # noqa: BLE001  (e.g. no C++ compiler for Inductor)
        return f"torch.compile cannot run here: {type(e).__name__}: {e}"
    return None


def updates(compile: bool, tmp_path: Path) -> OnPolicyTrainer:
    """Two rollouts and their updates of a small memoryless policy, compiled or not."""
    sampler = SerialSampler(task=SMALL, num_envs=4, seed=3)
    torch.manual_seed(0)
    model = ActorCritic(
        observation_space=sampler.observation_space,
        action_space=sampler.action_space,
        cnn_channels=[],
        trunk_layers=[],
        head_layers=[16],
    )
    collector = InProcessCollector(model=model, sampler=sampler, device="cpu")
    trainer = small_ppo(model, collector, tmp_path, rollouts=2, recurrence=1, compile=compile)
    try:
        trainer.train()
    finally:
        sampler.close()
    return trainer


def test_a_compiled_update_matches_the_eager_one_to_float_tolerance(tmp_path: Path) -> None:
    reason = compile_unavailable()
    if reason is not None:
        pytest.skip(reason)
    torch._dynamo.reset()
    eager = updates(False, tmp_path / "eager")
    compiled = updates(True, tmp_path / "compiled")
    assert compiled.learner._compiled and compiled.learner._compile_proven
    for (name, a), b in zip(
        weights(eager.model).items(), weights(compiled.model).values(), strict=True
    ):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    # The model itself is not wrapped: its state_dict keys are the eager ones.
    assert list(weights(compiled.model)) == list(weights(eager.model))


# ---------------------------------------------------------------------------------- CUDA
@needs_cuda
def test_cuda_staging_is_pinned_one_copy_a_step_each_way_and_exact(tmp_path: Path) -> None:
    device = torch.device("cuda")
    storages = []
    for staged in (True, False):
        with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
            model = make_model(sampler).to(device)
            collector = InProcessCollector(model=model, sampler=sampler, device=device)
            transfers = collector.transfers
            assert transfers is not None and transfers.pinned
            if not staged:  # each tensor moved by itself (torch's own copies)
                collector.transfers = None
            torch.manual_seed(1)
            rollout = collector.collect(RolloutRequest(num_steps=40))  # (truncations at 30)
            storages.append(rollout.storage.rows().clone())
            if staged:
                assert transfers.staging_buffers()
                assert all(b.is_pinned() for b in transfers.staging_buffers())
                assert transfers.copies_to_device == 41  # the first observations, each step's
                assert transfers.copies_to_host == 40  # each step's actions
    a, b = storages
    for key in a.keys(include_nested=True, leaves_only=True):
        assert torch.equal(a[key], b[key]), key


@needs_cuda
def test_cuda_learner_with_a_cpu_actor_gets_its_rollouts_on_the_gpu() -> None:
    device = torch.device("cuda")
    with SerialSampler(task=SMALL, num_envs=4, seed=3) as sampler:
        model = make_model(sampler).to(device)
        collector = InProcessCollector(
            model=model, sampler=sampler, device=device, inference_device="cpu"
        )
        assert collector.transfers is None  # (acting on the CPU: nothing to stage per step)
        assert next(iter(weights(collector.acting_model).values())).device.type == "cpu"
        rollout = collector.collect(RolloutRequest(num_steps=8))
        assert rollout.storage.device.type == rollout.next_value.device.type == "cuda"
        assert collector.storage is not None and collector.storage["actions"].is_pinned()
        handed = rollout.storage.rows()
        for key, value in collector.storage.rows().items(include_nested=True, leaves_only=True):
            assert torch.equal(handed.get(key).cpu(), value), key  # type: ignore[arg-type]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        collector.collect(RolloutRequest(num_steps=8))
        for a, b in zip(
            model.state_dict().values(), weights(collector.acting_model).values(), strict=True
        ):
            assert torch.equal(a.cpu(), b)
