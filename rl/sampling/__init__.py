"""Samplers: batches of environments stepped for the engine."""

from rl.sampling.base import EpisodeRecord, Sampler, StepBatch
from rl.sampling.serial import SerialSampler, build_env, dict_space

__all__ = ["EpisodeRecord", "Sampler", "SerialSampler", "StepBatch", "build_env", "dict_space"]
