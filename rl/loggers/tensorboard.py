"""TensorBoard sink: scalars against env steps, probe videos, hyperparameters (HParams).

docs/howto/logging.md describes what a run shows there.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np
from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from rl.loggers.base import MetricsSink, RunContext
from rl.utils.files import run_subdir

# Settings shown in the HParams dashboard (where the config has them), beside the command line's.
HPARAM_KEYS = (
    "seed",
    "exp_name",
    "total_env_steps",
    "sampler.num_envs",
    "pipeline.num_steps",
    "pipeline.num_mini_batch",
    "pipeline.update_repeats",
    "pipeline.gamma",
    "pipeline.optimizer.lr",
)
# The metrics the dashboard sets against them (scalars the run logs under these names).
HPARAM_METRICS = (
    "eval/success",
    "eval/spl",
    "eval/episodic_return",
    "charts/success",
    "charts/episodic_return",
)


def run_hparams(config: Mapping[str, Any], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """:data:`HPARAM_KEYS` and the keys of ``overrides``, with their values in ``config``.

    Numbers, booleans and strings are kept as they are; anything else as its text.
    """
    keys = list(HPARAM_KEYS)
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" in override and not key.startswith("hydra") and key not in keys:
            keys.append(key)
    found: dict[str, Any] = {}
    for key in keys:
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            continue
        ok = isinstance(node, bool | int | float | str)
        found[key] = node if ok else str(node)
    return found


def _command_line_overrides() -> list[str]:
    """The Hydra job's command-line overrides (none outside Hydra: the Python API)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    except Exception:  # noqa: BLE001  (the dashboard is extra: never fail a run over it)
        return []


def gif_bytes(frames: list[np.ndarray], fps: int = 8) -> bytes:
    """An animated GIF of RGB ``[H, W, 3]`` uint8 frames."""
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    out = io.BytesIO()
    images[0].save(
        out, format="GIF", save_all=True, append_images=images[1:], duration=1000 // fps, loop=0
    )
    return out.getvalue()


class TensorBoardSink(MetricsSink):
    """Write metrics and probe videos to TensorBoard event files in ``<run>/<subdir>``.

    Args:
        context: The run (filled in by the engine).
        subdir: Folder of the event files inside the run folder (a link there is refused).
        flush_secs: How often the writer flushes to disk.
    """

    def __init__(
        self, *, context: RunContext, subdir: str = "tensorboard", flush_secs: int = 30
    ) -> None:
        context.path(subdir, "TensorBoardSink subdir")
        self.log_dir = run_subdir(context.output_dir, subdir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)
        params = run_hparams(context.config, _command_line_overrides())
        experiment, start, self._end = hparams(params, dict.fromkeys(HPARAM_METRICS, 0.0))
        file_writer = self.writer.file_writer
        assert file_writer is not None  # the writer opened its event file at construction
        file_writer.add_summary(experiment)
        file_writer.add_summary(start)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One scalar per metric at env step ``step`` (NaNs are skipped)."""
        for key, value in metrics.items():
            value = float(value)
            if not math.isnan(value):
                self.writer.add_scalar(key, value, global_step=step)

    def log_video(self, step: int, path: Path) -> None:
        """The video file ``path`` as an animated image under ``videos/probe``.

        (What ``SummaryWriter.add_video`` does, without its moviepy dependency.)
        """
        frames = [np.asarray(f)[..., :3] for f in imageio.mimread(str(path), memtest=False)]
        if not frames:
            return
        height, width = frames[0].shape[:2]
        image = Summary.Image(
            height=height, width=width, colorspace=3, encoded_image_string=gif_bytes(frames)
        )
        summary = Summary(value=[Summary.Value(tag="videos/probe", image=image)])
        file_writer = self.writer.file_writer
        assert file_writer is not None  # the writer opened its event file at construction
        file_writer.add_summary(summary, step)

    def close(self) -> None:
        """End the HParams session, flush and close the event file."""
        file_writer = self.writer.file_writer
        if file_writer is not None:
            file_writer.add_summary(self._end)
        self.writer.close()
