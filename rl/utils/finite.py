"""Non-finite numbers (NaN, infinity) as errors where they enter, never as silent values.

One NaN reward poisons every parameter in the next update, and a checkpoint of that state
loads as valid. So the sampler checks what environments return, the learner checks each loss
and gradient norm, and checkpoints refuse non-finite weights; each raises a
:class:`NonFiniteError` naming where the value came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or infinity where only finite values are valid; the message says where."""


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
    """Dotted names of the floating-point tensors under ``node`` holding NaN or infinity.

    Args:
        node: A tensor, or mappings and sequences of them (a state dict, an optimizer state).
        prefix: Name of ``node`` itself.
    """
    return [
        name
        for name, tensor in _floating_tensors(node, prefix)
        if not bool(torch.isfinite(tensor).all())
    ]
