"""Shared memory between the processes of a run: rows of data cross without pickling.

:class:`SharedArrays`: arrays in one ``RawArray`` made by the parent (the multiprocess
sampler's). :class:`SharedBuffers`: named blocks made by a child (a collection worker's rollout
storage), which the learner maps by name (:class:`SharedRows`). The worker writes its next
rollout only after the learner took the last one. It owns its blocks and unlinks them (the
resource tracker it shares with the learner does if it was killed); the learner never does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

_ALIGN = 64  # byte alignment of each array in a shared block


class SharedArrays:
    """Numpy arrays carved out of one shared ``RawArray`` by ``layout`` (:meth:`plan`)."""

    def __init__(self, raw: Any, layout: Mapping[str, tuple[int, tuple[int, ...], str]]) -> None:
        self.raw = raw
        buffer = np.frombuffer(raw, dtype=np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        for name, (offset, shape, dtype) in layout.items():
            dt = np.dtype(dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            self.arrays[name] = buffer[offset : offset + size].view(dt).reshape(shape)

    @staticmethod
    def plan(specs: Mapping[str, tuple[tuple[int, ...], Any]]) -> tuple[dict[str, Any], int]:
        """Lay out ``name -> (shape, dtype)`` arrays; return the layout and the total bytes."""
        layout: dict[str, tuple[int, tuple[int, ...], str]] = {}
        offset = 0
        for name, (shape, dtype) in specs.items():
            dt = np.dtype(dtype)
            layout[name] = (offset, tuple(int(s) for s in shape), dt.str)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            offset += -(-size // _ALIGN) * _ALIGN
        return layout, max(offset, _ALIGN)


@dataclasses.dataclass(frozen=True)
class SharedRows:
    """Rows ``[length, n]`` of tensors in named shared memory (what the learner is sent).

    ``leaves`` are ``(key, block name, full shape, dtype name)``.
    """

    leaves: tuple[tuple[NestedKey, str, tuple[int, ...], str], ...]
    length: int

    def attach(self) -> TensorDict:
        """The rows as a ``TensorDict`` over the shared blocks (mapped once per block)."""
        first = self.leaves[0][2]
        rows = TensorDict({}, batch_size=[self.length, first[1]])
        for key, name, shape, dtype in self.leaves:
            rows.set(key, _mapped(name, shape, dtype)[: self.length])
        return rows


# Blocks this process has mapped (the learner's side), by name: (block, tensor over it).
_MAPPED: dict[str, tuple[shared_memory.SharedMemory, torch.Tensor]] = {}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def _over(block: shared_memory.SharedMemory, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(block.buf, dtype=dtype, count=count).view(shape)


def _mapped(name: str, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """The tensor over block ``name`` (mapped on first use, never unlinked here)."""
    hit = _MAPPED.get(name)
    if hit is None:
        # Python < 3.13 registers a block it only maps with the resource tracker: the one the
        # worker registered it with (a child shares its parent's), so the name is registered
        # once, the worker's unlink unregisters it, and the tracker unlinks it at the end if
        # the worker was killed first.
        block = shared_memory.SharedMemory(name=name)
        hit = _MAPPED[name] = (block, _over(block, shape, _dtype(dtype)))
    return hit[1]


def forget(names: set[str]) -> None:
    """Unmap blocks of ``names`` this process mapped (their worker replaced or closed them)."""
    for name in names & set(_MAPPED):
        _MAPPED.pop(name)  # the mapping goes with its last tensor


class SharedBuffers:
    """Tensors in named shared-memory blocks, one block each (the worker's side).

    :meth:`allocate` is a :class:`~rl.storage.RolloutStorage`'s allocator; :meth:`rows` names
    a rollout's rows for the learner.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, shared_memory.SharedMemory] = {}  # by data pointer

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zeroed tensor of ``shape`` and ``dtype`` in a new shared block."""
        nbytes = max(1, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
        block = shared_memory.SharedMemory(create=True, size=nbytes)
        tensor = _over(block, shape, dtype)
        tensor.zero_()
        self._blocks[tensor.data_ptr()] = block
        return tensor

    def rows(self, data: TensorDict, length: int) -> SharedRows:
        """The first ``length`` rows of ``data`` (a storage of this allocator's tensors)."""
        leaves = []
        for key, value in data.items(include_nested=True, leaves_only=True):
            block = self._blocks.get(value.data_ptr())
            if block is None:
                raise ValueError(f"rollout field {key!r} is not in shared memory")
            leaves.append((key, block.name, tuple(value.shape), str(value.dtype)))
        return SharedRows(tuple(leaves), length)

    def keep_only(self, data: TensorDict) -> None:
        """Unlink every block that no leaf of ``data`` (the current storage) lies in."""
        live = {v.data_ptr() for v in data.values(include_nested=True, leaves_only=True)}
        for ptr in [p for p in self._blocks if p not in live]:
            _unlink(self._blocks.pop(ptr))

    def close(self) -> None:
        """Unlink every block (the mappings go with the process)."""
        for block in self._blocks.values():
            _unlink(block)
        self._blocks.clear()


def _unlink(block: shared_memory.SharedMemory) -> None:
    with contextlib.suppress(FileNotFoundError):
        block.unlink()
