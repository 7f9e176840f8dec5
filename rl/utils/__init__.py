"""Small helpers shared across the library."""

from rl.utils.misc import evenly_distribute_count_into_bins
from rl.utils.seeding import env_seeds, set_seed

__all__ = ["env_seeds", "evenly_distribute_count_into_bins", "set_seed"]
