"""The ``distributed`` config group as typed settings (values in conf/distributed/*.yaml)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any

from rl.utils.config import MAX_WORKERS, Check, load_section, section_errors


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How training is spread over ranks (conf/distributed/none.yaml documents each key).

    ``workers``, the old name of ``world_size``, is refused with the new key's name.
    """

    enabled: bool
    world_size: Annotated[int | None, Check(ge=1, le=MAX_WORKERS)]
    workers: int | None
    backend: Annotated[str, Check(choices=("auto", "gloo", "nccl", "mpi"))]
    device: str | None
    timeout_s: Annotated[float, Check(gt=0)]
    sync_frac: Annotated[float | None, Check(gt=0, le=1)]
    min_rollout_frac: Annotated[float, Check(ge=0, le=1)]

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> DistributedSettings:
        """The settings of a resolved ``distributed`` section."""
        return load_section(cls, section, "distributed")


def distributed_errors(section: Any) -> list[str]:
    """Problems of a resolved ``distributed`` section."""
    errors = section_errors(DistributedSettings, section, "distributed")
    if errors:
        return errors
    if section["workers"] is not None:
        errors.append(
            "distributed.workers: renamed distributed.world_size (the number of training "
            f"processes, ranks); write distributed.world_size={section['workers']}"
        )
    elif section["world_size"] is not None and not section["enabled"]:
        errors.append("distributed.world_size: needs distributed=ddp (distributed.enabled=true)")
    return errors
