"""Non-finite numbers (NaN, infinity) as errors where they enter, never as silent values.

One NaN reward poisons every parameter in the next update, and a checkpoint of that state loads
as valid; so environments' outputs, losses, gradient norms and saved weights are all checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or infinity where only finite values are valid; the message says where."""


def as_float(value: object, *, finite: bool = False) -> float | None:
    """``value`` as a float where it is a real number (an int or float, not a bool), else None.

    For numbers read from files (checkpoints, run folders): an int beyond a float's range is
    None, and with ``finite`` so are NaN and infinity.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return None if finite and not math.isfinite(number) else number


def as_count(value: object, low: int = 0, high: int = 2**63) -> int | None:
    """``value`` where it is an ``int`` (not a bool) in ``[low, high)``, else None.

    For counters and seeds read from files (a step count, an index, a generator's state): a
    float, a string or a count out of range (by default, one no int64 holds) is None.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        return None
    return value


def _floating_tensors(node: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        if node.is_floating_point() or node.is_complex():
            yield prefix, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _floating_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _floating_tensors(value, f"{prefix}.{i}" if prefix else str(i))


def nonfinite_tensors(node: Any, prefix: str = "") -> list[str]:
    """Dotted names (under ``prefix``) of the float tensors in ``node`` holding NaN or infinity.

    ``node``: a tensor, or mappings and sequences of them (a state dict, an optimizer state).
    """
    return [
        name
        for name, tensor in _floating_tensors(node, prefix)
        if not bool(torch.isfinite(tensor).all())
    ]
