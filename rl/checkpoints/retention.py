"""Which checkpoints a run marks and keeps: the best by a chosen metric, and the last N.

Neither changes what a checkpoint holds, so resuming stays exact. On resume the best so far
comes from ``best.json``, read as untrusted input (:func:`load_best_record`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl.checkpoints.errors import CheckpointError
from rl.checkpoints.files import (
    BEST,
    CHECKPOINT_DIR,
    LATEST,
    list_checkpoints,
    parse_checkpoint_name,
    pointed_checkpoint,
)
from rl.pipeline.stages import BEST_MODES
from rl.utils.files import read_regular_file, run_subdir, write_atomic
from rl.utils.finite import as_float

log = logging.getLogger(__name__)

BEST_RECORD = "best.json"
# A record this code writes is about 200 bytes; anything much larger is not one.
_MAX_RECORD_BYTES = 4096
# The suffix of a checkpoint's validation result (rl.evaluation.validation.result_path).
VALID_SUFFIX = ".valid.json"


@dataclasses.dataclass(frozen=True)
class BestRecord:
    """The best checkpoint so far (``checkpoints/best.json``), by ``metric`` and ``mode``."""

    checkpoint: str
    metric: str
    mode: str
    value: float
    step: int

    def beaten_by(self, value: float) -> bool:
        """Whether ``value`` is strictly better than this record's."""
        return value > self.value if self.mode == "max" else value < self.value


def _record_problem(data: Any) -> str | None:
    """Why parsed ``best.json`` content is not a record this code wrote (None: it is)."""
    if not isinstance(data, dict):
        return "it is not a JSON object"
    name = data.get("checkpoint")
    parsed = parse_checkpoint_name(name) if isinstance(name, str) else None
    if parsed is None or Path(str(name)).name != name:
        return f"its checkpoint {name!r} is not a checkpoint file name (no paths)"
    metric, mode = data.get("metric"), data.get("mode")
    if not isinstance(metric, str) or not metric:
        return f"its metric {metric!r} is not a metric name"
    if mode not in BEST_MODES:
        return f"its mode {mode!r} is not one of {', '.join(BEST_MODES)}"
    if as_float(data.get("value"), finite=True) is None:
        return f"its value {data.get('value')!r} is not a finite number"
    step = data.get("step")
    if type(step) is not int or step != parsed[1]:
        return f"its step {step!r} is not the env step of {name}"
    return None


def load_best_record(run_dir: str | Path) -> BestRecord | None:
    """The run's ``checkpoints/best.json``, checked; None when there is none.

    Raises:
        CheckpointError: It is not a record this code wrote (a link, too large, a path, a
            non-finite value, ...) or names no regular file beside it (moved aside, deleted).
        UnsafePathError: The run's ``checkpoints`` is a link or not a folder.
    """
    folder = run_subdir(run_dir, CHECKPOINT_DIR, create=False)
    path = folder / BEST_RECORD
    if not os.path.lexists(path):
        return None
    raw = read_regular_file(path, _MAX_RECORD_BYTES + 1)
    if raw is None:
        raise CheckpointError(f"{path} is not a regular file (a link, a folder or a FIFO)")
    if len(raw) > _MAX_RECORD_BYTES:
        raise CheckpointError(f"{path} is larger than {_MAX_RECORD_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise CheckpointError(f"{path} is not JSON ({type(e).__name__})") from None
    problem = _record_problem(data)
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}")
    checkpoint = folder / data["checkpoint"]
    if checkpoint.is_symlink() or not checkpoint.is_file():
        raise CheckpointError(
            f"{path} names {data['checkpoint']}, which is not a checkpoint file in {folder}"
        )
    return BestRecord(
        data["checkpoint"], data["metric"], data["mode"], float(data["value"]), data["step"]
    )


