"""The errors of checkpoint files and of the configs saved in them."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or read."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint holds what this code never writes (never skipped for an older one).

    Its saved config names code the user's config tree does not, or its weights or statistics
    hold NaN or infinity.
    """
