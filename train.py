"""Train an agent: ``python train.py +experiment=ppo_nav [overrides...]``.

Exit codes: 0 done; 143 stopped by SIGTERM, 3 by SIGUSR1 (requeue), 130 by Ctrl-C (each after
saving a checkpoint; continue with ``resume=RUN_DIR``); 1 on errors (a refused config: its message
alone, and no run folder left behind). In a multirun (``-m``) a
failing job is logged and the sweep goes on; it exits 1 at the end (see rl/engine/sweeps.py).
"""

from __future__ import annotations

import gc
import sys

import hydra
from omegaconf import DictConfig

import rl.engine.run
from rl.engine.cli import config_errors_reported
from rl.engine.sweeps import check_objective, failures_logged, objective
from rl.training.stopping import EXIT_SIGINT, TrainingStopped


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Compose, verify and run; return the sweep objective (``optimized_metric``), if set."""
    try:
        with config_errors_reported(), failures_logged():  # a failed job: in its train.log
            check_objective(cfg)
            return objective(rl.engine.run.train(cfg), cfg.get("optimized_metric"))
    except TrainingStopped as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("aborted (Ctrl-C twice); the last checkpoint on disk is valid", file=sys.stderr)
        sys.exit(EXIT_SIGINT)


if __name__ == "__main__":
    # What the imports made (torch's and tensordict's objects, millions) lives as long as the
    # process: frozen, the collector never walks it again, nor does Python's exit (~1 s).
    gc.freeze()
    main()
