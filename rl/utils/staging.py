"""Host <-> CUDA copies through pinned staging buffers: one transfer each way a step.

A copy from pageable memory is synchronous, one per tensor. Here a step's CPU tensors are packed
into one pinned buffer and copied with ``non_blocking=True`` (the policy's kernels queue behind
it on the same stream). A pinned buffer is not written while a copy from it may be in flight:
several are used in turn, each with a CUDA event recorded after its copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

import torch

K = TypeVar("K", bound=Hashable)

# Every packed tensor starts at a multiple of this many bytes: any dtype's view is aligned, and
# so are vectorised loads of the device views.
ALIGN = 16
# Layouts remembered (a step with final observations has its own, by how many were truncated).
MAX_LAYOUTS = 64


@dataclasses.dataclass
class _Layout:
    """Where each tensor of a step sits in the packed bytes."""

    spans: list[tuple[int, int]]  # (offset, bytes) per tensor, in the mapping's order
    total: int  # bytes in all, aligned


def _layout(tensors: list[torch.Tensor]) -> _Layout:
    spans, offset = [], 0
    for v in tensors:
        nbytes = v.numel() * v.element_size()
        spans.append((offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return _Layout(spans, offset)


def _view(buf: torch.Tensor, span: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """The bytes ``span`` of the flat ``uint8`` buffer ``buf`` as a tensor shaped like ``like``."""
    offset, nbytes = span
    return buf[offset : offset + nbytes].view(like.dtype).view(like.shape)


class _Slot:
    """One pinned buffer and the event after the last copy from or into it."""

    def __init__(self, device: torch.device, pin: bool) -> None:
        self.device, self.pin = device, pin
        self.buffer: torch.Tensor | None = None
        self.event: Any = None  # torch.cuda.Event once a copy was recorded
        self.views: dict[Hashable, list[torch.Tensor]] = {}  # host views by layout key

    def wait(self) -> None:
        """Until the copy last recorded on this slot is done (its buffer may be written)."""
        if self.event is not None:
            self.event.synchronize()

    def record(self) -> None:
        """Mark the end of the copy just queued on the current stream."""
        if self.device.type == "cuda":
            if self.event is None:
                self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(self.device))

    def bytes(self, nbytes: int) -> torch.Tensor:
        """The slot's buffer, at least ``nbytes`` long (allocated or grown here)."""
        if self.buffer is None or self.buffer.numel() < nbytes:
            with torch.inference_mode(False):  # written to under inference mode and outside
                self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self.views.clear()
        return self.buffer

    def like(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor of ``tensor``'s shape and dtype over the slot's buffer."""
        nbytes = tensor.numel() * tensor.element_size()
        return _view(self.bytes(max(nbytes, 1)), (0, nbytes), tensor)


class PinnedTransfers:
    """Host -> device and device -> host copies through reused pinned buffers.

    Args:
        device: The device the tensors go to (and the actions come from).
        buffers: Staging buffers used in turn in each direction (at least 2).
        pin: Page-lock the staging buffers (None: where ``device`` is CUDA; without CUDA the
            copies are plain, for tests of the packing).
    """

    def __init__(
        self, device: torch.device | str, *, buffers: int = 2, pin: bool | None = None
    ) -> None:
        if buffers < 2:
            raise ValueError(f"PinnedTransfers: buffers must be at least 2, got {buffers}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # (as tensors name it)
            self.device = torch.device("cuda", torch.cuda.current_device())
        pin = self.device.type == "cuda" if pin is None else pin
        self._up = [_Slot(self.device, pin) for _ in range(buffers)]
        self._down = [_Slot(self.device, pin) for _ in range(buffers)]
        self._next_up = self._next_down = 0
        self._layouts: dict[Hashable, _Layout] = {}
        self.copies_to_device = 0
        self.copies_to_host = 0

    @property
    def pinned(self) -> bool:
        """Whether the staging buffers are page-locked."""
        return self._up[0].pin

    def staging_buffers(self) -> list[torch.Tensor]:
        """The host staging buffers allocated so far (both directions)."""
        return [s.buffer for s in (*self._up, *self._down) if s.buffer is not None]

    def to_device(self, tensors: Mapping[K, torch.Tensor]) -> dict[K, torch.Tensor]:
        """``tensors`` on the device, the host ones in one non-blocking copy.

        Host tensors come back as views of one fresh device buffer (never reused here).
        """
        out: dict[K, torch.Tensor] = {}
        keys: list[K] = []
        host: list[torch.Tensor] = []
        for key, value in tensors.items():
            if value.device.type == "cpu":
                keys.append(key)
                host.append(value)
            elif value.device == self.device:
                out[key] = value
            else:  # another accelerator's: torch's own copy
                out[key] = value.to(self.device, non_blocking=True)
        if not host:
            return out
        signature = tuple((k, v.dtype, v.shape) for k, v in zip(keys, host, strict=True))
        layout = self._layouts.get(signature)
        if layout is None:
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
            layout = self._layouts[signature] = _layout(host)
        slot = self._up[self._next_up]
        self._next_up = (self._next_up + 1) % len(self._up)
        slot.wait()  # the last copy from this buffer is done: it may be overwritten
        staged = slot.bytes(max(layout.total, 1))
        views = slot.views.get(signature)
        if views is None:
            if len(slot.views) >= MAX_LAYOUTS:
                slot.views.clear()
            views = slot.views[signature] = [
                _view(staged, span, v) for span, v in zip(layout.spans, host, strict=True)
            ]
        for view, value in zip(views, host, strict=True):
            view.copy_(value)
        packed = torch.empty(layout.total, dtype=torch.uint8, device=self.device)
        packed.copy_(staged[: layout.total], non_blocking=True)
        slot.record()
        self.copies_to_device += 1
        for key, span, value in zip(keys, layout.spans, host, strict=True):
            out[key] = _view(packed, span, value)
        return {key: out[key] for key in tensors}  # the caller's order

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (on the device) in a pinned host tensor, valid for ``buffers - 1`` calls."""
        slot = self._down[self._next_down]
        self._next_down = (self._next_down + 1) % len(self._down)
        slot.wait()
        host = slot.like(tensor)
        host.copy_(tensor, non_blocking=True)
        slot.record()
        slot.wait()  # this copy only: the host reads the result next
        self.copies_to_host += 1
        return host


def pinned_transfers(device: torch.device | str) -> PinnedTransfers | None:
    """Staging for ``device`` where it pays: a CUDA device; None for any other (no copies)."""
    device = torch.device(device)
    return PinnedTransfers(device) if device.type == "cuda" else None
