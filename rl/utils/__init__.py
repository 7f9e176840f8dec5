"""Small helpers shared across the library."""

from rl.utils.misc import evenly_distribute_count_into_bins, recursive_update
from rl.utils.seeding import set_seed, worker_seeds

__all__ = ["evenly_distribute_count_into_bins", "recursive_update", "set_seed", "worker_seeds"]
