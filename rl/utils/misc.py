"""Counting and dictionary helpers with AllenAct's semantics."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


def evenly_distribute_count_into_bins(count: int, nbins: int) -> list[int]:
    """Distribute ``count`` into ``nbins`` bins as evenly as possible.

    Args:
        count: A positive integer to distribute, ``count >= nbins``.
        nbins: The number of bins.

    Returns:
        ``nbins`` positive integers summing to ``count``, differing by at most 1; the larger
        ones come first (AllenAct's order).
    """
    if nbins <= 0:
        raise ValueError(f"nbins must be positive, got {nbins}")
    if count < nbins:
        raise ValueError(f"count ({count}) must be >= nbins ({nbins})")
    base, extra = divmod(count, nbins)
    return [base + 1 if i < extra else base for i in range(nbins)]


def recursive_update(
    original: MutableMapping[str, Any], update: MutableMapping[str, Any] | dict[str, Any]
) -> MutableMapping[str, Any]:
    """Recursively update ``original`` in place with the entries of ``update``.

    Nested mappings are merged key by key; any other value replaces the original one.

    Args:
        original: Mapping to update (modified in place).
        update: Mapping with additional or replacement entries.

    Returns:
        ``original``, updated.
    """
    for key, value in update.items():
        if isinstance(value, MutableMapping) and isinstance(original.get(key), MutableMapping):
            recursive_update(original[key], value)
        else:
            original[key] = value
    return original
