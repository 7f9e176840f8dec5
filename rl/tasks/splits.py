"""Disjoint train/validation/test episode splits, shared by the navigation tasks.

A task describes each episode's layout (its floorplan: what a held-out split must not share with
training) by an integer key. :func:`split_of` hashes the key into ten buckets, eight for
``train`` and one each for ``valid`` and ``test``, so layouts of different splits are disjoint by
construction. :func:`draw_in_split` draws episodes until one's layout falls in the wanted split
(1.25 draws on average for ``train``, 10 for the others).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["MAX_SPLIT_DRAWS", "SPLITS", "draw_in_split", "split_of"]

SPLITS = ("train", "valid", "test")
_BUCKETS = ("train",) * 8 + ("valid", "test")
MAX_SPLIT_DRAWS = 10_000  # draws before a split is declared empty (too few layouts)

T = TypeVar("T")


def split_of(key: int) -> str:
    """The split of a layout with integer ``key`` (a fixed multiplicative hash, ten buckets)."""
    bucket = ((key * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF) % 10
    return _BUCKETS[bucket]


def draw_in_split(draw: Callable[[], T], key: Callable[[T], int], split: str | None) -> T:
    """Call ``draw`` until its result's layout ``key(drawn)`` falls in ``split`` (None: any)."""
    drawn = draw()
    if split is None:
        return drawn
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
    for _ in range(MAX_SPLIT_DRAWS):
        if split_of(key(drawn)) == split:
            return drawn
        drawn = draw()
    raise ValueError(
        f"split {split!r}: no episode of it in {MAX_SPLIT_DRAWS} draws; the task has too few "
        "layouts to split"
    )
