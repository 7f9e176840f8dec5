"""Values read back from a checkpoint, which may be anyone's file: checked before they are used.

A tensor of another kind, shape or range is a ``ValueError`` naming its place, raised before
anything is restored, never broadcast into the run or read past a table.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "checked_weights",
    "odd_values",
    "saved_like",
    "saved_tensor",
]

# Containers nest this deep at most in a checkpoint (a state dict: 3 levels; a sampler's
# episodes in flight: about 6), far below Python's recursion limit, which a deeper crafted file
# would otherwise reach in whatever walks it first.
MAX_DEPTH = 32
# Values in a checkpoint besides its config, counted at each place they appear: pickle stores a
# list referenced many times once, so a file of a few KB can stand for 10**9 values, and every
# walk of it (this one first) would take hours. A genuine state holds far fewer (a sampler's
# episodes in flight: an action per step of each environment's episode so far).
MAX_VALUES = 2**23


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


_WALKED = (torch.Tensor, Mapping, list, tuple)


def _shown(name: str) -> str:
    return name if len(name) <= 80 else f"{name[:77]}..."


def odd_values(state: Any, prefix: str = "") -> list[str]:
    """The places in ``state`` that no checkpoint holds (dotted names), written or read.

    A tensor of another kind (meta, sparse, nested, a subclass), containers nested deeper than
    :data:`MAX_DEPTH`, or more than :data:`MAX_VALUES` values in all. Walked without recursion,
    so any depth is reported, not a ``RecursionError``; names start with ``prefix``.
    """
    odd: list[str] = []
    stack: list[tuple[Any, str, int]] = [(state, prefix, 0)]
    walked = 0
    while stack:
        node, name, depth = stack.pop()
        if isinstance(node, torch.Tensor):
            if not _plain(node):
                kind = "meta" if node.is_meta else str(node.layout).removeprefix("torch.")
                odd.append(f"{name} ({kind} {type(node).__name__} of {node.dtype})")
            continue
        if isinstance(node, Mapping):
            items: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list | tuple):
            items = enumerate(node)
        else:
            continue
        if depth == MAX_DEPTH:
            odd.append(f"{_shown(name)} (containers nested deeper than {MAX_DEPTH})")
            continue
        walked += len(node)
        if walked > MAX_VALUES:  # (before looking at them: a bomb is refused at once)
            where = _shown(name) or "the state"
            return [
                *odd,
                f"{where} (more than {MAX_VALUES} values in all, each reference counted)",
            ]
        values = node.values() if isinstance(node, Mapping) else node
        if not any(issubclass(kind, _WALKED) for kind in set(map(type, values))):
            continue  # plain values only (a list of actions): looked at no further
        inner = [
            (value, f"{name}.{key}" if name else str(key), depth + 1)
            for key, value in items
            if isinstance(value, _WALKED)
        ]
        stack.extend(reversed(inner))
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


class _Weighted(Protocol):
    def state_dict(self) -> dict[str, Any]: ...


def checked_weights(saved: Any, module: _Weighted, entry: str) -> dict[str, torch.Tensor]:
    """``saved`` as ``module.load_state_dict`` may take it, once it fits the module's own.

    Checked by :func:`saved_like` (names, dtypes, shapes, finite values), and carrying the
    module's own ``_metadata`` (per-module versions and flags), never the file's: its flags
    could make the load put the file's tensors in place of the parameters, which the optimizer
    would then no longer update, or be of a kind torch fails on.

    Raises:
        ValueError: ``saved`` does not fit, naming the place.
    """
    own = module.state_dict()
    saved_like(saved, own, entry)
    weights: dict[str, torch.Tensor] = OrderedDict((key, saved[key]) for key in own)
    weights._metadata = getattr(own, "_metadata", None)  # type: ignore[attr-defined]
    return weights


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
