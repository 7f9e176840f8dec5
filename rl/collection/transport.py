"""Rollouts across process and machine boundaries: packed as arrays, optionally compressed.

A collection worker packs its :class:`~rl.collection.Rollout` into plain NumPy arrays, one per
leaf of the rollout's ``TensorDict`` (by nested key: every field the collector recorded, with
no list of fields here), plus the finished episodes and statistics (:func:`pack_rollout`); with
``compress`` every array's bytes are lz4-compressed (lz4's frame format, as RLlib compresses
observations: grid observations and flags shrink several-fold, floats little). The learner
writes the packed rollouts of all workers side by side into one storage
(:class:`RolloutAssembler`), each worker's environments in their own columns, so the update
sees one ``[T, N]`` rollout whatever the layout.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import lz4.frame
import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.base import Rollout
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EpisodeRecord
from rl.storage.rollout import RolloutStorage


@dataclasses.dataclass
class PackedArray:
    """An array's bytes, lz4-compressed, with what is needed to rebuild it."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, array: np.ndarray) -> PackedArray:
        """Compress ``array``."""
        array = np.ascontiguousarray(array)
        return cls(array.dtype.str, array.shape, lz4.frame.compress(array.tobytes()))

    def unpack(self) -> np.ndarray:
        """The array again."""
        raw = lz4.frame.decompress(self.data)
        return np.frombuffer(raw, dtype=np.dtype(self.dtype)).reshape(self.shape)


def pack_rollout(rollout: Rollout, *, compress: bool) -> dict[str, Any]:
    """A rollout as plain data: arrays (lz4-compressed if ``compress``), episodes, statistics.

    Returns:
        ``{"arrays": {nested key: array [T + 1, N, ...]}, "next_value": array [N],
        "episodes": [...], "stats": ..., "teacher_forced": ..., "env_seconds": ...,
        "inference_seconds": ..., "bytes": raw size, "packed_bytes": size sent,
        "pack_seconds": time spent packing}`` (row ``T``'s per-step fields are unused).
    """
    t0 = time.perf_counter()
    rows = rollout.storage.rows()
    arrays: dict[Any, Any] = {
        key: value.cpu().numpy()
        for key, value in rows.items(include_nested=True, leaves_only=True)
    }
    arrays["next_value"] = rollout.next_value.cpu().numpy()
    raw = sum(a.nbytes for a in arrays.values())
    packed = raw
    if compress:
        arrays = {k: PackedArray.of(a) for k, a in arrays.items()}
        packed = sum(len(a.data) for a in arrays.values())
    next_value = arrays.pop("next_value")
    return {
        "arrays": arrays,
        "next_value": next_value,
        "steps": rollout.storage.step,
        "episodes": [dataclasses.asdict(e) for e in rollout.episodes],
        "stats": rollout.stats,
        "teacher_forced": rollout.teacher_forced,
        "env_seconds": rollout.env_seconds,
        "inference_seconds": rollout.inference_seconds,
        "bytes": raw,
        "packed_bytes": packed,
        "pack_seconds": time.perf_counter() - t0,
    }


def _array(value: Any) -> np.ndarray:
    return value.unpack() if isinstance(value, PackedArray) else np.asarray(value)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array`` (a copy when it is read-only, as Ray's zero-copy arrays are)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def unpack_rows(data: Mapping[str, Any]) -> TensorDict:
    """The rows ``[T + 1, n]`` of a packed rollout as a ``TensorDict``."""
    arrays = {key: _array(value) for key, value in data["arrays"].items()}
    first = next(iter(arrays.values()))
    rows = TensorDict({}, batch_size=first.shape[:2])
    for key, array in arrays.items():
        rows.set(key, _tensor(array))
    return rows


def cut_packed_rollout(data: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """A packed rollout cut to its first ``steps`` steps (a straggler rule's common length).

    The cut environments bootstrap from the value the collecting policy stored for the
    observation at the cut (``values[steps]``); where the step before the cut ended an
    episode, GAE does not bootstrap there anyway. Episodes and statistics stay whole.
    """
    arrays = {k: _array(v)[: steps + 1] for k, v in data["arrays"].items()}
    recorded = int(data["steps"])
    next_value = arrays["values"][steps] if steps < recorded else _array(data["next_value"])
    return {**data, "arrays": arrays, "next_value": next_value, "steps": min(steps, recorded)}


class RolloutAssembler:
    """Writes the packed rollouts of several workers into one learner-side storage.

    Args:
        num_envs: Environments over all workers.
        device: Where the storage lives (the learner's device).
    """

    def __init__(self, *, num_envs: int, device: torch.device | str = "cpu") -> None:
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.storage: RolloutStorage | None = None

    def _storage_for(self, num_steps: int) -> RolloutStorage:
        if self.storage is None or self.storage.capacity < num_steps:
            self.storage = RolloutStorage(
                num_steps=num_steps, num_envs=self.num_envs, device=self.device
            )
        return self.storage

    def assemble(
        self,
        packed: Sequence[Mapping[str, Any]],
        widths: Sequence[int],
        extra_stats: Mapping[str, float] | None = None,
    ) -> Rollout:
        """One rollout from each worker's packed rollout, side by side.

        Args:
            packed: Each worker's packed rollout, all of the same number of steps.
            widths: Each one's environments (their columns follow in this order).
            extra_stats: More statistics to log with the rollout's (``collection/*``); the
                transfer's own (``collection/{bytes_sent,compression,pack_seconds}``) are added.
        """
        bounds = [sum(widths[:i]) for i in range(len(widths) + 1)]
        env_slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        steps = {int(p["steps"]) for p in packed}
        if len(steps) != 1:
            raise ValueError(f"workers' rollouts differ in length: {sorted(steps)}")
        t = steps.pop()
        rows = [unpack_rows(p) for p in packed]
        if self.storage is not None and not _fits(self.storage, rows[0]):
            self.storage = None  # the fields changed (a replaced policy's state)
        storage = self._storage_for(t)
        storage.reset(t)
        next_value = torch.zeros(self.num_envs, device=self.device)
        for p, part, envs in zip(packed, rows, env_slices, strict=True):
            storage.write_envs(envs, part.to(self.device))
            next_value[envs] = _tensor(_array(p["next_value"])).to(self.device)
        storage.step = t
        stats = ScalarMeanTracker()
        for p in packed:
            stats.merge(p["stats"])
        sent = sum(int(p["packed_bytes"]) for p in packed)
        stats.add_scalars(
            {
                **(extra_stats or {}),
                "collection/bytes_sent": float(sent),
                "collection/compression": sum(int(p["bytes"]) for p in packed) / max(1, sent),
                "collection/pack_seconds": max(float(p["pack_seconds"]) for p in packed),
            }
        )
        return Rollout(
            storage=storage,
            next_value=next_value,
            episodes=[EpisodeRecord(**e) for p in packed for e in p["episodes"]],
            stats=stats.state_dict(),
            teacher_forced=sum(int(p["teacher_forced"]) for p in packed),
            env_seconds=max(float(p["env_seconds"]) for p in packed),
            inference_seconds=max(float(p["inference_seconds"]) for p in packed),
        )


def _fits(storage: RolloutStorage, rows: TensorDict) -> bool:
    """Whether every field of ``rows`` has the shape and dtype of ``storage``'s, where present."""
    for key, value in rows.items(include_nested=True, leaves_only=True):
        try:
            buf = storage[key]
        except KeyError:
            continue
        if buf.shape[2:] != value.shape[2:] or buf.dtype != value.dtype:
            return False
    return True
