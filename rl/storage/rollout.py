"""Time-major rollout storage: one ``TensorDict`` whose entries are ``[T + 1, N, ...]``.

Row ``t`` holds ``obs`` (nested by key) and ``episode_starts`` (the recurrent state is reset
before that observation), ``state`` (nested: the policy's state before processing ``obs[t]`` and
before its reset; truncated-BPTT chunks start from it) and step ``t``'s fields: ``actions``,
``logprobs``, ``values``, ``rewards``, ``terminated``, ``truncated``, ``truncation_values`` (the
value of a truncated episode's final observation), ``expert_actions`` (-1: none), then
``advantages`` and ``returns`` (:meth:`RolloutStorage.set_advantages`). Row ``T`` holds the
observation the returns bootstrap from; its step fields are unused. An entry is allocated when
first written, so a new per-step field needs no declaration: losses read ``batch["its_name"]``.

Minibatches are ``[T, n]`` slices of sequences: whole rollouts of some environments, or chunks
of ``recurrence`` steps (truncated BPTT, Sample Factory's ``recurrence``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

from rl.models.policy import empty_state
from rl.utils.misc import evenly_distribute_count_into_bins

__all__ = ["ADVANTAGE_STATS", "RolloutStorage", "advantage_stats_of", "sequence_start_state"]

# The non-tensor minibatch entry holding the rollout's (mean, std) of advantages.
ADVANTAGE_STATS = "advantage_stats"


def sequence_start_state(batch: TensorDict) -> TensorDict:
    """The recurrent state each sequence of a minibatch ``[T, n]`` starts from (batch ``[n]``)."""
    state = batch.get("state", None)
    if state is None:  # a memoryless policy's: empty, where the minibatch is
        return empty_state(batch.batch_size[1], batch["episode_starts"].device)
    return state[0]


def advantage_stats_of(batch: TensorDict) -> tuple[float, float] | None:
    """The rollout-wide ``(mean, std)`` of advantages a minibatch carries (None: none set)."""
    if ADVANTAGE_STATS not in batch.keys():
        return None
    return batch.get_non_tensor(ADVANTAGE_STATS)


def _state_leaves(state: TensorDict) -> Iterator[tuple[NestedKey, torch.Tensor]]:
    """``(("state", *key), tensor)`` for every leaf of a policy state."""
    for k, v in state.items(include_nested=True, leaves_only=True):
        yield ("state", *k) if isinstance(k, tuple) else ("state", k), cast(torch.Tensor, v)


class RolloutStorage:
    """Fixed-capacity ``[capacity + 1, N]`` rows for one rollout of ``num_envs`` environments.

    Args:
        num_steps: Capacity in time steps (a rollout may use fewer: see :meth:`reset`).
        num_envs: Number of environments (N).
        device: Where the entries live.
        allocate: ``allocate(shape, dtype)``: a zeroed CPU tensor for an entry (None:
            ``torch.zeros`` on ``device``); a process collection worker's is in shared memory.

    Attributes:
        data: The ``TensorDict``; rows ``0..step`` are this rollout's.
        step: Steps recorded so far.
        states_recorded: False once a step was inserted without the state after it (chunks
            cannot start there).
        advantage_stats: ``(mean, std)`` of the rollout's advantages given to every minibatch
            (None: per-minibatch normalisation); the distributed trainer sets global ones.
    """

    def __init__(
        self,
        *,
        num_steps: int,
        num_envs: int,
        device: torch.device | str,
        allocate: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
    ):
        self.capacity = num_steps
        self._allocate = allocate
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.data = TensorDict({}, batch_size=[num_steps + 1, num_envs], device=self.device)
        self._buffers: dict[NestedKey, torch.Tensor] = {}  # the leaves of `data`, by key
        # Each leaf's rows as views, made once: indexing a tuple is ~30x cheaper than a tensor.
        self._rows: dict[NestedKey, tuple[torch.Tensor, ...]] = {}
        self.num_steps = num_steps
        self.step = 0
        self.states_recorded = True
        self.advantage_stats: tuple[float, float] | None = None

    def buffer(self, key: NestedKey, row: torch.Tensor) -> torch.Tensor:
        """The entry ``key``, ``[capacity + 1, N, ...]``; allocated like ``row`` (``[N, ...]``)."""
        buf = self._buffers.get(key)
        if buf is None:
            if tuple(row.shape[:1]) != (self.num_envs,):
                raise ValueError(
                    f"rollout field {key!r}: expected a value per environment ({self.num_envs}), "
                    f"got shape {tuple(row.shape)}"
                )
            shape = (self.capacity + 1, *row.shape)
            if self._allocate is not None and self.device.type == "cpu":
                buf = self._allocate(shape, row.dtype)
            else:
                buf = torch.zeros(shape, dtype=row.dtype, device=self.device)
            self.data.set(key, buf)
            self._buffers[key] = buf
            self._rows[key] = buf.unbind(0)
        return buf

    def _row(self, key: NestedKey, row: torch.Tensor, t: int) -> torch.Tensor:
        """Row ``t`` of entry ``key`` (allocated like ``row`` on first sight)."""
        rows = self._rows.get(key)
        if rows is None:
            self.buffer(key, row)
            rows = self._rows[key]
        return rows[t]

    def __getitem__(self, key: NestedKey) -> torch.Tensor:
        """The entry ``key``, every row (``[capacity + 1, N, ...]``); KeyError if never written."""
        return self._buffers[key]

    def reset(self, num_steps: int | None = None) -> None:
        """Start a new rollout of ``num_steps`` (default: capacity) steps.

        It may end after fewer (straggler preemption): everything downstream uses :attr:`step`.
        """
        num_steps = self.capacity if num_steps is None else num_steps
        if not 0 < num_steps <= self.capacity:
            raise ValueError(f"rollout length {num_steps} not in [1, {self.capacity}]")
        self.num_steps = num_steps
        self.step = 0
        self.states_recorded = True
        self.advantage_stats = None

    def set_first(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> None:
        """Record the observation and recurrent state the rollout starts from (row 0)."""
        for k, v in obs.items():
            self.buffer(("obs", k), v)[0].copy_(v)
        self.buffer("episode_starts", episode_starts)[0].copy_(episode_starts)
        for key, v in _state_leaves(state):
            self.buffer(key, v)[0].copy_(v)

    def insert(
        self,
        step: Mapping[str, torch.Tensor],
        next_obs: Mapping[str, torch.Tensor],
        next_state: TensorDict | None = None,
    ) -> None:
        """Record step ``t``'s fields (``[N, ...]`` each) and what follows it (row ``t + 1``).

        Args:
            step: The step's fields, every key recorded; ``terminated | truncated`` is the next
                row's ``episode_starts``.
            next_obs: The observation after the step, by key.
            next_state: The policy's state before ``obs[t + 1]``; None: not recorded (only
                whole-rollout minibatches can then be drawn).
        """
        t = self.step
        if t >= self.num_steps:
            raise RuntimeError(f"rollout storage is full ({self.num_steps} steps)")
        row = self._row
        for k, v in step.items():
            row(k, v, t).copy_(v)
        for k, v in next_obs.items():
            row(("obs", k), v, t + 1).copy_(v)
        starts = self._rows["episode_starts"][t + 1]
        torch.logical_or(step["terminated"], step["truncated"], out=starts)
        if next_state is None:
            self.states_recorded = False
        else:
            for key, v in _state_leaves(next_state):
                row(key, v, t + 1).copy_(v)
        self.step = t + 1

    def write_envs(self, envs: slice, rows: TensorDict) -> None:
        """Copy a block of environments' rows (``[T + 1, n]``) into columns ``envs``.

        Assembles one rollout from several collectors' (:meth:`reset` before, set :attr:`step`
        after).
        """
        for key, value in rows.items(include_nested=True, leaves_only=True):
            if value.shape[1] != envs.stop - envs.start:
                raise ValueError(
                    f"rollout field {key!r}: {value.shape[1]} environments for {envs}"
                )
            buf = self._buffers.get(key)
            if buf is None:
                like = torch.empty((self.num_envs, *value.shape[2:]), dtype=value.dtype)
                buf = self.buffer(key, like)
            buf[: value.shape[0], envs].copy_(cast(torch.Tensor, value))

    def rows(self) -> TensorDict:
        """The rows ``0..step`` of this rollout (a view of :attr:`data`)."""
        return self.data[: self.step + 1]

    def recorded(self) -> TensorDict:
        """The recorded steps, rows ``0..step - 1`` (``[T, N]``, a view of :attr:`data`)."""
        return self.data[: self.step]

    def set_advantages(self, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        """Record the rollout's ``advantages`` and value targets ``returns`` (``[T, N]`` each)."""
        t = self.step
        for key, value in (("advantages", advantages), ("returns", returns)):
            if tuple(value.shape) != (t, self.num_envs):
                raise ValueError(
                    f"rollout {key}: expected shape {(t, self.num_envs)} (steps, environments), "
                    f"got {tuple(value.shape)}"
                )
            self.buffer(key, value[0])[:t] = value

    def sequence_length(self, recurrence: int) -> int:
        """Length of the minibatch sequences for BPTT chunks of ``recurrence`` steps.

        ``0`` (or at least the rollout's length) gives whole rollouts. Otherwise the longest
        chunk up to ``recurrence`` that divides the rollout (a straggler rule may cut it short).
        """
        t = self.step
        if recurrence <= 0 or recurrence >= t:
            return t
        return next(r for r in range(recurrence, 0, -1) if t % r == 0)

    def minibatches(
        self,
        num_mini_batch: int,
        generator: torch.Generator | None = None,
        recurrence: int = 0,
    ) -> Iterator[TensorDict]:
        """Yield ``num_mini_batch`` minibatches ``[T, n]`` of sequences, drawn without replacement.

        ``recurrence=0``: a sequence is one environment's whole rollout (full BPTT from its first
        state); otherwise chunks of :meth:`sequence_length` steps, each from the state stored at
        its first step (truncated BPTT).
        """
        length = self.sequence_length(recurrence)
        if length < self.step and not self.states_recorded:
            raise ValueError(
                f"recurrence={recurrence}: this rollout was recorded without per-step recurrent "
                "states (insert(next_state=...)), so BPTT chunks have no state to start from; "
                "record them or use recurrence=0"
            )
        num_sequences = self.num_envs * (self.step // length)
        if num_mini_batch > num_sequences:
            raise ValueError(
                f"num_mini_batch={num_mini_batch} > {num_sequences} sequences "
                f"({self.num_envs} environments x {self.step // length} chunks of {length} "
                "steps): minibatches are split by sequence"
            )
        perm = torch.randperm(num_sequences, generator=generator).to(self.device)
        start = 0
        for size in evenly_distribute_count_into_bins(num_sequences, num_mini_batch):
            chosen = perm[start : start + size]
            start += size
            batch = self.batch(chosen) if length == self.step else self._chunks(chosen, length)
            yield self._with_stats(batch)

    def _with_stats(self, batch: TensorDict) -> TensorDict:
        if self.advantage_stats is not None:
            batch.set_non_tensor(ADVANTAGE_STATS, self.advantage_stats)
        return batch

    def _chunks(self, sequences: torch.Tensor, length: int) -> TensorDict:
        """The chunks ``sequences`` (numbered chunk-major: ``chunk * num_envs + env``)."""
        if length == 1:  # single steps (a memoryless policy): the sequence is the flat row
            return self._gather(sequences.unsqueeze(0))
        envs = sequences % self.num_envs
        starts = (sequences // self.num_envs) * length  # [n]
        times = starts + torch.arange(length, device=self.device).unsqueeze(1)  # [T, n]
        return self._gather(times * self.num_envs + envs)

    def batch(self, env_indices: torch.Tensor) -> TensorDict:
        """All recorded steps of the environments ``env_indices``, ``[T, n]``."""
        times = torch.arange(self.step, device=self.device).unsqueeze(1)  # [T, 1]
        return self._gather(times * self.num_envs + env_indices.to(self.device))

    def _gather(self, rows: torch.Tensor) -> TensorDict:
        """The entries at flat ``rows`` (``t * num_envs + env``), batch ``rows.shape``.

        One gather per leaf of a flat view: half the time of indexing the ``TensorDict`` with two
        index tensors, for a memoryless policy's many small minibatches.
        """
        out: dict[NestedKey, Any] = {}
        for key, buf in self._buffers.items():
            value = buf.view(-1, *buf.shape[2:])[rows]
            if isinstance(key, str):
                out[key] = value
                continue
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = value
        return TensorDict(out, batch_size=rows.shape)  # the leaves are on self.device

    def __repr__(self) -> str:
        fields: dict[str, Any] = {
            "/".join(map(str, k)) if isinstance(k, tuple) else k: (tuple(v.shape[2:]), v.dtype)
            for k, v in self._buffers.items()
        }
        return f"RolloutStorage(step={self.step}/{self.num_steps}, fields={fields})"
