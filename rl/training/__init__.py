"""Training: the loop, the updates, logging, checkpoint state, callbacks and stopping."""

from rl.training.callbacks import Callback, RolloutInfo
from rl.training.learner import Learner
from rl.training.metrics import TrainingMetrics
from rl.training.state import CHECKPOINT_FORMAT, RunRecord, TrainerState, rank_view
from rl.training.stopping import (
    EXIT_REQUEUE,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    StopAgreement,
    TrainingStopped,
    stop_on_signals,
)
from rl.training.trainer import OnPolicyTrainer

__all__ = [
    "CHECKPOINT_FORMAT",
    "EXIT_REQUEUE",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "Callback",
    "Learner",
    "OnPolicyTrainer",
    "RolloutInfo",
    "RunRecord",
    "StopAgreement",
    "TrainerState",
    "TrainingMetrics",
    "TrainingStopped",
    "rank_view",
    "stop_on_signals",
]
