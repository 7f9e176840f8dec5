"""Metric sinks behind one logger: console, metrics and episodes files, wandb, TensorBoard."""

from rl.loggers.base import MetricsLogger, MetricsSink, RunContext
from rl.loggers.console import ConsoleSink
from rl.loggers.factory import build_logger
from rl.loggers.files import EpisodeCsvSink, JsonlSink
from rl.loggers.tensorboard import TensorBoardSink
from rl.loggers.wandb import WandbSink

__all__ = [
    "ConsoleSink",
    "EpisodeCsvSink",
    "JsonlSink",
    "MetricsLogger",
    "MetricsSink",
    "RunContext",
    "TensorBoardSink",
    "WandbSink",
    "build_logger",
]
