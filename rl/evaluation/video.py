"""Probe videos (AllenAct's ``probe``): one full episode of the current policy, as a video.

Every ``video_interval`` env steps, :class:`ProbeVideo` plays the same episode with the current
policy (actions from its own generator: training's random streams are untouched) and writes
``<run>/videos/step_<N>.mp4`` (a GIF without ffmpeg), each frame captioned with the step, action,
reward and return.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rl.collection.episodes import PolicyActor
from rl.collection.normalization import Normalizer
from rl.loggers.base import MetricsLogger
from rl.models.policy import Policy
from rl.sampling.agents import agent_rows
from rl.sampling.base import Sampler, finished_episodes, run_steps
from rl.sampling.serial import SerialSampler
from rl.training.callbacks import Callback, RolloutInfo
from rl.training.trainer import OnPolicyTrainer
from rl.utils.files import run_subdir, write_atomic, write_atomic_by_name

log = logging.getLogger(__name__)


def _pad_frame(frame: np.ndarray, block: int = 16) -> np.ndarray:
    """Pad an ``[H, W, 3]`` frame to multiples of ``block`` (what video codecs want)."""
    h, w = frame.shape[:2]
    ph, pw = (-h) % block, (-w) % block
    if ph or pw:
        frame = np.pad(frame, ((0, ph), (0, pw), (0, 0)))
    return frame


def caption_frame(frame: np.ndarray, lines: Sequence[str], min_width: int = 320) -> np.ndarray:
    """``frame`` (``[H, W, 3]`` uint8) enlarged to at least ``min_width`` with ``lines`` under it.

    Enlarged by a whole factor (nearest neighbour), so that Pillow's built-in font stays readable
    under a 60x80 camera's frame.
    """
    from PIL import Image, ImageDraw

    frame = np.asarray(frame, dtype=np.uint8)
    scale = max(1, -(-min_width // frame.shape[1]))
    if scale > 1:
        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
    strip = Image.new("RGB", (frame.shape[1], 14 * len(lines) + 4))
    draw = ImageDraw.Draw(strip)
    for i, line in enumerate(lines):
        draw.text((4, 2 + 14 * i), line, fill=(255, 255, 255))
    return np.concatenate([frame, np.asarray(strip)], axis=0)


def _action_text(action: np.ndarray) -> str:
    if action.ndim == 0:
        return str(action.item())
    return np.array2string(action, precision=2, separator=",", suppress_small=True)


def write_video(frames: Sequence[np.ndarray], path: Path, fps: int = 8) -> Path:
    """Write ``[H, W, 3]`` uint8 frames as the MP4 ``path``, else (no ffmpeg) a GIF beside it.

    Returns the path written. Atomic: a link under the name is replaced, never written through.

    Raises:
        UnsafePathError: ``path``'s folder is a link, or ``path`` is a folder.
    """
    padded = [_pad_frame(np.asarray(f, dtype=np.uint8)) for f in frames]
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary the mp4 writer needs)
    except ImportError:
        from PIL import Image

        gif = path.with_suffix(".gif")
        images = [Image.fromarray(f) for f in padded]
        write_atomic(
            gif,
            lambda f: images[0].save(
                f,
                format="GIF",
                save_all=True,
                append_images=images[1:],
                duration=int(1000 / fps),
                loop=0,
            ),
            what="probe video",
        )
        return gif

    def write_mp4(tmp: Path) -> None:
        writer = imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=16)
        with writer:  # (its __enter__ is typed as the base class, without append_data)
            for frame in padded:
                writer.append_data(frame)

    write_atomic_by_name(path, write_mp4, what="probe video")
    return path


def rendering_sampler(task: Mapping[str, Any], seed: int) -> Sampler:
    """One environment of ``task`` rendering RGB frames; each ``reset()`` plays ``seed``'s episode.

    A multi-agent task's has one row per agent (:class:`~rl.sampling.agents.AgentRows`).
    """
    return agent_rows(
        SerialSampler(
            task={**task, "render_mode": "rgb_array"},
            num_envs=1,
            episode_seeds=[seed],
            timeout=None,
        )
    )


def _one(actions: np.ndarray) -> np.ndarray:
    """One environment's action (every agent's, with several)."""
    return actions[0] if len(actions) == 1 else actions


def _frame(sampler: Sampler) -> np.ndarray:
    frame = sampler.render(0)  # type: ignore[attr-defined]
    if frame is None:
        raise ValueError(
            "the probe video's environment rendered nothing: its constructor must take "
            'render_mode="rgb_array"'
        )
    return np.asarray(frame)


@torch.no_grad()
def record_episode(
    *,
    model: Policy,
    sampler: Sampler,
    device: torch.device | str,
    generator: torch.Generator | None = None,
    max_frames: int = 2_000,
    normalizer: Normalizer | None = None,
    captions: bool = False,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Run ``model`` for the episode of a :func:`rendering_sampler`, one frame per step.

    The policy acts as in evaluation, its sampled actions drawn from ``generator`` (the global RNG
    untouched), for at most ``max_frames`` steps; its train/eval mode is restored afterwards.
    ``captions``: each frame shows the step, the action taken to reach it, its reward and the
    return so far, the last one the episode's metrics.

    Returns:
        The frames (the first observation's included) and ``{"return", "length"}`` plus the
        task's episode metrics (those only when the episode ended within ``max_frames``).
    """
    was_training = model.training
    model.eval()
    actor = PolicyActor(
        model, sampler.num_envs, device=device, deterministic=False, generator=generator,
        normalizer=normalizer,
    )  # fmt: skip
    frames = []
    lines = [["step 0  (reset)", ""]]
    total, metrics = 0.0, {}

    def on_step(t: int, step: TensorDict, result: TensorDict) -> bool:
        nonlocal total, metrics
        frames.append(_frame(sampler))
        reward = float(result["rewards"].sum())  # the team's, with several agents
        total += reward
        action = _action_text(_one(step["actions"].cpu().numpy()))
        text = f"step {t + 1}  action {action}  reward {reward:+.2f}  return {total:.2f}"
        lines.append([text, ""])
        for episode in finished_episodes(result):
            metrics = episode.metrics
        return False

    try:
        first = sampler.reset()
        frames.append(_frame(sampler))
        run_steps(sampler, actor, actor.start(first), on_step, max_steps=max_frames)
    finally:
        model.train(was_training)
    length = len(frames) - 1
    task_metrics = {k: v for k, v in metrics.items() if k not in ("return", "length")}
    if captions:
        end = "  ".join(f"{k} {v:.2f}" for k, v in task_metrics.items()) or "episode cut"
        lines[-1][1] = f"end: {end}" if metrics else "(cut)"
        frames = [caption_frame(f, text) for f, text in zip(frames, lines, strict=True)]
    # The sampler's own sum where the episode ended (the rewards as the env gave them).
    total = metrics.get("return", total)
    return frames, {"return": total, "length": float(length), **task_metrics}


