"""The engine's entry: :func:`train` and :func:`evaluate`, the composition root behind the CLIs.

``run`` builds every part of a run from its config and drives it; ``settings`` verifies a whole
training config; ``sweeps`` serves Hydra's multiruns. ``train`` and ``evaluate`` load ``run``
(and torch) on first use: ``train.py`` imports ``sweeps`` for its resolver before Hydra composes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rl.engine import run

        return getattr(run, name)
    raise AttributeError(f"module 'rl.engine' has no attribute {name!r}")
