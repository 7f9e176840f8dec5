"""Collection: producing filled rollouts for the learner.

``base`` is the seam (:class:`Collector`, :class:`RolloutRequest`, :class:`Rollout`), ``local``
collects in this process and ``episodes`` runs seeded episode lists (evaluation). The collection
workers (``collector=process`` or ``ray``: ``worker_set`` and its modules) are imported on demand.
"""

from rl.collection.base import CollectionSpec, Collector, Rollout, RolloutRequest
from rl.collection.episodes import (
    EvalResult,
    EvalSampler,
    PolicyActor,
    episode_seed_list,
    evaluate_expert,
    evaluate_policy,
)
from rl.collection.local import InProcessCollector
from rl.sampling.base import NoExpertError

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
