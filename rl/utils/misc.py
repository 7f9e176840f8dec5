"""Counting helpers with AllenAct's semantics."""

from __future__ import annotations


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
