"""Collection: producing filled rollouts for the learner.

``base`` holds the seam (:class:`Collector`, :class:`RolloutRequest`, :class:`Rollout`);
``local`` its in-process implementation (:class:`InProcessCollector`: a sampler stepped with the
learner's own policy through the step runner, :mod:`rl.sampling.runner`, with ``acting``'s
recording actor; ``teacher_forcing``; forced scene advance, straggler preemption); ``episodes``
runs fixed lists of seeded episodes (evaluation) with ``acting``'s policy actor, which probe
videos and the inference agent share. Collection workers (``collector=process``
or ``collector=ray``) are :mod:`rl.collection.worker` (one worker), :mod:`rl.collection.hosts`
(its process or Ray actor), :mod:`rl.collection.worker_set` (the set a learner drives, with
:mod:`~rl.collection.worker_calls`: its calls and watchdog, :mod:`~rl.collection.async_collection`:
barrier-free collection, :mod:`~rl.collection.worker_config`: its settings,
:mod:`~rl.collection.transport` and :mod:`~rl.utils.shared_memory`: how rollouts travel),
imported on demand.
"""

from rl.collection.acting import NoExpertError, PolicyActor
from rl.collection.base import CollectionSpec, Collector, Rollout, RolloutRequest
from rl.collection.episodes import (
    EvalResult,
    EvalSampler,
    episode_seed_list,
    evaluate_expert,
    evaluate_policy,
)
from rl.collection.local import InProcessCollector

__all__ = [
    "CollectionSpec",
    "Collector",
    "EvalResult",
    "EvalSampler",
    "InProcessCollector",
    "NoExpertError",
    "PolicyActor",
    "Rollout",
    "RolloutRequest",
    "episode_seed_list",
    "evaluate_expert",
    "evaluate_policy",
]
