"""Rollouts across process and machine boundaries: the rollout's ``TensorDict``, as it is.

A collection worker ships its :class:`~rl.collection.Rollout` as a :class:`ShippedRollout`
(:func:`ship`): the storage's rows ``[T + 1, n]`` (every field the collector recorded, by nested
key, with no list of fields here), the value to bootstrap from, the finished episodes and the
statistics. The rows travel in one of three forms:

- a worker that is a child process (``collector.backend=process``) keeps its storage in shared
  memory and sends only the blocks' names (:class:`~rl.utils.shared_memory.SharedRows`): the
  learner copies the rows from there into its own storage, with no pickling in between;
- a Ray worker sends the ``TensorDict`` itself (Ray pickles its tensors);
- with ``collector.compress`` each leaf's bytes are lz4-compressed (:class:`CompressedRows`,
  lz4's frame format, as RLlib compresses observations: grid observations and flags shrink
  several-fold, floats little), for rollouts that cross a network.

The learner writes the rollouts of all workers side by side into one storage
(:class:`RolloutAssembler`), each worker's environments in their own columns, so the update
sees one ``[T, N]`` rollout whatever the layout.
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
    """Rows ``[T + 1, n]`` with each leaf's bytes lz4-compressed.

    Attributes:
        leaves: ``(key, dtype name, shape, compressed bytes)`` of each leaf.
    """

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
        rows: The storage's rows ``0..steps``: a ``TensorDict``, or its shared-memory or
            compressed form (:meth:`tensors` gives the ``TensorDict``).
        next_value: ``[n]`` value of the observation after the rollout.
        steps: Steps recorded.
        episodes: Episodes that ended during the rollout.
        stats: The collector's statistics (a ``ScalarMeanTracker`` state).
        teacher_forced: Steps whose action the expert chose.
        env_seconds: Seconds spent stepping environments.
        inference_seconds: Seconds spent in the policy.
        nbytes: Size of the rows.
        sent_bytes: Size of what carries them (names only for shared memory).
        ship_seconds: Time spent preparing the rows.
        worker: The worker that collected it.
        rollout_index: Its index among the worker's rollouts.
        actor_version: The version of the weights it was collected with (the learner's update
            count when it sent them).
        fps: The worker's environment steps per second over it.
        normalizer_moments: The normalisation moments it recorded (None without
            normalisation), which its learner merges.
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

        The cut environments bootstrap from the value the collecting policy stored for the
        observation at the cut (``values[steps]``); where the step before the cut ended an
        episode, GAE does not bootstrap there anyway. Episodes and statistics stay whole.
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
    """``rollout`` as it leaves its worker.

    Args:
        rollout: The collected rollout.
        compress: lz4-compress the rows (:class:`CompressedRows`).
        shared: The allocator of the storage's shared-memory blocks (names are sent instead
            of the rows; ignored when ``compress``).
    """
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
    """Writes the rollouts of several workers into one learner-side storage.

    Args:
        num_envs: Environments over all workers.
        device: Where the storage lives (the learner's device).
    """

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
        """One rollout from each worker's, side by side.

        Args:
            shipped: Each worker's rollout, all of the same number of steps.
            widths: Each one's environments (their columns follow in this order).
            extra_stats: More statistics to log with the rollout's (``collection/*``); the
                transfer's own (``collection/{bytes_sent,compression,pack_seconds}``) are added.
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
        """Unmap every shared block of the workers' (their rollouts were copied out)."""
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
