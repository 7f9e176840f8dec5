"""Validation during training: every new checkpoint evaluated in a separate process.

Each saved checkpoint goes to one validation process, which validates them in order on the fixed
validation episode list and logs ``valid/*`` at the checkpoint's env step. None is skipped
(AllenAct's valid mode took the newest and skipped those it fell behind on): a resumed run queues
again the checkpoints without a ``<checkpoint>.valid.json``, and the trainer's
:class:`~rl.checkpoints.retention.CheckpointRetention` holds each until its result arrives
(``keep_last`` never deletes it first; ``best_metric=valid/...`` judges it by the result).

The process is a :class:`~rl.utils.processes.ChildProcesses` child: it gets plain data only, its
death is noticed at once and it never outlives the run. A checkpoint whose validation raises is
logged as an error and the next one is validated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl.checkpoints.files import list_checkpoints, load_checkpoint
from rl.checkpoints.retention import CheckpointRetention
from rl.collection.episodes import EvalSampler, episode_seed_list, evaluate_policy
from rl.evaluation.inference import load_trained_policy
from rl.evaluation.runs import checkpoint_ref
from rl.evaluation.settings import ValidSettings
from rl.loggers.base import MetricsLogger
from rl.models.policy import build_policy
from rl.tasks.factory import TaskLayout, task_layout, with_split
from rl.training.callbacks import Callback, RolloutInfo
from rl.training.trainer import OnPolicyTrainer
from rl.utils.files import write_atomic
from rl.utils.processes import Call, ChildFailed, ChildProcesses

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.5


def result_path(checkpoint: Path) -> Path:
    """``<checkpoint>.valid.json``: the checkpoint's validation result."""
    return checkpoint.with_suffix(".valid.json")


class Validator:
    """What the validation process serves: the ``valid/*`` metrics of a checkpoint.

    ``task`` and ``model_cfg`` are plain resolved configs, ``settings`` the ``valid`` section
    as a dict; ``layout`` None: read here (building one environment).
    """

    def __init__(
        self,
        *,
        task: dict[str, Any],
        model_cfg: dict[str, Any],
        settings: dict[str, Any],
        device: str,
        layout: TaskLayout | None,
        sampler: EvalSampler | None = None,
    ) -> None:
        torch.set_num_threads(int(settings["torch_threads"]))
        self.task, self.settings, self.device, self.sampler = task, settings, device, sampler
        layout = task_layout(task) if layout is None else layout
        self.spaces = layout.spaces
        self.model = build_policy(model_cfg, *self.spaces, groups=layout.groups).to(device)
        self.seeds = episode_seed_list(
            int(settings["num_episodes"]), int(settings["episode_seed"])
        )

    def validate(self, path: str) -> dict[str, float]:
        """The ``valid/*`` metrics of the checkpoint at ``path`` (its weights only)."""
        t0 = time.perf_counter()
        state = load_checkpoint(path, map_location=self.device)  # (weights only)
        _, normalizer = load_trained_policy(
            state, path, self.spaces, model=self.model, device=self.device
        )
        result = evaluate_policy(
            model=self.model,
            task=self.task,
            episode_seeds=self.seeds,
            num_envs=int(self.settings["num_envs"]),
            deterministic=bool(self.settings["deterministic"]),
            action_seed=int(self.settings["action_seed"]),
            device=self.device,
            normalizer=normalizer,
            sampler=self.sampler,
        )
        metrics = result.as_logged("valid")
        metrics["valid/seconds"] = time.perf_counter() - t0
        return metrics


