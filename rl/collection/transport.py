"""Rollouts across process and machine boundaries: the rollout's ``TensorDict``, as it is.

A worker ships the storage's rows ``[T + 1, n]`` (every field, by nested key) in one of three
forms: a process worker's shared-memory block names (:class:`~rl.utils.shared_memory.SharedRows`,
no pickling); a Ray worker's ``TensorDict`` itself; or, with ``collector.compress``, each leaf
lz4-compressed (:class:`CompressedRows`, for rollouts that cross a network). The learner writes
the workers' rollouts side by side into one ``[T, N]`` storage (:class:`RolloutAssembler`).
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Sequence
from typing import Any, cast

import lz4.frame
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.collection.base import Rollout
from rl.pipeline.trackers import ScalarMeanTracker
from rl.sampling.base import EpisodeRecord
from rl.storage.rollout import RolloutStorage
from rl.utils.shared_memory import SharedBuffers, SharedRows, forget

__all__ = ["CompressedRows", "RolloutAssembler", "ShippedRollout", "ship"]


@dataclasses.dataclass(frozen=True)
class CompressedRows:
    """Rows ``[T + 1, n]``: ``(key, dtype name, shape, lz4-compressed bytes)`` of each leaf."""

    leaves: tuple[tuple[NestedKey, str, tuple[int, ...], bytes], ...]

    @classmethod
    def of(cls, rows: TensorDict) -> CompressedRows:
        """Compress every leaf of ``rows``."""
        leaves = []
        for key, value in rows.items(include_nested=True, leaves_only=True):
            array = np.ascontiguousarray(value.cpu().numpy())
            leaves.append((key, array.dtype.str, array.shape, lz4.frame.compress(array.data)))
        return cls(tuple(leaves))

    @property
    def nbytes(self) -> int:
        """Compressed size."""
        return sum(len(data) for *_, data in self.leaves)

    def decompress(self) -> TensorDict:
        """The rows again."""
        rows = TensorDict({}, batch_size=self.leaves[0][2][:2])
        for key, dtype, shape, data in self.leaves:
            array = np.frombuffer(lz4.frame.decompress(data), dtype=np.dtype(dtype))
            rows.set(key, torch.from_numpy(array.copy()).view(shape))
        return rows


@dataclasses.dataclass
class ShippedRollout:
    """A worker's rollout on its way to the learner.

    Attributes:
        rows: The storage's rows ``0..steps``, in one of three forms (:meth:`tensors`).
        next_value: ``[n]`` value of the observation after the rollout.
        nbytes: Size of the rows.
        sent_bytes: Size of what carries them (names only for shared memory).
        actor_version: The learner's update count when it sent the weights that collected it.
        normalizer_moments: The normalisation moments it recorded, which the learner merges.
    """

    rows: TensorDict | SharedRows | CompressedRows
    next_value: torch.Tensor
    steps: int
    episodes: list[EpisodeRecord]
    stats: dict[str, Any]
    teacher_forced: int
    env_seconds: float
    inference_seconds: float
    nbytes: int
    sent_bytes: int
    ship_seconds: float
    worker: int = 0
    rollout_index: int = 0
    actor_version: int = 0
    fps: float = 0.0
    normalizer_moments: dict[str, Any] | None = None

    def tensors(self) -> TensorDict:
        """The rows ``[steps + 1, n]`` as a ``TensorDict`` (over shared memory: no copy)."""
        if isinstance(self.rows, SharedRows):
            return self.rows.attach()
        if isinstance(self.rows, CompressedRows):
            return self.rows.decompress()
        return self.rows

    def cut(self, steps: int) -> ShippedRollout:
        """The rollout cut to its first ``steps`` steps (a straggler rule's common length).

        The cut environments bootstrap from the value stored for the observation at the cut
        (``values[steps]``; unused where the step before ended an episode). Episodes and
        statistics stay whole.
        """
        if steps >= self.steps:
            return self
        rows = self.tensors()
        return dataclasses.replace(
            self, rows=rows[: steps + 1], next_value=rows["values"][steps].clone(), steps=steps
        )


def ship(
    rollout: Rollout, *, compress: bool = False, shared: SharedBuffers | None = None
) -> ShippedRollout:
    """``rollout`` as it leaves its worker: compressed, or as ``shared``'s block names."""
    t0 = time.perf_counter()
    storage = rollout.storage
    rows = storage.rows()
    leaves = cast("list[torch.Tensor]", list(rows.values(True, True)))  # (all tensors)
    nbytes = sum(v.numel() * v.element_size() for v in leaves)
    shipped: TensorDict | SharedRows | CompressedRows = rows
    sent = nbytes
    if compress:
        shipped = CompressedRows.of(rows)
        sent = shipped.nbytes
    elif shared is not None:
        shared.keep_only(storage.data)
        shipped = shared.rows(storage.data, storage.step + 1)
        sent = len(pickle.dumps(shipped))
    return ShippedRollout(
        rows=shipped,
        next_value=rollout.next_value.cpu(),
        steps=storage.step,
        episodes=list(rollout.episodes),
        stats=rollout.stats,
        teacher_forced=rollout.teacher_forced,
        env_seconds=rollout.env_seconds,
        inference_seconds=rollout.inference_seconds,
        nbytes=nbytes,
        sent_bytes=sent,
        ship_seconds=time.perf_counter() - t0,
    )


class RolloutAssembler:
    """Writes the rollouts of several workers into one storage on the learner's ``device``."""

    def __init__(self, *, num_envs: int, device: torch.device | str) -> None:
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.storage: RolloutStorage | None = None
        self._blocks: dict[int, set[str]] = {}  # shared blocks mapped for each column block

    def _storage_for(self, num_steps: int) -> RolloutStorage:
        if self.storage is None or self.storage.capacity < num_steps:
            self.storage = RolloutStorage(
                num_steps=num_steps, num_envs=self.num_envs, device=self.device
            )
        return self.storage

    def assemble(
        self,
        shipped: Sequence[ShippedRollout],
        widths: Sequence[int],
        extra_stats: dict[str, float] | None = None,
    ) -> Rollout:
        """One rollout of the workers' (all as long), side by side, ``widths`` columns each.

        ``extra_stats`` are logged with the rollout's and the transfer's own.
        """
        bounds = [sum(widths[:i]) for i in range(len(widths) + 1)]
        env_slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        steps = {s.steps for s in shipped}
        if len(steps) != 1:
            raise ValueError(f"workers' rollouts differ in length: {sorted(steps)}")
        t = steps.pop()
        rows = [s.tensors() for s in shipped]
        if self.storage is not None and not _fits(self.storage, rows[0]):
            self.storage = None  # the fields changed (a replaced policy's state)
        storage = self._storage_for(t)
        storage.reset(t)
        next_value = torch.zeros(self.num_envs, device=self.device)
        for s, part, envs in zip(shipped, rows, env_slices, strict=True):
            storage.write_envs(envs, part)
            next_value[envs] = s.next_value.to(self.device)
            self._track_blocks(envs.start, s)
        storage.step = t
        return Rollout(
            storage=storage,
            next_value=next_value,
            episodes=[e for s in shipped for e in s.episodes],
            stats=_stats(shipped, extra_stats),
            teacher_forced=sum(s.teacher_forced for s in shipped),
            env_seconds=max(s.env_seconds for s in shipped),
            inference_seconds=max(s.inference_seconds for s in shipped),
        )

    def close(self) -> None:
        """Unmap every shared block of the workers'."""
        for names in self._blocks.values():
            forget(names)
        self._blocks.clear()

    def _track_blocks(self, column: int, shipped: ShippedRollout) -> None:
        """Unmap the shared blocks a worker no longer uses (its storage was replaced)."""
        if not isinstance(shipped.rows, SharedRows):
            return
        names = {name for _, name, _, _ in shipped.rows.leaves}
        forget(self._blocks.get(column, set()) - names)
        self._blocks[column] = names


def _stats(
    shipped: Sequence[ShippedRollout], extra_stats: dict[str, float] | None
) -> dict[str, Any]:
    """The workers' statistics merged, with the transfer's."""
    stats = ScalarMeanTracker()
    for s in shipped:
        stats.merge(s.stats)
    sent = sum(s.sent_bytes for s in shipped)
    stats.add_scalars(
        {
            **(extra_stats or {}),
            "collection/bytes_sent": float(sent),
            "collection/compression": sum(s.nbytes for s in shipped) / max(1, sent),
            "collection/pack_seconds": max(s.ship_seconds for s in shipped),
        }
    )
    return stats.state_dict()


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
