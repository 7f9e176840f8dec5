"""Metric sinks (console with progress bar, JSONL file, wandb, TensorBoard) behind one logger."""

from rl.loggers.base import MetricsLogger, MetricsSink, RunContext
from rl.loggers.console import ConsoleSink
from rl.loggers.factory import build_logger
from rl.loggers.jsonl import JsonlSink
from rl.loggers.tensorboard import TensorBoardSink
from rl.loggers.wandb import WandbSink

__all__ = [
    "ConsoleSink",
    "JsonlSink",
    "MetricsLogger",
    "MetricsSink",
    "RunContext",
    "TensorBoardSink",
    "WandbSink",
    "build_logger",
]
