"""rl: a Hydra-configured on-policy RL framework."""