class BackgroundValidation(Callback):
    """Trainer callback that validates every checkpoint in a separate process.

    ``on_train_end`` waits for every pending validation (their ``valid/*`` join the trainer's
    last metrics); call :meth:`close` in a ``finally``. ``task`` and ``model`` are plain resolved
    configs; ``layout`` is the task's spaces and agents as the run read them (None: read in the
    process); ``sampler`` None: serially.
    """

    def __init__(
        self,
        settings: ValidSettings,
        *,
        task: Mapping[str, Any],
        model: Mapping[str, Any],
        logger: MetricsLogger,
        device: torch.device | str,
        layout: TaskLayout | None = None,
        sampler: EvalSampler | None = None,
    ) -> None:
        self.settings = settings
        self.sampler = sampler or EvalSampler.serial()
        self.logger = logger
        self.task = with_split(task, settings.split)
        self._kwargs = {
            "task": self.task,
            "model_cfg": dict(model),
            "settings": dataclasses.asdict(settings),
            "device": str(device),
            "layout": layout,
            "sampler": self.sampler,
        }
        self.submitted: list[tuple[str, int]] = []
        self.completed: list[tuple[str, int]] = []
        self._unobserved: list[dict[str, float]] = []  # results the trainer has not seen yet
        self._process: ChildProcesses | None = None
        self._calls: list[Call] = []  # in the order submitted; the done ones are dropped
        self._finished = False
        # The trainer's (set by its hooks): holds each checkpoint until its result arrives.
        self._retention: CheckpointRetention | None = None

    def _start(self) -> None:
        self._process = ChildProcesses(
            Validator,
            [self._kwargs],
            name="rl-validation",
            label=lambda _, pid: f"the validation process (pid {pid})",
            start_method=self.settings.mp_start_method,
            start_timeout=None,
        )
        log.info(
            "validation process %d: %d episodes (seeds from %d) per checkpoint, %s",
            self.pid,
            self.settings.num_episodes,
            self.settings.episode_seed,
            self.sampler.describe(),
        )

    @property
    def pending(self) -> int:
        """Checkpoints handed over whose result has not arrived yet."""
        return len(self.submitted) - len(self.completed)

    @property
    def pid(self) -> int | None:
        """Process id of the validation process (None before the first checkpoint)."""
        return None if self._process is None else self._process.pids[0]

    def submit(self, path: Path) -> None:
        """Queue a checkpoint for validation (starts the process with the first one)."""
        if self._finished:
            raise RuntimeError("validation already finished; no more checkpoints accepted")
        if self._process is None:
            self._start()
        path = Path(path)
        step = checkpoint_ref(path).step
        assert self._process is not None
        self._calls.append(self._process.call(0, "validate", str(path)))
        self.submitted.append((str(path), step))
        if self._retention is not None:
            self._retention.hold(path)  # (keep_last never deletes it before its result)
        if self.pending > 1:
            log.warning(
                "validation is behind training: %d checkpoints pending (validated in order, "
                "none skipped; the newest is %s)",
                self.pending,
                path.name,
            )

    def on_checkpoint(self, trainer: OnPolicyTrainer, path: Path) -> None:
        """Queue the checkpoint just saved."""
        self._retention = trainer.retention
        self.submit(path)

    def on_train_start(self, trainer: OnPolicyTrainer) -> None:
        """Queue the run's checkpoints that have no result yet (pending when it was stopped)."""
        self._retention = trainer.retention
        steps = trainer.pipeline.total_steps
        pending = [
            p
            for p in list_checkpoints(trainer.output_dir)
            if checkpoint_ref(p).step <= steps and not result_path(p).exists()
        ]
        if pending:
            log.info(
                "validation: %d checkpoint(s) of this run were not validated yet: %s",
                len(pending),
                ", ".join(p.name for p in pending),
            )
        for path in pending:
            self.submit(path)

    def on_rollout_end(self, trainer: OnPolicyTrainer, info: RolloutInfo) -> None:
        """Log the validations that have finished since the last rollout."""
        self.poll()
        self._hand_over(trainer)

    def on_train_end(self, trainer: OnPolicyTrainer, checkpoint: Path) -> None:
        """Wait for every pending validation; the newest ``valid/*`` join the last metrics."""
        self.finish()
        self._hand_over(trainer)

    def _hand_over(self, trainer: OnPolicyTrainer) -> None:
        """Results logged since the last call become the trainer's (criteria see ``valid/*``)."""
        results, self._unobserved = self._unobserved, []
        for metrics in results:
            trainer.metrics.observe(metrics)

    def poll(self, timeout: float | None = None) -> int:
        """Log finished validations, waiting up to ``timeout`` seconds for one; return how many."""
        if self._process is None:
            return 0
        count = 0
        while self._calls:
            wait = timeout if timeout is not None and count == 0 else 0.0
            if not self._process.wait(self._calls[:1], 1, wait)[0]:
                break
            self._handle(self._calls.pop(0))
            count += 1
        return count

    def _handle(self, call: Call) -> None:
        assert self._process is not None
        path, step = self.submitted[len(self.completed)]
        try:
            metrics = self._process.result(call, what=f"validating {Path(path).name}")
        except ChildFailed as e:
            if e.traceback is None:  # the process died: nothing more will be validated
                raise RuntimeError(
                    f"{e} with {self.pending} checkpoint(s) pending; see the log above for "
                    "its error"
                ) from None
            self.completed.append((path, step))
            log.error("validation of %s (step %d) failed:\n%s", path, step, e.traceback)
            if self._retention is not None:
                self._retention.validated(path, None)
            return
        self.completed.append((path, step))
        self.logger.log(step, metrics)
        self._unobserved.append(dict(metrics))
        write_atomic(
            result_path(Path(path)),
            json.dumps({"step": step, "metrics": metrics}),
            what="validation result",  # (a full disk: named)
        )
        if self._retention is not None:  # the best by valid/*, then keep-last-N
            self._retention.validated(path, metrics)

    def finish(self) -> None:
        """Wait for every pending result, then stop the process.

        Raises:
            RuntimeError: The process died with checkpoints pending.
        """
        if self._finished:
            return
        if self.pending:
            log.info("waiting for validation of %d checkpoint(s)", self.pending)
        while self.pending:
            self.poll(timeout=_POLL_SECONDS)
        self.close()

    def close(self) -> None:
        """Stop the process now (terminate it if still running); idempotent."""
        self._finished = True
        if self._process is None:
            return
        self._process.close(grace=10.0)  # then SIGKILL
        if self.pending:
            log.warning(
                "validation stopped with %d checkpoint(s) not validated: %s",
                self.pending,
                ", ".join(Path(p).name for p, _ in self.submitted[len(self.completed) :]),
            )
