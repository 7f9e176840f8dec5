"""Counting helpers with AllenAct's semantics."""

from __future__ import annotations


def evenly_distribute_count_into_bins(count: int, nbins: int) -> list[int]:
    """``nbins`` positive integers summing to ``count >= nbins``, differing by at most 1.

    The larger ones come first (AllenAct's order).
    """
    if nbins <= 0:
        raise ValueError(f"nbins must be positive, got {nbins}")
    if count < nbins:
        raise ValueError(f"count ({count}) must be >= nbins ({nbins})")
    base, extra = divmod(count, nbins)
    return [base + 1 if i < extra else base for i in range(nbins)]
