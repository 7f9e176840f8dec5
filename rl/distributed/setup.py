"""Process-group setup and teardown, per-rank devices, identical model initialisation.

Ranks join with the ``env://`` rendezvous. gloo fails at once when a peer's connection closes,
and after ``timeout_s`` when a peer hangs: a job never hangs forever.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import os
import time

import torch
import torch.distributed as dist

from rl.distributed.reduce import gather_lists, is_distributed
from rl.distributed.settings import DistributedSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistContext:
    """Where this rank stands in the world (rank 0 logs and writes), and its preemption.

    ``local_rank`` is the rank on this machine (it picks the GPU).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(kw_only=True)
    sync_frac: float | None = None
    min_rollout_frac: float = 0.25

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """True with more than one rank."""
        return self.world_size > 1


def init_distributed(settings: DistributedSettings, device: str) -> DistContext:
    """Join the process group described by the environment (``env://``) on ``device``.

    ``cuda`` is ``cuda:LOCAL_RANK``: one GPU per local rank.

    Raises:
        RuntimeError: The launcher's environment variables are missing.
    """
    required = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in required if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"distributed=ddp needs {', '.join(missing)} in the environment: launch with "
            "`torchrun --nproc_per_node=N train.py ... distributed=ddp`, or set "
            "distributed.world_size=N to spawn N local ranks"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    name = settings.device or device
    dev = torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = settings.backend
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=settings.timeout_s),
        )
    ctx = DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        device=dev,
        sync_frac=settings.sync_frac,
        min_rollout_frac=settings.min_rollout_frac,
    )
    log.info(
        "distributed: rank %d of %d (local rank %d), backend %s, device %s, preemption %s",
        rank,
        world,
        local_rank,
        backend,
        dev,
        "off" if ctx.sync_frac is None else f"sync_frac={ctx.sync_frac}",
    )
    return ctx


def teardown(wait: bool = False) -> None:
    """Leave the process group (no-op without one).

    Args:
        wait: Meet every rank at a barrier first (after success: a rank that tears its
            connections down while a peer still uses them can abort the peer in gloo).
    """
    if dist.is_available() and dist.is_initialized():
        if wait and dist.get_world_size() > 1:
            dist.barrier()
            # Rank 0 hosts the store: it leaves last, or a peer still tearing down may abort.
            store = dist.distributed_c10d._get_default_store()
            if dist.get_rank() != 0:
                store.add("rl/teardown", 1)
            else:
                deadline = time.monotonic() + 10.0
                while (
                    int(store.add("rl/teardown", 0)) < dist.get_world_size() - 1
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.01)
                time.sleep(0.2)
        dist.destroy_process_group()


def state_checksum(module: torch.nn.Module) -> str:
    """SHA-256 of every parameter's and buffer's bytes (bitwise identity check)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def checksums_across_ranks(module: torch.nn.Module) -> list[str]:
    """:func:`state_checksum` of ``module`` on every rank, in rank order."""
    return [str(s) for s in gather_lists([state_checksum(module)])]


def synchronize_model(module: torch.nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers, and check that they are identical.

    Identically seeded ranks should agree already: a warning says when they did not.

    Raises:
        RuntimeError: The weights still differ after the broadcast.
    """
    if not is_distributed():
        return
    before = checksums_across_ranks(module)
    if len(set(before)) > 1 and dist.get_rank() == 0:
        log.warning("model initialisation differed across ranks; using rank 0's weights")
    with torch.no_grad():
        for t in module.state_dict().values():
            dist.broadcast(t, src=0)
    after = checksums_across_ranks(module)
    if len(set(after)) > 1:
        raise RuntimeError(f"model weights differ across ranks after broadcast: {after}")
