"""Values read back from a checkpoint, which may be anyone's file: checked before they are used.

A tensor of another kind, shape or range is a ``ValueError`` naming its place, raised before
anything is restored, never broadcast into the run or read past a table.
"""

from __future__ import annotations

import math
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


def saved_like(
    saved: Any, like: Any, entry: str, *, flags_equal: bool = True, skip: Sequence[str] = ()
) -> None:
    """Raise ``ValueError`` unless ``saved`` has the structure and kinds of ``like``.

    ``like`` is what this run holds at that place (a tensor, a number, a flag, or mappings and
    lists of them, nested). ``saved`` must have the same keys (but ``skip``'s, checked apart)
    and lengths; each tensor ``like``'s dtype and shape and, where floating, finite values; each
    number ``like``'s type, finite where ``like`` is, not negative where ``like`` is not, an int
    within int64; each flag (a bool, None, a string) equal to ``like``'s, or of its type where
    not ``flags_equal``.
    """
    if isinstance(like, Mapping):
        if not isinstance(saved, Mapping) or set(saved) != set(like):
            raise ValueError(f"checkpoint entry {entry}: expected keys {sorted(like)}")
        for key, value in like.items():
            if key not in skip:
                saved_like(saved[key], value, f"{entry}.{key}", flags_equal=flags_equal, skip=skip)
        return
    if isinstance(like, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) != len(like):
            raise ValueError(f"checkpoint entry {entry}: expected {len(like)} values")
        for i, (a, b) in enumerate(zip(saved, like, strict=True)):
            saved_like(a, b, f"{entry}[{i}]", flags_equal=flags_equal, skip=skip)
        return
    if isinstance(like, torch.Tensor):
        if not (
            isinstance(saved, torch.Tensor)
            and saved.dtype == like.dtype
            and saved.shape == like.shape
            and (not saved.is_floating_point() or bool(torch.isfinite(saved).all()))
        ):
            raise ValueError(
                f"checkpoint entry {entry}: expected a finite {like.dtype} tensor of shape "
                f"{tuple(like.shape)}"
            )
        return
    if type(saved) is not type(like):
        raise ValueError(
            f"checkpoint entry {entry}: expected a {type(like).__name__}, got {saved!r:.40}"
        )
    if isinstance(like, int | float) and not isinstance(like, bool):
        ok = (
            (math.isfinite(saved) or not math.isfinite(like))
            and (saved >= 0 or like < 0)
            and (isinstance(saved, float) or abs(saved) < 2**63)
        )
    else:  # a flag: a bool, None, a string
        ok = saved == like or not flags_equal
    if not ok:
        where = f"checkpoint entry {entry}"
        raise ValueError(f"{where}: {saved!r:.40} where this run has {like!r:.40}")
