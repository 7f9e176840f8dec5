"""Small helpers shared across the library."""

from rl.utils.misc import evenly_distribute_count_into_bins
from rl.utils.seeding import set_seed, worker_seeds

__all__ = ["evenly_distribute_count_into_bins", "set_seed", "worker_seeds"]
