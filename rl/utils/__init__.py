"""Small helpers shared across the library.

Names load their modules on first use, so ``rl.utils.config`` (imported by ``train.py`` before
Hydra composes) loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "env_seeds": "rl.utils.seeding",
    "set_seed": "rl.utils.seeding",
    "evenly_distribute_count_into_bins": "rl.utils.misc",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rl.utils' has no attribute {name!r}")
