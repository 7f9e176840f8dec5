"""Values read back from a checkpoint, which may be anyone's file: checked before they are used.

A tensor of another kind, shape or range is a ``ValueError`` naming its place, raised before
anything is restored, never broadcast into the run or read past a table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["MAX_DEPTH", "odd_values", "saved_like", "saved_tensor"]

# Containers nest this deep at most in a checkpoint (a state dict: 3 levels; a sampler's
# episodes in flight: about 6), far below Python's recursion limit, which a deeper crafted file
# would otherwise reach in whatever walks it first.
MAX_DEPTH = 32


def _plain(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one a checkpoint can hold: dense values of the plain class.

    Not meta (no values), sparse or nested (each fails as a raw error in whatever reads it: the
    finiteness check first), nor a subclass; of the ``Tensor`` or ``Parameter`` class.
    """
    return (
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.layout == torch.strided
        and not (tensor.is_meta or tensor.is_nested)
    )


def odd_values(state: Any, prefix: str = "") -> list[str]:
    """The places in ``state`` that no checkpoint holds (dotted names), written or read.

    A tensor of another kind (meta, sparse, nested, a subclass), or containers nested deeper
    than :data:`MAX_DEPTH`. Walked without recursion, so any depth is
    reported, not a ``RecursionError``; names start with ``prefix``.
    """
    odd: list[str] = []
    stack: list[tuple[Any, str, int]] = [(state, prefix, 0)]
    while stack:
        node, name, depth = stack.pop()
        if isinstance(node, torch.Tensor):
            if not _plain(node):
                kind = "meta" if node.is_meta else str(node.layout).removeprefix("torch.")
                odd.append(f"{name} ({kind} {type(node).__name__} of {node.dtype})")
            continue
        if isinstance(node, Mapping):
            children = [(f"{name}.{k}" if name else str(k), v) for k, v in node.items()]
        elif isinstance(node, list | tuple):
            children = [(f"{name}.{i}" if name else str(i), v) for i, v in enumerate(node)]
        else:
            continue
        if depth == MAX_DEPTH:
            shown = name if len(name) <= 80 else f"{name[:77]}..."
            odd.append(f"{shown} (containers nested deeper than {MAX_DEPTH})")
            continue
        stack.extend((value, child, depth + 1) for child, value in reversed(children))
    return odd


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


def _keys_differ(saved: Mapping[Any, Any], like: Mapping[Any, Any]) -> str:
    """What keys ``saved`` lacks and has beyond ``like``'s (five of each at most)."""
    parts = []
    for what, keys in (
        ("missing", [k for k in like if k not in saved]),
        ("unexpected", [k for k in saved if k not in like]),
    ):
        if keys:
            more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
            parts.append(f"{what} keys {', '.join(repr(k)[:60] for k in keys[:5])}{more}")
    return "; ".join(parts)


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
        if not isinstance(saved, Mapping):
            raise ValueError(f"checkpoint entry {entry}: expected a mapping")
        if set(saved) != set(like):
            raise ValueError(f"checkpoint entry {entry}: {_keys_differ(saved, like)}")
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
