"""Samplers: batches of environments stepped for the engine.

``SerialSampler`` steps every environment in this process (debugging, tests);
``MultiprocessSampler`` steps them in worker processes through shared memory. Both take the
same keyword arguments (``task``, ``num_envs``, ``seed``, ``episode_seeds``, ...) and return
bitwise the same results; :func:`build_sampler` builds either from a sampler config.
"""

from rl.sampling.base import EpisodeRecord, Sampler, StepBatch
from rl.sampling.factory import build_sampler
from rl.sampling.multiprocess import MultiprocessSampler, SamplerWorkerError
from rl.sampling.serial import SerialSampler, build_env, dict_space

__all__ = [
    "EpisodeRecord",
    "MultiprocessSampler",
    "Sampler",
    "SamplerWorkerError",
    "SerialSampler",
    "StepBatch",
    "build_env",
    "build_sampler",
    "dict_space",
]
