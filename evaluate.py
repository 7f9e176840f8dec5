"""Evaluate a checkpoint: ``python evaluate.py ckpt=PATH`` or ``run_dir=RUN_FOLDER``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import rl.utils.config  # noqa: F401  (light: its resolvers, before Hydra composes)
from rl.engine.sweeps import load_engine


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Evaluate on a fixed, seeded episode list and write the JSON next to the checkpoint.

    Hydra's folder for the command (``outputs/evaluate/<time>``) is removed afterwards unless
    something was written into it (``test_expert`` without a run writes its result there).
    """
    engine = load_engine()
    from rl.engine.cli import config_errors_reported, discard_hydra_folder

    with config_errors_reported():
        engine.evaluate(cfg)
    discard_hydra_folder()


if __name__ == "__main__":
    main()