class CheckpointRetention:
    """The best checkpoint by ``best_metric`` and the last ``keep_last`` checkpoints of a run.

    The trainer calls :meth:`start` before training (rank 0), :meth:`saved` after each
    checkpoint it writes; the validation callback holds each checkpoint it queues
    (:meth:`hold`) and hands its result to :meth:`validated`. With both settings off (None)
    nothing is read, written or deleted.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        keep_last: int | None = None,
        best_metric: str | None = None,
        best_mode: str = "max",
    ) -> None:
        if best_mode not in BEST_MODES:
            raise ValueError(
                f"best_mode: expected one of {', '.join(BEST_MODES)}, got {best_mode!r}"
            )
        if keep_last is not None and (type(keep_last) is not int or keep_last < 0):
            raise ValueError(f"keep_last: expected None or an integer >= 0, got {keep_last!r}")
        self.run_dir = Path(run_dir)
        self.keep_last = keep_last or 0
        self.best_metric = best_metric or None
        self.best_mode = best_mode
        self.best: BestRecord | None = None  # (None: none yet, or tracking off)
        self._held: dict[str, int] = {}  # checkpoint name -> pending validations
        self._missing_said = False

    @property
    def by_validation(self) -> bool:
        """Whether the best is judged by a ``valid/*`` metric (known when validation ends)."""
        return bool(self.best_metric) and str(self.best_metric).startswith("valid/")

    def _folder(self) -> Path:
        return run_subdir(self.run_dir, CHECKPOINT_DIR, create=False)

    # ------------------------------------------------------------------ hooks
    def start(self) -> None:
        """Take the best so far from the run's ``best.json`` (a resumed run).

        An unsound record, or one of another metric or mode, is ignored with a warning; a
        ``best`` pointer that disagrees with a sound record is rewritten.
        """
        self.best = None
        if not self.best_metric:
            return
        try:
            record = load_best_record(self.run_dir)
        except CheckpointError as e:
            log.warning("best checkpoint: ignoring %s; tracking starts over", e)
            return
        if record is None:
            return
        if (record.metric, record.mode) != (self.best_metric, self.best_mode):
            log.warning(
                "best checkpoint: %s records the best by %r (%r); this run tracks %s (%s): "
                "tracking starts over",
                BEST_RECORD,
                record.metric,
                record.mode,
                self.best_metric,
                self.best_mode,
            )
            return
        self.best = record
        folder = self._folder()
        if pointed_checkpoint(folder, BEST) != folder / record.checkpoint:
            write_atomic(folder / BEST, record.checkpoint, what="best checkpoint pointer")
        log.info(
            "best checkpoint so far: %s (%s = %g at env step %d)",
            record.checkpoint,
            record.metric,
            record.value,
            record.step,
        )

    def saved(self, path: Path, metrics: Mapping[str, Any]) -> None:
        """After ``path`` was written: judge it by the latest logged ``metrics``, then prune.

        A ``valid/*`` metric is judged when the validation result comes (:meth:`validated`).
        """
        if self.best_metric and not self.by_validation:
            self.consider(path, metrics)
        self.prune()

    def hold(self, path: str | Path) -> None:
        """Keep ``path`` while its validation is pending (however old it is)."""
        name = Path(path).name
        self._held[name] = self._held.get(name, 0) + 1

    def release(self, path: str | Path) -> None:
        """``path``'s validation ended (done or failed): it may be pruned again."""
        name = Path(path).name
        left = self._held.get(name, 0) - 1
        if left > 0:
            self._held[name] = left
        else:
            self._held.pop(name, None)

    def validated(self, path: str | Path, metrics: Mapping[str, Any] | None) -> None:
        """Take ``path``'s validation result (None: it failed); release, judge, prune."""
        self.release(path)
        if metrics is not None and self.by_validation:
            self.consider(Path(path), metrics)
        self.prune()

    # ------------------------------------------------------------------ best
    def consider(self, path: Path, metrics: Mapping[str, Any]) -> bool:
        """Make ``path`` the best if its ``best_metric`` beats the best; whether it did."""
        assert self.best_metric is not None
        parsed = parse_checkpoint_name(path)
        if parsed is None:
            return False
        value = as_float(metrics.get(self.best_metric), finite=True)
        if value is None:
            if self.best_metric not in metrics and not self._missing_said:
                self._missing_said = True
                log.warning(
                    "best checkpoint: pipeline.best_metric=%s has no value at %s (metrics: %s); "
                    "a checkpoint without one is never the best",
                    self.best_metric,
                    Path(path).name,
                    ", ".join(sorted(metrics)) or "none yet",
                )
            return False
        if self.best is not None and not self.best.beaten_by(value):
            return False
        record = BestRecord(Path(path).name, self.best_metric, self.best_mode, value, parsed[1])
        folder = self._folder()
        write_atomic(  # (a link under the name is replaced, never written through)
            folder / BEST_RECORD,
            json.dumps(dataclasses.asdict(record), indent=1),
            what="best checkpoint record",
        )
        write_atomic(folder / BEST, record.checkpoint, what="best checkpoint pointer")
        self.best = record
        log.info(
            "best checkpoint: %s (%s = %g at env step %d)",
            record.checkpoint,
            record.metric,
            value,
            record.step,
        )
        return True

    # ------------------------------------------------------------------ keep last N
    def prune(self) -> list[Path]:
        """Delete the checkpoints beyond the newest ``keep_last``, with their ``.valid.json``.

        Kept whatever their age: the best, the one ``latest`` names, those held for validation.
        """
        if not self.keep_last:
            return []
        found = list_checkpoints(self.run_dir)
        if len(found) <= self.keep_last:
            return []
        folder = found[0].parent
        keep = {p.name for p in found[-self.keep_last :]} | set(self._held)
        if self.best is not None:
            keep.add(self.best.checkpoint)
        latest = pointed_checkpoint(folder, LATEST)
        if latest is not None:
            keep.add(latest.name)
        removed = [p for p in found if p.name not in keep and _remove_regular(p)]
        for p in removed:
            _remove_regular(p.with_suffix(VALID_SUFFIX))
        if removed:
            log.info(
                "keep_last=%d: removed %s", self.keep_last, ", ".join(p.name for p in removed)
            )
        return removed


def _remove_regular(path: Path) -> bool:
    """Delete ``path`` if it is a regular file (never a link, a folder); whether it was."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def retention_errors(pipeline: Any, eval_section: Any, valid_section: Any) -> list[str]:
    """Problems of ``pipeline.best_metric`` against the evaluation settings (config check).

    A ``valid/*`` metric needs validation on; an ``eval/*`` one periodic evaluation.
    """
    if not isinstance(pipeline, Mapping):
        return []
    metric = pipeline.get("best_metric")
    if metric is None:
        return []
    if not isinstance(metric, str) or not metric.strip():
        return [
            "pipeline.best_metric: expected a metric name such as valid/success or "
            f"charts/episodic_return (null: off), got {metric!r}"
        ]
    valid_on = isinstance(valid_section, Mapping) and valid_section.get("enabled") is True
    if metric.startswith("valid/") and not valid_on:
        return [
            f"pipeline.best_metric={metric}: validation is off (valid.enabled is not true); "
            "turn it on (valid.enabled=true) or choose a training metric "
            "(pipeline.best_metric=charts/episodic_return)"
        ]
    evaluated = (
        isinstance(eval_section, Mapping)
        and isinstance(eval_section.get("interval"), int)
        and isinstance(eval_section.get("num_episodes"), int)
        and eval_section["interval"] > 0
        and eval_section["num_episodes"] > 0
    )
    if metric.startswith("eval/") and not evaluated:
        return [
            f"pipeline.best_metric={metric}: eval/* is logged during training only with "
            "eval.interval > 0 and eval.num_episodes >= 1 (a checkpoint takes the latest "
            "evaluation's value: make eval.interval divide pipeline.save_interval)"
        ]
    return []
