"""Collection: producing filled rollouts for the learner.

``base`` holds the seam (:class:`Collector`, :class:`RolloutRequest`, :class:`Rollout`);
``local`` its in-process implementation (:class:`InProcessCollector`: a sampler stepped with the
learner's own policy, teacher forcing, forced scene advance, straggler preemption).
"""

from rl.collection.base import Collector, Rollout, RolloutRequest
from rl.collection.local import InProcessCollector

__all__ = ["Collector", "InProcessCollector", "Rollout", "RolloutRequest"]
