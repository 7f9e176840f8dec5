"""The errors of checkpoint files and of the configs saved in them."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found or read."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint's saved config names code the user's config tree does not (never skipped)."""


__all__ = ["CheckpointError", "UntrustedCheckpointError"]
