"""Evaluation: of checkpoints, of the policy while it trains, and of the task's expert.

:mod:`rl.collection.episodes` runs fixed, seeded episode lists (every episode exactly once;
re-exported here, and collection workers run them too); ``runs`` evaluates
checkpoints in bulk for ``evaluate.py`` (summaries, plots); the trainer callbacks watching a run
are ``training_eval`` (``eval/*`` during and after training), ``validation`` (each checkpoint in
a separate process) and ``video`` (probe videos); ``settings`` types the ``eval`` and ``valid``
sections; ``inference`` uses a trained policy outside the engine, and ``export`` writes it for
use without the framework (ONNX, ``torch.export``).
"""

from rl.collection.acting import NoExpertError
from rl.collection.episodes import (
    EvalResult,
    EvalSampler,
    episode_seed_list,
    evaluate_expert,
    evaluate_policy,
)
from rl.evaluation.export import ExportError, export_checkpoint, export_policy
from rl.evaluation.inference import InferenceAgent
from rl.evaluation.settings import EvalSettings, ValidSettings
from rl.evaluation.training_eval import TrainingEvaluation
from rl.evaluation.validation import BackgroundValidation
from rl.evaluation.video import ProbeVideo

__all__ = [
    "BackgroundValidation",
    "EvalResult",
    "EvalSampler",
    "EvalSettings",
    "ExportError",
    "InferenceAgent",
    "NoExpertError",
    "ProbeVideo",
    "TrainingEvaluation",
    "ValidSettings",
    "episode_seed_list",
    "evaluate_expert",
    "evaluate_policy",
    "export_checkpoint",
    "export_policy",
]
