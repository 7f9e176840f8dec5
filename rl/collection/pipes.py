"""Messages through a collection worker's pipe: pickled, CPU tensors by value.

A ``multiprocessing`` pipe's own pickler (``ForkingPickler``, with torch's reductions) sends a
CPU tensor as a handle to shared memory: its storage moved there, then a file descriptor passed
over a socket, a round trip per tensor. For a process collection worker's traffic (the
learner's weights every update, a rollout's bootstrap values and statistics) that cost about
7 ms per update for a small policy, and the receiver shared memory with the sender. :func:`send`
pickles CPU tensors by value, as NumPy arrays (:class:`_ByValue`): well under a millisecond, and
the receiver holds its own copy. The rollout's rows do not travel here at all
(:mod:`rl.collection.shared_rows`).
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.connection import Connection
from typing import Any

import torch

__all__ = ["receive_from", "send"]


class _ByValue(pickle.Pickler):
    """Pickles CPU tensors (of a NumPy dtype, outside autograd) by value, as NumPy arrays."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and not obj.requires_grad
            and obj.dtype in _NUMPY_DTYPES
        ):
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


_NUMPY_DTYPES = frozenset(
    {
        torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    }
)  # fmt: skip


def send(conn: Connection, obj: Any) -> None:
    """Send ``obj`` through a pipe, its CPU tensors by value (:class:`_ByValue`)."""
    buffer = io.BytesIO()
    _ByValue(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    conn.send_bytes(buffer.getbuffer())


def receive_from(conn: Connection) -> Any:
    """What :func:`send` sent."""
    return pickle.loads(conn.recv_bytes())
