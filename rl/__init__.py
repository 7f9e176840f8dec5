"""rl: a Hydra-configured on-policy RL framework.

From Python: ``rl.train("+experiment=ppo_nav", "seed=2")`` and ``rl.evaluate("run_dir=...")``.
"""

from __future__ import annotations

from typing import Any

from rl.utils import dynamo as _dynamo

_dynamo.install()  # before any module of rl imports tensordict: see rl/utils/dynamo.py

__all__ = ["Run", "compose", "evaluate", "train"]


def __getattr__(name: str) -> Any:  # lazy: ``import rl.tasks`` does not load the engine
    if name in __all__:
        from rl import api

        return getattr(api, name)
    raise AttributeError(f"module 'rl' has no attribute {name!r}")
