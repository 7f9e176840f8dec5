"""Samplers: batches of environments stepped for the engine.

``SerialSampler`` steps every environment in this process (debugging, tests);
``MultiprocessSampler`` steps them in child processes through shared memory;
``BatchedSampler`` steps one batched environment (:mod:`rl.tasks.batched`: a task's own, written
in torch on any device, or gymnasium's vector environments over copies of the task's). They take
the same keyword arguments (``task``, ``num_envs``, ``seed``, ``episode_seeds``, ...) and return
bitwise the same results, one ``TensorDict`` per step (:func:`step_tensordict`: observations,
rewards, flags and the task's own step fields, :mod:`rl.tasks.fields`); :func:`build_sampler`
builds any of them from a sampler config. ``convert`` names their episode metrics.
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
    if name == "SamplerWorkerError":  # (renamed: "worker" means a collection worker)
        import warnings

        warnings.warn(
            "rl.sampling.SamplerWorkerError is now rl.sampling.SamplerProcessError",
            DeprecationWarning,
            stacklevel=2,
        )
        return SamplerProcessError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
