"""Samplers: batches of environments stepped for the engine.

``SerialSampler`` steps them in this process, ``MultiprocessSampler`` in child processes through
shared memory, ``BatchedSampler`` as one batched environment. All take the same keyword arguments
and return bitwise the same step ``TensorDict`` (:func:`step_tensordict`).
"""

from rl.sampling.base import (
    EpisodeRecord,
    Sampler,
    decode_episodes,
    finished_episodes,
    step_tensordict,
)
from rl.sampling.batched import BatchedSampler
from rl.sampling.convert import episode_metric_key
from rl.sampling.factory import build_sampler, sampler_num_envs
from rl.sampling.multiprocess import MultiprocessSampler, SamplerProcessError
from rl.sampling.serial import SerialSampler

__all__ = [
    "BatchedSampler",
    "EpisodeRecord",
    "MultiprocessSampler",
    "Sampler",
    "SamplerProcessError",
    "SerialSampler",
    "build_sampler",
    "decode_episodes",
    "episode_metric_key",
    "finished_episodes",
    "sampler_num_envs",
    "step_tensordict",
]


def __getattr__(name: str) -> object:
    """Old names of this package, with a warning naming the new one."""
    if name == "SamplerWorkerError":
        import warnings

        warnings.warn(
            "rl.sampling.SamplerWorkerError is now rl.sampling.SamplerProcessError",
            DeprecationWarning,
            stacklevel=2,
        )
        return SamplerProcessError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
