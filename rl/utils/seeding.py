"""Seeding: the global RNGs and per-environment seeds."""

from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int | None) -> None:
    """Seed Python's, NumPy's and torch's global generators (nothing when ``seed`` is None)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def worker_seeds(nprocesses: int, initial_seed: int | None) -> list[int]:
    """Draw one seed per sampler (environment), reproducibly from ``initial_seed``.

    The global RNG state is left untouched (AllenAct's semantics): the seeds come from a private
    generator, so calling this never perturbs training randomness.

    Args:
        nprocesses: How many seeds to draw (one per global environment index).
        initial_seed: Seed of the private generator; ``None`` draws from OS entropy.

    Returns:
        ``nprocesses`` distinct seeds in ``[0, 2**31)``; the first ``k`` seeds do not depend
        on ``nprocesses``.
    """
    rng = random.Random(initial_seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < nprocesses:
        s = rng.randint(0, 2**31 - 1)
        if s not in seen:
            seen.add(s)
            seeds.append(s)
    return seeds


def rng_state() -> dict[str, object]:
    """Python, NumPy and torch global RNG states as plain objects (``weights_only``-safe)."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, object]) -> None:
    """Restore states captured by :func:`rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))  # type: ignore[index]
    name, keys, *rest = state["numpy"]  # type: ignore[misc]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
