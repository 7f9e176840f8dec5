"""rl: a Hydra-configured on-policy RL framework (``rl.engine.train`` is where a run starts)."""
