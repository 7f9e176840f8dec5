"""Pipeline primitives: stages, settings, schedules, trackers, early stopping, config checks."""

from rl.pipeline.early_stopping import (
    EarlyStoppingCriterion,
    MetricThresholdCriterion,
    NeverEarlyStoppingCriterion,
)
from rl.pipeline.offpolicy import OffPolicyPipelineComponent
from rl.pipeline.schedules import (
    ConstantSchedule,
    LinearDecay,
    MultiLinearDecay,
    Schedule,
    step_lr_scheduler_to,
)
from rl.pipeline.stages import PipelineStage, TrainingPipeline, TrainingSettings
from rl.pipeline.trackers import ScalarMeanTracker
from rl.pipeline.verify import pipeline_errors

__all__ = [
    "ConstantSchedule",
    "EarlyStoppingCriterion",
    "LinearDecay",
    "MetricThresholdCriterion",
    "MultiLinearDecay",
    "NeverEarlyStoppingCriterion",
    "OffPolicyPipelineComponent",
    "PipelineStage",
    "ScalarMeanTracker",
    "Schedule",
    "TrainingPipeline",
    "TrainingSettings",
    "pipeline_errors",
    "step_lr_scheduler_to",
]
