"""The ``distributed`` config group as typed settings (values in conf/distributed/*.yaml)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any

from rl.utils.config import MAX_WORKERS, Check, load_section, section_errors


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How training is spread over workers (see ``conf/distributed/*.yaml`` for each key).

    Attributes:
        enabled: Train on several workers (``distributed=ddp``).
        workers: Spawn this many local workers (None: launched by torchrun).
        backend: ``auto`` (gloo on CPU, nccl on CUDA), ``gloo``, ``nccl`` or ``mpi``.
        device: Overrides the run's ``device`` for the workers (None: the run's).
        timeout_s: Collective timeout in seconds: a hung peer ends the job after it.
        sync_frac: Straggler preemption: end a rollout once this fraction of workers has
            finished theirs (None: never).
        min_rollout_frac: ... and this worker has at least this fraction of its steps.
    """

    enabled: bool
    workers: Annotated[int | None, Check(ge=1, le=MAX_WORKERS)]
    backend: Annotated[str, Check(choices=("auto", "gloo", "nccl", "mpi"))]
    device: str | None
    timeout_s: Annotated[float, Check(gt=0)]
    sync_frac: Annotated[float | None, Check(gt=0, le=1)]
    min_rollout_frac: Annotated[float, Check(ge=0, le=1)]

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> DistributedSettings:
        """The settings of a resolved ``distributed`` section (``ConfigError`` if invalid)."""
        return load_section(cls, section, "distributed")


def distributed_errors(section: Any) -> list[str]:
    """Problems of a resolved ``distributed`` section."""
    errors = section_errors(DistributedSettings, section, "distributed")
    if not errors and section["workers"] is not None and not section["enabled"]:
        errors.append("distributed.workers: needs distributed=ddp (distributed.enabled=true)")
    return errors
