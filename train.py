"""Train an agent: ``python train.py +experiment=ppo_nav [overrides...]``.

Exit codes: 0 done; 143 stopped by SIGTERM, 3 by SIGUSR1 (requeue), 130 by Ctrl-C (each after
saving a checkpoint; continue with ``resume=RUN_DIR``); 1 on errors (a refused config: its message
alone, and no run folder left behind). In a multirun (``-m``) a
failing job is logged and the sweep goes on; it exits 1 at the end (see rl/engine/sweeps.py).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

# Light, and imported before Hydra composes: their resolvers (${task_name:}, ${job_dir_name:...})
# name the run's folder, in a launcher's job processes too. The engine (torch) loads in main().
import rl.utils.config  # noqa: F401
from rl.engine.sweeps import check_objective, failures_logged, load_engine, objective


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Compose, verify and run; return the sweep objective (``optimized_metric``), if set."""
    engine = load_engine()
    from rl.engine.cli import config_errors_reported
    from rl.training.stopping import EXIT_SIGINT, TrainingStopped

    try:
        with config_errors_reported(), failures_logged():  # a failed job: in its train.log
            check_objective(cfg)
            return objective(engine.train(cfg), cfg.get("optimized_metric"))
    except TrainingStopped as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("aborted (Ctrl-C twice); the last checkpoint on disk is valid", file=sys.stderr)
        sys.exit(EXIT_SIGINT)


if __name__ == "__main__":
    main()
