"""Seeding: the global RNGs, per-environment seeds, and deterministic algorithms."""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch


def set_seed(seed: int | None) -> None:
    """Seed Python's, NumPy's and torch's global generators (nothing when ``seed`` is None)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def env_seeds(num_envs: int, initial_seed: int | None) -> list[int]:
    """``num_envs`` distinct seeds in ``[0, 2**31)``, one per environment, from ``initial_seed``.

    AllenAct's ``worker_seeds``: a private generator (None: OS entropy), the global RNGs
    untouched; the first ``k`` seeds do not depend on ``num_envs``.
    """
    rng = random.Random(initial_seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < num_envs:
        s = rng.randint(0, 2**31 - 1)
        if s not in seen:
            seen.add(s)
            seeds.append(s)
    return seeds


def rng_state() -> dict[str, object]:
    """Python, NumPy and torch global RNG states as plain objects (``weights_only``-safe)."""
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy form: the global MT19937's
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore states captured by :func:`rng_state`.

    Raises:
        ValueError: A state of another kind (the file may be anyone's: a cached Gaussian
            must be a finite float, a NaN one would be the next draw), before any is set.
    """
    py, (name, keys, *rest) = state["python"], state["numpy"]
    gauss = (py[2], rest[2] if rest[1] else 0.0)
    if not all(isinstance(g, float) and math.isfinite(g) for g in gauss if g is not None):
        raise ValueError("checkpoint entry rng: a cached Gaussian draw is not a finite float")
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])


# cuBLAS needs a fixed workspace for deterministic results, read when it starts.
CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic_mode(enabled: bool = True) -> Iterator[None]:
    """Deterministic algorithms only within the block (AllenAct's ``set_deterministic_cudnn``).

    An operation without a deterministic implementation raises, and cuDNN does not autotune.
    Enter before any CUDA work: cuBLAS reads its workspace setting when it starts.
    ``enabled=False`` changes nothing.
    """
    if not enabled:
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic = before[1]
        torch.backends.cudnn.benchmark = before[2]
        if before[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
