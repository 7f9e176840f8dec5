"""The engine's entry: :func:`train` and :func:`evaluate`, the composition root behind the CLIs.

``run`` builds every part of a run from its config and drives it; ``settings`` verifies a whole
training config; ``sweeps`` serves Hydra's multiruns.
"""

from rl.engine.run import evaluate, train

__all__ = ["evaluate", "train"]
