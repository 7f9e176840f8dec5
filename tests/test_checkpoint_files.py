"""Damaged or foreign checkpoint files: always a CheckpointError naming the file (hypothesis).

Never a crash of another kind, a hang, or a silent partial load: ``torch.load`` does not check
the archive's CRCs, so a flipped bit would load silently without the digest every checkpoint
carries (``rl.checkpoints.files``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from rl.evaluation import InferenceAgent

STATE = {"model": {"w": torch.arange(256.0).reshape(16, 16)}, "config": {"a": 1},
         "pipeline": {"total_steps": 7}}  # fmt: skip


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An intact checkpoint of ``STATE``, in this module's own temporary folder."""
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "good", STATE, 0, 7)


def damaged(data: bytes, kind: str, draw: st.DrawFn) -> bytes:
    if kind == "truncated":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "bit flips":
        b = bytearray(data)
        for pos, bit in draw(st.lists(st.tuples(st.integers(0, len(b) - 1), st.integers(0, 7)),
                                      min_size=1, max_size=4)):  # fmt: skip
            b[pos] ^= 1 << bit
        return bytes(b) if bytes(b) != data else data[:-1]
    if kind == "extended":
        return data + draw(st.binary(min_size=1, max_size=64))
    if kind == "empty":
        return b""
    return draw(st.binary(min_size=1, max_size=4096))  # random bytes


@settings(max_examples=300, deadline=2_000, derandomize=True)  # the same cases in every CI run
@given(st.data())
def test_damaged_files_are_clear_errors(good: Path, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["truncated", "bit flips", "extended", "empty", "random"]))
    path = good.parent.parent.parent / "checkpoints" / "ckpt_stage00_step000000000001.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(damaged(good.read_bytes(), kind, data.draw))
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)


class Pickled:
    pass


def test_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    pickle = tmp_path / "pickle.pt"
    torch.save({"model": {}, "config": {}, "x": Pickled()}, pickle)
    with pytest.raises(CheckpointError, match="pickle.pt"):
        load_checkpoint(pickle)
    plain = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, plain)  # a state dict, not a checkpoint of ours
    with pytest.raises(CheckpointError, match="other.pt.*not a checkpoint of this project"):
        load_checkpoint(plain)


def test_weights_of_another_model_are_a_clear_error(tmp_path: Path) -> None:
    task = {
        "_target_": "rl_envs.pointnav.PointNavEnv",
        "size": 9,
        "rooms_per_side": 2,
        "max_steps": 30,
    }
    model = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [8]}
    state = {"model": {"w": torch.zeros(3)}, "config": {"task": task, "model": model}}
    path = save_checkpoint(tmp_path, state, 0, 1)
    with pytest.raises(CheckpointError, match=f"{path}: its weights do not fit"):
        InferenceAgent.from_checkpoint(path)


def test_an_intact_file_loads_exactly(good: Path) -> None:
    assert good.name == "ckpt_stage00_step000000000007.pt"
    loaded = load_checkpoint(good)
    assert torch.equal(loaded["model"]["w"], STATE["model"]["w"])


def test_only_names_of_int64_steps_are_checkpoint_names(tmp_path: Path) -> None:
    """A crafted name of a 190-digit step was listed, evaluated, then failed as its result's
    file name was too long; names of non-ASCII digits are no checkpoint's either."""
    from rl.checkpoints import list_checkpoints
    from rl.checkpoints.files import checkpoint_name, parse_checkpoint_name

    assert parse_checkpoint_name(checkpoint_name(3, 2**63 - 1)) == (3, 2**63 - 1)
    for name in ("ckpt_stage00_step" + "9" * 190 + ".pt", "ckpt_stage00_step\u0663.pt"):
        assert parse_checkpoint_name(name) is None
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    assert list_checkpoints(tmp_path) == []
