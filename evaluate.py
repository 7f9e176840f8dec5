"""Evaluate a checkpoint: ``python evaluate.py ckpt=PATH`` or ``run_dir=RUN_FOLDER``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import rl.engine.run


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Evaluate on a fixed, seeded episode list and write the JSON next to the checkpoint."""
    rl.engine.run.evaluate(cfg)


if __name__ == "__main__":
    main()
