"""Train an agent: ``python train.py +experiment=ppo_nav [overrides...]``.

Exit codes: 0 done; 143 stopped by SIGTERM, 3 by SIGUSR1 (requeue), 130 by Ctrl-C (each after
saving a checkpoint; continue with ``resume=RUN_DIR``); 1 on errors.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

import rl.engine.run
from rl.engine.resume import EXIT_SIGINT, TrainingStopped


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Compose, verify and run; return the sweep objective (``optimized_metric``), if set."""
    try:
        metrics = rl.engine.run.train(cfg)
    except TrainingStopped as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("aborted (Ctrl-C twice); the last checkpoint on disk is valid", file=sys.stderr)
        sys.exit(EXIT_SIGINT)
    key = cfg.get("optimized_metric")
    if key is None:
        return None
    if key not in metrics:
        raise KeyError(f"optimized_metric={key!r} was never logged; logged: {sorted(metrics)}")
    return float(metrics[key])


if __name__ == "__main__":
    main()