class ProbeVideo(Callback):
    """Trainer callback: every ``interval`` env steps, record one episode as a video.

    Args:
        task: Plain task config (its ``_target_`` must accept ``render_mode``).
        output_dir: The run folder.
        seed: Reset seed of the recorded episode: the same episode every time, to compare
            policies.
    """

    def __init__(
        self,
        *,
        task: Mapping[str, Any],
        output_dir: Path,
        interval: int,
        seed: int = 0,
        device: torch.device | str,
    ) -> None:
        if interval < 1:
            raise ValueError(f"video_interval must be >= 1, got {interval}")
        self.task = dict(task)
        self.output_dir = Path(output_dir)
        self.interval = interval
        self.seed = seed
        self.device = torch.device(device)
        self._sampler: Sampler | None = None

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        """Record when this rollout crossed a multiple of ``interval``."""
        if info.crossed(self.interval):
            normalizer = getattr(trainer.collector, "normalizer", None)
            self.record(trainer.model, info.total_steps, trainer.logger, normalizer)

    def record(
        self,
        model: Policy,
        step: int,
        logger: MetricsLogger | None = None,
        normalizer: Normalizer | None = None,
    ) -> Path:
        """Record one episode with ``model`` now and save it as ``videos/step_<step>``.

        Raises:
            UnsafePathError: The run's ``videos`` is a link or not a folder (checked first).
        """
        folder = run_subdir(self.output_dir, "videos")
        if self._sampler is None:
            self._sampler = rendering_sampler(self.task, self.seed)
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        frames, metrics = record_episode(
            model=model,
            sampler=self._sampler,
            device=self.device,
            generator=generator,
            normalizer=normalizer,
            captions=True,
        )
        path = write_video(frames, folder / f"step_{step:012d}.mp4")
        log.info(
            "probe video %s (%d frames, return %.2f)", path.name, len(frames), metrics["return"]
        )
        if logger is not None:
            logger.log_video(step, path)
        return path

    def close(self) -> None:
        """Close the rendering environment."""
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None
