"""Values read back from a checkpoint, which may be anyone's file: checked before they are used.

A tensor of another kind, shape or range is a ``ValueError`` naming its place, raised before
anything is restored, never broadcast into the run or read past a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["saved_like", "saved_tensor"]


def saved_tensor(
    state: Any,
    key: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    low: int | torch.Tensor | None = None,
    high: int | torch.Tensor | None = None,
    where: str = "batched environment state",
) -> torch.Tensor:
    """``state[key]``, on the CPU: a tensor of ``shape`` and ``dtype``, values in ``[low, high)``.

    A bound given as a tensor is elementwise (broadcast against the value).

    Raises:
        ValueError: Anything else, naming ``where`` and ``key``.
    """
    value = state.get(key) if isinstance(state, Mapping) else None
    if not (
        isinstance(value, torch.Tensor)
        and value.dtype == dtype
        and tuple(value.shape) == tuple(shape)
    ):
        raise ValueError(f"{where} {key!r}: expected a {dtype} tensor of shape {tuple(shape)}")
    value = value.cpu()
    if (low is not None and bool((value < low).any())) or (
        high is not None and bool((value >= high).any())
    ):
        raise ValueError(f"{where} {key!r}: expected values in [{_bound(low)}, {_bound(high)})")
    return value


def _bound(bound: int | torch.Tensor | None) -> str:
    if bound is None:
        return "..."
    return str(bound) if isinstance(bound, int) else str(bound.flatten().tolist())


def saved_like(saved: Any, like: Any, entry: str) -> None:
    """Raise ``ValueError`` unless ``saved`` has the structure of ``like``.

    ``like`` is a tensor or a mapping of them (a ``TensorDict`` too), nested: ``saved`` must
    have the same keys, and each tensor the same shape and dtype and, where floating, finite
    values.
    """
    if isinstance(like, torch.Tensor):
        ok = (
            isinstance(saved, torch.Tensor)
            and saved.dtype == like.dtype
            and saved.shape == like.shape
            and (not saved.is_floating_point() or bool(torch.isfinite(saved).all()))
        )
        if not ok:
            raise ValueError(
                f"checkpoint entry {entry}: expected a finite {like.dtype} tensor of shape "
                f"{tuple(like.shape)}"
            )
        return
    keys = list(like.keys())
    if not isinstance(saved, Mapping) or set(saved.keys()) != set(keys):
        raise ValueError(f"checkpoint entry {entry}: expected the keys {sorted(keys)}")
    for key in keys:
        saved_like(saved[key], like[key], f"{entry}.{key}")
