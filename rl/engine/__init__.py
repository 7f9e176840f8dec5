"""The engine behind the CLIs: :func:`train` and :func:`evaluate` (from :mod:`rl.engine.run`).

Both load ``run`` (and torch) on first use: ``train.py`` imports ``rl.engine.sweeps`` for its
resolver before Hydra composes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rl.engine import run

        return getattr(run, name)
    raise AttributeError(f"module 'rl.engine' has no attribute {name!r}")
