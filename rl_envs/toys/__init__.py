"""Small tasks for tests and examples; each learns, or fails on purpose, in seconds.

- :mod:`~rl_envs.toys.spaces`: tasks exercising every supported kind of space (``MultiDiscrete``
  and ``Box`` actions, nested ``Dict``/``Tuple`` observations);
- :mod:`~rl_envs.toys.agents`: a PettingZoo Parallel environment whose agents leave the episode
  at different times;
- :mod:`~rl_envs.toys.corridor`: one task written per environment and batched in torch, the
  reference that a batched sampler returns what the serial one does;
- :mod:`~rl_envs.toys.debug`: environments that raise, exit, crash, hang, return NaN or run
  slowly when told (the samplers' and workers' fault tests). Importable in worker processes (no
  torch).
"""
