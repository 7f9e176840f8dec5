"""Train and evaluate from Python (a script, a notebook) with the command line's overrides.

::

    import rl

    run = rl.train("+experiment=ppo_cartpole", "total_env_steps=50_000", "seed=2")
    print(run.run_dir, run.metrics["eval/episodic_return"])
    results = rl.evaluate(f"run_dir={run.run_dir}", "num_episodes=50")

Each call composes ``conf/`` (or ``config_dir``) with the overrides exactly as ``train.py`` /
``evaluate.py`` do, so a run made here is a run like any other. Torch runs on one thread unless
``torch_threads=`` says otherwise (``auto``: the CLI's default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, open_dict, read_write

PROJECT_CONF = Path(__file__).resolve().parents[1] / "conf"

__all__ = ["Run", "compose", "evaluate", "train"]


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished training run.

    Attributes:
        run_dir: Its folder (checkpoints, ``metrics.jsonl``, ``config.yaml``).
        metrics: The final metrics (``eval/*`` included when the run evaluated).
    """

    run_dir: Path
    metrics: dict[str, float]


@contextmanager
def _hydra(config_dir: str | Path | None) -> Iterator[None]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        raise RuntimeError(
            "rl.train/rl.evaluate compose their own config: call them outside a Hydra app "
            "(inside one, build the config there and call rl.engine.train(cfg))"
        )
    folder = Path(config_dir or PROJECT_CONF).expanduser().resolve()
    with initialize_config_dir(version_base="1.3", config_dir=str(folder)):
        yield


def compose(
    *overrides: str, config_name: str = "train", config_dir: str | Path | None = None
) -> DictConfig:
    """The config ``train.py`` (``config_name="evaluate"``: ``evaluate.py``) would run.

    The run folder is Hydra's (``outputs/<exp_name>/<time>``) unless ``output_dir=`` is given.
    Edit the result in Python (``cfg.task = {...}``: whole nodes an override cannot write) and
    pass it to :func:`train` as ``cfg=``.
    """
    from hydra import compose as hydra_compose
    from hydra.core.hydra_config import HydraConfig

    import rl.utils.config  # noqa: F401  (its resolvers: the presets' ${task_name:})

    typed = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if config_name == "train" and "torch_threads" not in typed:
        overrides = ("torch_threads=1", *overrides)  # (the CLI's auto: slower for small models)
    with _hydra(config_dir):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):  # what a Hydra app's runtime holds, for ${hydra:...} interpolations
        cfg.hydra.runtime.output_dir = str(Path(cfg.hydra.run.dir).resolve())
    HydraConfig.instance().set_config(cfg)
    return cfg


def train(
    *overrides: str, cfg: DictConfig | None = None, config_dir: str | Path | None = None
) -> Run:
    """Train as ``python train.py OVERRIDES...`` does; the run's folder and final metrics.

    Args:
        *overrides: Hydra overrides, e.g. ``"+experiment=ppo_nav"``, ``"seed=2"``.
        cfg: Instead of overrides: a config from :func:`compose`, edited in Python.
        config_dir: The config tree (default: this project's ``conf/``).

    Raises:
        rl.utils.config.ConfigError: The config cannot run (every problem listed).
        rl.training.stopping.TrainingStopped: A signal stopped training after a checkpoint.
    """
    import rl.engine.run

    if cfg is None:
        cfg = compose(*overrides, config_dir=config_dir)
    elif overrides:
        raise TypeError("rl.train: give overrides or cfg=, not both (compose them together)")
    elif "hydra" in cfg:  # its ${hydra:...} values are its own, whatever was composed since
        from hydra.core.hydra_config import HydraConfig

        with read_write(cfg.hydra), open_dict(cfg):  # its folder named after it as edited
            cfg.hydra.runtime.output_dir = str(Path(cfg.hydra.run.dir).resolve())
        HydraConfig.instance().set_config(cfg)
    metrics = rl.engine.run.train(cfg)
    if cfg.get("resume"):  # trained in the resumed run's folder, not the one composed now
        from rl.checkpoints.resume import resume_run_dir

        return Run(resume_run_dir(cfg.resume), metrics)
    return Run(Path(cfg.output_dir), metrics)


def evaluate(*overrides: str, config_dir: str | Path | None = None) -> dict[str, float]:
    """Evaluate as ``python evaluate.py OVERRIDES...`` does (``run_dir=`` or ``ckpt=``).

    Returns:
        The last evaluated checkpoint's ``eval/*`` metrics (written beside it as
        ``evaluate.py`` writes them).
    """
    import rl.engine.run

    cfg = compose(*overrides, config_name="evaluate", config_dir=config_dir)
    return rl.engine.run.evaluate(cfg)
