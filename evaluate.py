"""Evaluate a checkpoint: ``python evaluate.py ckpt=PATH`` or ``run_dir=RUN_FOLDER``."""

from __future__ import annotations

import gc

import hydra
from omegaconf import DictConfig

import rl.engine.run
from rl.engine.cli import config_errors_reported, discard_hydra_folder


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Evaluate on a fixed, seeded episode list and write the JSON next to the checkpoint.

    Hydra's folder for the command (``outputs/evaluate/<time>``) is removed afterwards unless
    something was written into it (``test_expert`` without a run writes its result there).
    """
    with config_errors_reported():
        rl.engine.run.evaluate(cfg)
    discard_hydra_folder()


if __name__ == "__main__":
    # What the imports made (torch's and tensordict's objects, millions) lives as long as the
    # process: frozen, the collector never walks it again, nor does Python's exit (~1 s).
    gc.freeze()
    main()
