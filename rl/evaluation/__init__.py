"""Evaluation: of checkpoints, of the policy while it trains, and of the task's expert.

``runs`` is ``evaluate.py``, ``compare`` is ``python -m rl.compare``; ``training_eval``,
``validation`` and ``video`` are trainer callbacks; ``inference`` and ``export`` use a trained
policy outside the engine. The seeded episode lists are :mod:`rl.collection.episodes`'.
"""

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
from rl.sampling.base import NoExpertError

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
