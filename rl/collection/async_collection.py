"""Barrier-free collection: every worker always has a rollout in flight (``collector.mode=async``).

An update takes the first ``rollouts_per_update`` acceptable rollouts (first come, first
served). A rollout more than ``max_policy_lag`` weight versions behind the learner, or collected
for another stage, is dropped and its worker asked again; a longer one is cut. Rollouts are
collected ahead by the trainer's plan (:meth:`AsyncCollection.set_plan`), in the order they are
asked for, so nothing is collected past a stage's budget or the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rl.collection.base import RolloutRequest
from rl.collection.transport import ShippedRollout
from rl.collection.worker_calls import WorkerCalls
from rl.utils.deadline import Deadline

__all__ = ["AsyncCollection", "InFlight", "as_sent"]


@dataclasses.dataclass
class InFlight:
    """A rollout asked of a worker: its call, the request, its deadline (from its asking)."""

    ref: Any
    request: RolloutRequest
    deadline: Deadline

    @property
    def since(self) -> float:
        """When it was asked for (``time.monotonic()``)."""
        return self.deadline.start


class AsyncCollection:
    """The rollouts in flight of a worker set, and which of them an update takes.

    Args:
        request: ``request(workers, rollout_request)``: ask ``workers`` for a rollout with the
            learner's current weights and settings; the calls' handles.
        max_policy_lag: Largest accepted ``learner version - data version``.
    """

    def __init__(
        self,
        calls: WorkerCalls,
        request: Callable[[Sequence[int], RolloutRequest], list[Any]],
        *,
        rollouts_per_update: int,
        max_policy_lag: int,
    ) -> None:
        self.calls, self.request = calls, request
        self.rollouts_per_update, self.max_policy_lag = rollouts_per_update, max_policy_lag
        self.in_flight: dict[int, InFlight] = {}  # worker -> its rollout in flight
        self.ready: dict[int, ShippedRollout] = {}  # received, kept for the next update
        self.plan: Callable[[int], RolloutRequest | None] | None = None
        self.dropped = 0

    def set_plan(self, plan: Callable[[int], RolloutRequest | None]) -> None:
        """``plan(k)``: the request ``k`` updates after the one being collected (None: none)."""
        self.plan = plan

    def planned(self, updates_ahead: int, current: RolloutRequest) -> RolloutRequest | None:
        """The request of the update ``updates_ahead`` after ``current`` (None: none comes)."""
        if updates_ahead == 0:
            return current
        if self.plan is not None:
            planned = self.plan(updates_ahead)
            return None if planned is None else as_sent(planned)
        moved = current.stage_steps + updates_ahead * current.num_steps * current.steps_per_step
        return dataclasses.replace(current, stage_steps=moved)

    def refill(
        self, current: RolloutRequest, taken: int = 0, holding: Collection[int] = ()
    ) -> None:
        """Ask every idle worker for a rollout, planned in the order they are asked for.

        Rollouts in flight are planned for the coming updates in asking order,
        ``rollouts_per_update`` each, though an update takes the first ready ones. ``taken``:
        rollouts already taken for ``current``'s update; ``holding``: workers whose taken
        rollout is not copied out yet (a process worker writes its next one where it lies).
        """
        for i in range(self.calls.num_workers):
            if i in self.in_flight or i in holding:
                continue
            queued = taken + len(self.in_flight)
            planned = self.planned(queued // self.rollouts_per_update, current)
            if planned is None:
                continue  # past the budget: this worker waits
            (ref,) = self.request([i], planned)
            self.in_flight[i] = InFlight(ref, planned, Deadline(self.calls.budget()))

    def take(
        self, request: RolloutRequest, version: int
    ) -> tuple[list[int], list[ShippedRollout]]:
        """The first ``rollouts_per_update`` acceptable rollouts, in worker order.

        Each is cut to ``request``'s length; ``version`` is the learner's. Their workers are
        idle afterwards: :meth:`refill` them once the statistics they get are merged.
        """
        need = self.rollouts_per_update
        self.refill(request)
        taken: dict[int, ShippedRollout] = {}
        while len(taken) < need:
            if not self.in_flight:
                raise RuntimeError("asynchronous collection: no rollout in flight (a bug)")
            for i in self._take_ready():
                flight = self.in_flight.pop(i)
                data = self._result(i, flight)
                lag = version - data.actor_version
                if flight.request.stage != request.stage or lag > self.max_policy_lag:
                    self.dropped += 1  # too old, or for another stage: collected again now
                elif len(taken) < need:
                    taken[i] = data
                    continue
                else:  # more are ready than the update takes: keep it for the next one
                    self.in_flight[i] = flight
                    self.ready[i] = data
                    continue
                self.refill(request, taken=len(taken), holding=taken)
        workers = sorted(taken)
        steps = request.num_steps
        return workers, [taken[i].cut(steps) for i in workers]

    def _take_ready(self) -> list[int]:
        """Workers whose rollout in flight is done: those kept from before first, oldest first."""
        kept = sorted(self.ready, key=lambda i: self.in_flight[i].since)
        if kept:
            return kept
        flights = sorted(self.in_flight.items(), key=lambda kv: kv[1].since)
        return self.calls.first_done(
            [(i, f.ref, f.deadline) for i, f in flights], "collecting a rollout"
        )

    def _result(self, worker: int, flight: InFlight) -> ShippedRollout:
        """A done rollout in flight, the outcomes of the worker's calls before it checked."""
        if worker in self.ready:
            return self.ready.pop(worker)
        self.calls.check_acks(worker)
        result: ShippedRollout = self.calls.get(flight.ref, worker)
        return result


def as_sent(request: RolloutRequest) -> RolloutRequest:
    """``request`` as the workers get it: without teacher forcing, its position is moot."""
    if request.teacher_forcing is None:
        return dataclasses.replace(request, stage_steps=0, steps_per_step=1)
    return request
