"""How rollouts travel from collection workers to the learner (:mod:`rl.collection.transport`).

A process worker's storage lies in shared memory and only its blocks' names cross the pipe; the
learner copies the rows into a storage of its own before the worker may write its next rollout
there, and the blocks are gone once the workers close. Compressed rows come back equal.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from collectors import worker_settings
from small import MODEL, SERIAL, SMALL
from tensordict import TensorDict

from rl.collection import CollectionSpec, RolloutRequest
from rl.collection.transport import CompressedRows
from rl.collection.worker_set import CollectionWorkerSet
from rl.models import build_policy
from rl.storage import RolloutStorage
from rl.tasks import task_spaces
from rl.utils import shared_memory
from rl.utils.seeding import set_seed
from rl.utils.shared_memory import SharedBuffers


def _no_state(n: int) -> TensorDict:
    return TensorDict({}, batch_size=[n])


def _process_set(**settings: Any) -> CollectionWorkerSet:
    spec = CollectionSpec(task=SMALL, sampler=SERIAL, model=MODEL, seed=1)
    set_seed(spec.seed)
    model = build_policy(spec.model, *task_spaces(spec.task))
    return CollectionWorkerSet(
        spec=spec, model=model, **worker_settings(backend="process", **settings)
    )


def _blocks(workers: CollectionWorkerSet) -> set[str]:
    return {name for names in workers.assembler._blocks.values() for name in names}


def test_a_process_workers_rollout_crosses_as_names_and_is_copied_before_reuse() -> None:
    workers = _process_set(num_workers=1, mode="async", compress=False)
    try:
        request = RolloutRequest(num_steps=8)
        first = workers.collect(request)
        sums = first.stats["sums"]
        assert 0 < sums["collection/bytes_sent"] < 4096  # the names, not the rows
        assert sums["collection/compression"] > 5  # rows / what carried them
        blocks = _blocks(workers)
        assert blocks and all(os.path.exists(f"/dev/shm/{name}") for name in blocks)
        held = first.storage.rows().clone()
        # The worker's next rollout (async: asked for as this one was taken) is written into
        # the same blocks; once it is done, the learner's rollout is still what it took.
        (flight,) = workers._async.in_flight.values()
        ready, _ = workers.calls.hosts.wait([flight.ref], 1, 60.0)
        assert ready, "the worker's next rollout did not finish"
        assert all(torch.equal(first.storage.rows()[k], held[k]) for k in held.keys(True, True))
        second = workers.collect(request)
        assert not torch.equal(second.storage.rows()["obs", "image"], held["obs", "image"])
        assert _blocks(workers) == blocks  # the worker's blocks are reused
    finally:
        workers.close()
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in blocks)  # unlinked
    assert not blocks & set(shared_memory._MAPPED)  # and unmapped here


def test_shared_buffers_name_their_rows_and_unlink_what_is_not_kept() -> None:
    shared = SharedBuffers()
    storage = RolloutStorage(num_steps=3, num_envs=2, allocate=shared.allocate, device="cpu")
    storage.reset()
    obs = {"x": torch.arange(2.0)}
    storage.set_first(obs, torch.ones(2, dtype=torch.bool), _no_state(2))
    no = torch.zeros(2, dtype=torch.bool)
    step = {"terminated": no, "truncated": no, "rewards": torch.tensor([1.0, 2.0])}
    storage.insert(step, {"x": torch.tensor([5.0, 6.0])})
    rows = shared.rows(storage.data, storage.step + 1).attach()
    assert torch.equal(rows["obs", "x"], torch.tensor([[0.0, 1.0], [5.0, 6.0]]))
    assert torch.equal(rows["rewards"][0], torch.tensor([1.0, 2.0]))
    names = {name for _, name, _, _ in shared.rows(storage.data, 2).leaves}
    other = RolloutStorage(num_steps=1, num_envs=2, allocate=shared.allocate, device="cpu")
    other.reset()
    other.set_first(obs, torch.ones(2, dtype=torch.bool), _no_state(2))
    shared.keep_only(other.data)  # the first storage's blocks are unlinked
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)
    shared.close()


def test_compressed_rows_come_back_equal() -> None:
    storage = RolloutStorage(num_steps=4, num_envs=3, device="cpu")
    storage.reset()
    obs = {"image": torch.randint(0, 5, (3, 7, 7, 3), dtype=torch.uint8)}
    storage.set_first(obs, torch.ones(3, dtype=torch.bool), _no_state(3))
    for t in range(4):
        fields = {
            "terminated": torch.tensor([t == 2, False, False]),
            "truncated": torch.zeros(3, dtype=torch.bool),
            "rewards": torch.randn(3),
        }
        storage.insert(fields, {"image": obs["image"] + t})
    rows = storage.rows()
    packed = CompressedRows.of(rows)
    assert packed.nbytes < sum(v.numel() * v.element_size() for v in rows.values(True, True))
    back = packed.decompress()
    assert set(back.keys(True, True)) == set(rows.keys(True, True))
    assert all(torch.equal(back[k], rows[k]) for k in rows.keys(True, True))


def test_a_process_workers_pipe_sends_tensors_by_value() -> None:
    import multiprocessing as mp

    from rl.utils.processes import receive_from, send

    sent = {
        "weights": torch.randn(3, 4),
        "index": torch.arange(5),
        "view": torch.arange(10.0)[::2],
        "bf16": torch.ones(2, dtype=torch.bfloat16),  # no NumPy dtype: torch's own pickling
    }
    a, b = mp.Pipe()
    try:
        send(a, (7, True, sent))
        call_id, ok, got = receive_from(b)
    finally:
        a.close()
        b.close()
    assert (call_id, ok) == (7, True)
    for key, value in sent.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        assert not got[key].is_shared(), key  # a copy of its own, not a shared-memory handle
    got["weights"] += 1  # writable, and the sender's is untouched
    assert not torch.equal(got["weights"], sent["weights"])
