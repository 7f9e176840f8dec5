"""Validation during training: every new checkpoint evaluated in a separate process.

AllenAct's valid mode ran a separate process that looked for the newest checkpoint, and so
skipped checkpoints silently whenever it fell behind. Here the trainer hands each saved
checkpoint's *path* to one validation process (``on_checkpoint``) through a FIFO queue; the
process evaluates them in order, one by one, on the fixed validation episode list, and sends
the mean metrics back. The main process logs them as ``valid/*`` against each checkpoint's env
step (results are polled on every rollout end and drained at the end of training, before the
loggers close). Nothing is skipped: when a new checkpoint arrives while earlier ones are still
waiting, a warning says how many are pending.

The process gets plain data only (the resolved task and model configs, then checkpoint paths),
starts with an explicit ``forkserver``/``spawn`` context, runs with its own torch thread count,
exits when it is told to, when its parent dies, or on Ctrl-C, and is terminated by
:meth:`BackgroundValidation.close` on errors, so no process outlives the run.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl.engine.checkpoint import load_checkpoint, parse_checkpoint_name
from rl.engine.evaluator import episode_seed_list, evaluate_policy
from rl.loggers.base import MetricsLogger

log = logging.getLogger(__name__)

# Keys of the ``valid`` block of conf/train.yaml, with their defaults.
VALID_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "num_episodes": 50,
    "episode_seed": 2_000_000,
    "num_envs": 8,
    "deterministic": False,
    "action_seed": 0,
    "mp_start_method": "forkserver",
    "torch_threads": 1,
}
_POLL_SECONDS = 0.5


def verify_valid_cfg(cfg: Mapping[str, Any]) -> list[str]:
    """Problems of the ``valid`` block and ``video_interval`` of a resolved training config."""
    errors: list[str] = []
    valid = cfg.get("valid")
    if valid is not None and not isinstance(valid, Mapping):
        return [f"valid: expected a mapping, got {valid!r}"]
    valid = valid or {}
    errors += [
        f"valid.{key}: unknown key (known: {', '.join(sorted(VALID_DEFAULTS))})"
        for key in valid
        if key not in VALID_DEFAULTS
    ]
    for key in ("num_episodes", "num_envs", "torch_threads"):
        value = valid.get(key, VALID_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(f"valid.{key}: expected an int >= 1, got {value!r}")
    for key in ("episode_seed", "action_seed"):
        value = valid.get(key, VALID_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"valid.{key}: expected an int, got {value!r}")
    for key in ("enabled", "deterministic"):
        if not isinstance(valid.get(key, VALID_DEFAULTS[key]), bool):
            errors.append(f"valid.{key}: expected true or false, got {valid[key]!r}")
    method = valid.get("mp_start_method", VALID_DEFAULTS["mp_start_method"])
    if method not in ("forkserver", "spawn"):
        errors.append(f"valid.mp_start_method: expected forkserver or spawn, got {method!r}")
    interval = cfg.get("video_interval", 0)
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int) or interval < 0
    ):
        errors.append(f"video_interval: expected an int >= 0 (0: off), got {interval!r}")
    return errors


def _start_method(method: str) -> str:
    return method if method in mp.get_all_start_methods() else "spawn"


def _checkpoint_step(path: Path, state: Mapping[str, Any] | None = None) -> int:
    parsed = parse_checkpoint_name(path)
    if parsed is not None:
        return parsed[1]
    return int((state or load_checkpoint(path)).get("pipeline", {}).get("total_steps", 0))


def _validation_main(
    requests: Any,
    results: Any,
    task: dict[str, Any],
    model_cfg: dict[str, Any],
    settings: dict[str, Any],
    device: str,
) -> None:
    """Body of the validation process: evaluate each requested checkpoint, in order."""
    try:
        from rl.engine.run import build_model  # the child builds everything itself

        torch.set_num_threads(int(settings["torch_threads"]))
        model = build_model(model_cfg, task).to(device)
        seeds = episode_seed_list(int(settings["num_episodes"]), int(settings["episode_seed"]))
        parent = mp.parent_process()
        while True:
            try:
                item = requests.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return  # the trainer died without telling us: do not linger
                continue
            if item is None:
                return
            path, step = item
            t0 = time.perf_counter()
            try:
                state = load_checkpoint(path, map_location=device)
                model.load_state_dict(state["model"])
                result = evaluate_policy(
                    model=model,
                    task=task,
                    episode_seeds=seeds,
                    num_envs=int(settings["num_envs"]),
                    deterministic=bool(settings["deterministic"]),
                    action_seed=int(settings["action_seed"]),
                    device=device,
                )
                metrics = result.as_logged("valid")
                metrics["valid/seconds"] = time.perf_counter() - t0
                results.put(("ok", path, step, metrics))
            except Exception:  # noqa: BLE001  (reported to the trainer, which logs it)
                results.put(("error", path, step, traceback.format_exc()))
    except KeyboardInterrupt:
        return  # Ctrl-C reaches the whole process group; the trainer reports it


class BackgroundValidation:
    """Trainer hook and callback that validates every checkpoint in a separate process.

    Use ``on_checkpoint`` as the trainer's ``on_checkpoint`` hook and add the object to its
    callbacks (``on_rollout_end`` logs finished validations); call :meth:`finish` at the end
    of training (waits for every pending checkpoint, logs the results) and :meth:`close` in a
    ``finally`` (terminates the process if it is still running).

    Args:
        task: Plain (resolved) task config.
        model: Plain (resolved) model config.
        logger: The run's logger; ``valid/*`` is logged at each checkpoint's env step.
        num_episodes: Episodes of the validation list.
        episode_seed: First episode seed (episode ``i`` resets with ``episode_seed + i``).
        num_envs: Environments stepped together in the validation process.
        deterministic: Argmax actions instead of sampled ones.
        action_seed: Seed of the action generator (the same for every checkpoint).
        device: Where the validation model runs.
        mp_start_method: ``forkserver`` (falls back to ``spawn`` where missing) or ``spawn``.
        torch_threads: Torch threads of the validation process.
    """

    def __init__(
        self,
        *,
        task: Mapping[str, Any],
        model: Mapping[str, Any],
        logger: MetricsLogger,
        num_episodes: int = 50,
        episode_seed: int = 2_000_000,
        num_envs: int = 8,
        deterministic: bool = False,
        action_seed: int = 0,
        device: torch.device | str = "cpu",
        mp_start_method: str = "forkserver",
        torch_threads: int = 1,
    ) -> None:
        self.logger = logger
        self.settings = {
            "num_episodes": num_episodes,
            "episode_seed": episode_seed,
            "num_envs": num_envs,
            "deterministic": deterministic,
            "action_seed": action_seed,
            "torch_threads": torch_threads,
        }
        self.submitted: list[tuple[str, int]] = []
        self.completed: list[tuple[str, int]] = []
        self.failed: list[str] = []
        self.last_metrics: dict[str, float] = {}
        ctx = mp.get_context(_start_method(mp_start_method))
        self._requests = ctx.Queue()
        self._results = ctx.Queue()
        self._process = ctx.Process(
            target=_validation_main,
            name="rl-validation",
            args=(
                self._requests,
                self._results,
                dict(task),
                dict(model),
                dict(self.settings),
                str(device),
            ),
            daemon=True,
        )
        self._process.start()
        self._finished = False
        log.info(
            "validation process %d: %d episodes (seeds from %d) per checkpoint",
            self._process.pid,
            num_episodes,
            episode_seed,
        )

    @property
    def pending(self) -> int:
        """Checkpoints handed over whose result has not arrived yet."""
        return len(self.submitted) - len(self.completed)

    @property
    def pid(self) -> int | None:
        """Process id of the validation process."""
        return self._process.pid

    # ------------------------------------------------------------------ hooks
    def on_checkpoint(self, path: Path) -> None:
        """Queue a newly saved checkpoint (the trainer's ``on_checkpoint`` hook)."""
        if self._finished:
            raise RuntimeError("validation already finished; no more checkpoints accepted")
        path = Path(path)
        step = _checkpoint_step(path)
        self._check_alive()
        self._requests.put((str(path), step))
        self.submitted.append((str(path), step))
        if self.pending > 1:
            log.warning(
                "validation is behind training: %d checkpoints pending (validated in order, "
                "none skipped; the newest is %s)",
                self.pending,
                path.name,
            )

    def on_rollout_end(self, trainer: Any, info: Any) -> None:
        """Log the validations that have finished since the last rollout."""
        self.poll()

    # ------------------------------------------------------------- results
    def poll(self, timeout: float | None = None) -> int:
        """Log finished validations; wait up to ``timeout`` seconds for the first one.

        Returns:
            How many results were logged.
        """
        count = 0
        while self.pending:
            try:
                if timeout is not None and count == 0:
                    item = self._results.get(timeout=timeout)
                else:
                    item = self._results.get_nowait()
            except queue.Empty:
                break
            self._handle(item)
            count += 1
        return count

    def _handle(self, item: tuple[str, str, int, Any]) -> None:
        status, path, step, payload = item
        self.completed.append((path, step))
        if status == "ok":
            self.logger.log(step, payload)
            self.last_metrics = dict(payload)
        else:
            self.failed.append(path)
            log.error("validation of %s (step %d) failed:\n%s", path, step, payload)

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            raise RuntimeError(
                f"validation process exited (code {self._process.exitcode}) with "
                f"{self.pending} checkpoint(s) pending; see the log above for its error"
            )

    def finish(self, timeout: float | None = None) -> None:
        """Wait for every pending checkpoint, log the results, and stop the process.

        Args:
            timeout: Seconds to wait in all (None: as long as it takes).

        Raises:
            RuntimeError: If the process died or the timeout passed with checkpoints pending.
        """
        if self._finished:
            return
        if self.pending:
            log.info("waiting for validation of %d checkpoint(s)", self.pending)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending:
            if not self.poll(timeout=_POLL_SECONDS):
                self._check_alive()
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(
                        f"validation timed out with {self.pending} checkpoint(s) pending"
                    )
        self._requests.put(None)
        self._process.join(timeout=30)
        self._finished = True
        self.close()

    def close(self) -> None:
        """Stop the process now (terminate it if still running); idempotent."""
        self._finished = True
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        for q in (self._requests, self._results):
            q.cancel_join_thread()
            q.close()
        if self.pending:
            log.warning(
                "validation stopped with %d checkpoint(s) not validated: %s",
                self.pending,
                ", ".join(Path(p).name for p, _ in self.submitted[len(self.completed) :]),
            )


def build_validation(
    cfg: Mapping[str, Any], *, logger: MetricsLogger, device: torch.device | str = "cpu"
) -> BackgroundValidation | None:
    """The validation hook/callback of a resolved training config (None when disabled)."""
    valid = {**VALID_DEFAULTS, **(cfg.get("valid") or {})}
    if not valid.pop("enabled"):
        return None
    return BackgroundValidation(
        task=cfg["task"], model=cfg["model"], logger=logger, device=device, **valid
    )
