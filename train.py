"""Train an agent: ``python train.py +experiment=ppo_nav [overrides...]``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import rl.engine.run


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Compose, verify and run; return the sweep objective (``optimized_metric``), if set."""
    metrics = rl.engine.run.train(cfg)
    key = cfg.get("optimized_metric")
    if key is None:
        return None
    if key not in metrics:
        raise KeyError(f"optimized_metric={key!r} was never logged; logged: {sorted(metrics)}")
    return float(metrics[key])


if __name__ == "__main__":
    main()
