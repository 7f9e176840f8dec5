"""The engine's entry: :func:`train` and :func:`evaluate`, the composition root behind the CLIs.

``run`` builds every part of a run from its config section and drives it; ``settings`` types
the run's own keys and verifies a whole training config; ``sweeps`` gives Hydra's sweepers their
objective and logs failing multirun jobs. The parts themselves live in their own packages:
:mod:`rl.training` (the loop), :mod:`rl.collection` (rollouts), :mod:`rl.evaluation`,
:mod:`rl.checkpoints`, and the building blocks below them.
"""

from rl.engine.run import evaluate, train

__all__ = ["evaluate", "train"]
