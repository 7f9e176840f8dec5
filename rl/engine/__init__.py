"""The engine shared by ``train.py`` and ``evaluate.py``."""

from rl.engine.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl.engine.evaluator import EvalResult, episode_seed_list, evaluate_policy
from rl.engine.inference import InferenceAgent
from rl.engine.trainer import OnPolicyTrainer

__all__ = [
    "CheckpointError",
    "EvalResult",
    "InferenceAgent",
    "OnPolicyTrainer",
    "episode_seed_list",
    "evaluate_policy",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]
