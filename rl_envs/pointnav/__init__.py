"""PointNav on a grid: reach a goal given as a GPS+compass vector, through rooms and doorways.

- :mod:`~rl_envs.pointnav.env`: :class:`PointNavEnv` (``task=nav``, ``nav_small``), a MiniGrid
  environment with train/valid/test layouts, the shortest-path expert and SPL;
- :mod:`~rl_envs.pointnav.batched`: the same task for N environments at once in torch (what
  ``sampler=batched`` steps; ``PointNavEnv.batched_env`` names it);
- :mod:`~rl_envs.pointnav.multi`: several agents in one layout (``task=nav_multi``), a
  PettingZoo Parallel environment;
- :mod:`~rl_envs.pointnav.layout`, :mod:`~rl_envs.pointnav.view`,
  :mod:`~rl_envs.pointnav.checks`: the layouts, the agent's view and the argument checks the
  forms share.
"""

from rl_envs.pointnav.env import Actions, PointNavEnv

__all__ = ["Actions", "PointNavEnv"]
