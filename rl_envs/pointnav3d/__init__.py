"""PointNav from pixels in procedurally generated MiniWorld interiors (``task=nav3d``).

- :mod:`~rl_envs.pointnav3d.env`: :class:`PointNav3DEnv`, the gymnasium environment;
- :mod:`~rl_envs.pointnav3d.layout`: floorplans drawn from an episode's seed, split into
  train/valid/test;
- :mod:`~rl_envs.pointnav3d.grid`: the navigation grid (geodesic distances, SPL, the expert);
- :mod:`~rl_envs.pointnav3d.world`: the MiniWorld scene (imported when an environment is built:
  it starts OpenGL through EGL);
- :mod:`~rl_envs.pointnav3d.topdown` and :mod:`~rl_envs.pointnav3d.checks`: the top-down map
  of evaluation videos and the argument checks.
"""

from rl_envs.pointnav3d.env import PointNav3DEnv, RenderingUnavailableError

__all__ = ["PointNav3DEnv", "RenderingUnavailableError"]
