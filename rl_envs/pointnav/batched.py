"""The grid PointNav (:mod:`rl_envs.pointnav.env`) as a batched environment written in torch.

:class:`BatchedPointNav` steps ``num_envs`` PointNav environments at once on one device (CPU or
CUDA) and gives, for the same seeds, exactly what as many :class:`~rl_envs.pointnav.PointNavEnv`
stepped one by one give: layouts, observations, rewards, flags, expert actions and episode
metrics, bit for bit, auto-resets included (an unseeded reset goes on with the environment's
own ``np_random``, as ``gymnasium``'s ``env.reset(seed=None)`` does).

Precomputed once per configuration, as tensors on the device: the room tables of
:class:`~rl_envs.pointnav.layout.RoomLayout` (door slots, interior cells, per-door rows of the
distance field), the grids the views are read from (a bit a cell, whether one sees behind it,
in four copies turned so that each direction's view rows are runs of bits; one set per door
layout, shared by the environments in it), the agent's places (direction and position: where
its view starts, where a turn or a step forward leads, the cells the expert looks at),
minigrid's occlusion one view row at a time as a lookup table
(:func:`~rl_envs.pointnav.view.process_vis_row` over every pair of incoming row mask and
see-behind row: 16,384 entries for a 7x7 view), a view row's encodings by its see-behind and
visible cells and the goal's column, the goal vector and the goal's place in the view by
(offset to the goal, direction), the rewards, and, for a split, whether each door layout
belongs to it. For the default layouts, per door layout and goal: the doors' distances to the
goal and the free cells' positions.

Per environment and episode: the first index and the addend of each distance row (the goal's
room, each door), so the distance of any cell is a minimum over a few lookups. Per step, over
all environments at once: the action's outcome (its place, distance and reward index, set
with the previous step's expert action), flags and episode metrics, then the observation (a
word read per view row, seven row lookups for the occlusion, a lookup of each row's encodings)
and the expert action and outcomes of the next actions (the distances of two cells). No
per-environment Python.

Resets: every environment whose episode ended in a step starts its next one in the same call,
all together. A PointNavEnv draws an episode with a few ``np_random.integers(bound)`` calls
(see ``PointNavEnv._gen_grid``); here each environment's PCG64 bit generator fills a row of raw
outputs ahead (refilled in Python when a row runs low, every hundred or so episodes), and
NumPy's bounded-integer arithmetic (Lemire's rejection on 32-bit halves of the outputs, the
other half kept for the next draw, or on whole outputs above ``2**32``) runs on those rows in
torch: for the default layouts (one 32-bit draw an episode), the draw at every half of every
row is tabled when the row is written, and so is the episode it starts (its state and distance
rows, a start drawn on the goal redrawn): a reset is then one lookup per environment. Other
layouts draw a window of the next outputs of each resetting environment, the first one accepted
(by the rejection and, for a split, by the layout's split), and compute the doors' distances
by a Bellman-Ford over the doors, as :meth:`RoomLayout.distance_field` does. Only seeded resets
(``reset``, evaluation's ``next_seeds``) build a bit generator in Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, cast

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.utils import seeding
from tensordict import TensorDict

from rl.tasks.batched import EPISODE_KEY, BatchedEnv
from rl.tasks.fields import EXPERT_ACTIONS
from rl.tasks.splits import _BUCKETS, MAX_SPLIT_DRAWS, SPLITS
from rl.utils.config import Check
from rl.utils.saved import saved_tensor
from rl_envs.pointnav.checks import checked_args, observation_space
from rl_envs.pointnav.env import Actions, PointNavEnv
from rl_envs.pointnav.layout import RoomLayout
from rl_envs.pointnav.view import (
    DIR_VEC,
    EMPTY_ENCODING,
    GOAL_ENCODING,
    WALL_ENCODING,
    process_vis_row,
    view_indices,
)

__all__ = ["BatchedPointNav"]

_M32 = 0xFFFFFFFF
_TWO32 = 1 << 32
# Larger than any geodesic distance, and twice it still an int32.
_FAR32 = 1 << 29
# The same for int16 fields, of layouts with fewer free cells than _FAR16 // 2 (a geodesic
# distance is below the number of free cells).
_FAR16 = 1 << 14
# Views up to this size use the occlusion lookup table (2 ** (2 n) entries); larger ones run
# process_vis_row on the rows directly (slower, same result).
_MAX_TABLE_VIEW = 11
# Door-layout split tables up to this many layouts; more: the split is computed per draw.
_MAX_SPLIT_TABLE = 1 << 24
# A success's SPL tabled for up to this many (shortest path length, cells moved).
_MAX_SPL_TABLE = 1 << 20
# Door layouts x doors**2 up to this many: door-to-door distances tabled per layout.
_MAX_DOOR_PAIRS = 1 << 22
# Raw outputs kept ahead per environment (at least twice the look-ahead window).
_MIN_ROW = 128
# The rows of the per-environment state: the agent's place (direction * cells + position: a
# column of _pos_table), the goal's position and its term of the goal vector's index, the
# start's distance and its row of the SPL table, the first bit of its view grids (its
# layout's, or its own), the current distance, steps taken, cells moved.
_PD, _GOAL, _GOAL_TERM, _START_DIST, _SPL_ROW, _CODES, _DIST, _STEPS, _MOVED = range(9)
_STATE_ROWS = 9
# The columns of _pos_table, by place: the view's first bit in its grids (see _places), the
# places after a left and a right turn and after a step forward, the positions of
# the cell ahead and of the cell ahead after a left turn (the expert's), the place's term of
# the goal vector's index, its first row in _view_at.
_START, _LEFT_PD, _RIGHT_PD, _AHEAD_PD, _AHEAD_POS, _LEFT_POS, _GOAL_KEY, _DOORS_AT = range(8)
# The state_dict's rows (its format): position, direction, goal, steps, moved, start distance,
# distance, distance of the cell ahead.
_SAVED_ROWS = 8
# Door layouts x free cells up to this many: each layout's free cells tabled (positions by
# free-cell index and in position order), and a reset's episode read from per-layout tables.
_MAX_FREE_TABLE = 1 << 22
# Every stream position's episode tabled (see _record) up to this many int32 values.
_MAX_RECORDS = 1 << 24
# Views tabled by (place, the doors open in view) up to this many such views; more: read
# from grids (see _observe).
_MAX_VIEWS = 1 << 19
# Every door layout's view grids (shared by the environments in it) up to this many bytes;
# more: each environment has its own, its doors written at each reset.
_MAX_SHARED_CODES = 1 << 26

# A cell's class, the row of the encodings (0 unseen, 1 empty, 2 wall, 3 goal); the grids of
# the views hold a bit a cell, whether one sees behind it (not a wall: empty), the goal added to
# views (see _goal_words).
_EMPTY_CODE, _WALL_CODE = 1, 2


def _at(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` along the first dimension (``index_select``: the cheapest lookup)."""
    picked = table.index_select(0, index.reshape(-1))
    return picked.view(*index.shape, *table.shape[1:])


def _wrapping_products(device: torch.device) -> bool:
    """Whether int64 products on ``device`` wrap modulo ``2**64`` (two's complement)."""
    value = torch.tensor([0xFFFFFFFF, 0xFFFFFFF1], dtype=torch.int64, device=device)
    got = (value * 0xFFFFFFFE).tolist()
    want = [(v * 0xFFFFFFFE) % (1 << 64) for v in (0xFFFFFFFF, 0xFFFFFFF1)]
    return [g % (1 << 64) for g in got] == want


class _Streams:
    """Each environment's ``np_random`` (a PCG64 generator), drawn from as a batch.

    Environment ``i``'s bit generator fills row ``i`` of :attr:`raw` with its next raw 64-bit
    outputs (refilled in Python when the row runs low). NumPy's ``Generator.integers(bound)``
    takes, for ``bound <= 2**32``, 32-bit halves of the outputs in order (low, then high: the
    high half waits in ``has_uint32``/``uinteger`` for the next 32-bit draw), and for larger
    bounds whole outputs, leaving a waiting half where it is. So the state of a row is
    :attr:`pos`, the index of the next half to read (odd: a high half is waiting), and
    :attr:`skip`, the whole outputs taken by 64-bit draws while a half was waiting (the
    32-bit stream goes on after them). :meth:`draw32` and :meth:`draw64` are ``integers``
    for many environments at once: the next outputs of each (a window) under Lemire's
    rejection, the first accepted taken.
    """

    def __init__(self, num_envs: int, device: torch.device, window: int) -> None:
        self.device = device
        self.window = window  # halves (32-bit draws) or outputs (64-bit) examined per pass
        self.row = max(_MIN_ROW, 2 * window)
        self.bitgens: list[np.random.PCG64 | None] = [None] * num_envs
        self.raw = torch.zeros((num_envs, self.row), dtype=torch.int64, device=device)
        # the rows' 32-bit halves, low then high, as int64 (what 32-bit draws read)
        self.halves = torch.zeros((num_envs, 2 * self.row), dtype=torch.int64, device=device)
        self.pos = torch.full((num_envs,), 2 * self.row, dtype=torch.int64, device=device)
        self.skip = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.used_skip = False  # a 64-bit draw happened (skip may be nonzero)
        self.wraps = _wrapping_products(device)
        self._ar = self.window_index = torch.arange(window, device=device)
        # draws tabled by table_draw: name -> (bound, acceptance, values, ends)
        self.tabled: dict[str, tuple[Any, ...]] = {}
        # each row's first index in the flat view of a [num_envs, 2 row + 1] table
        self.row_base = torch.arange(num_envs, device=device) * (2 * self.row + 1)
        # called with the rows tabled again (after table_draw's tables)
        self.on_table: Callable[[torch.Tensor], None] | None = None

    # ------------------------------------------------------------------ seeding
    def seed(self, envs: list[int], seeds: list[int | None]) -> None:
        """New generators, as ``gymnasium``'s ``reset(seed=...)`` makes them (None: OS entropy)."""
        rows = []
        for i, seed in zip(envs, seeds, strict=True):
            rng, _ = seeding.np_random(int(seed) if isinstance(seed, np.integer) else seed)
            bitgen = cast("np.random.PCG64", rng.bit_generator)
            self.bitgens[i] = bitgen
            rows.append(bitgen.random_raw(self.row).view(np.int64))
        self._write(torch.tensor(envs, device=self.device), np.stack(rows))
        self.pos[torch.tensor(envs, device=self.device)] = 0
        self.skip[torch.tensor(envs, device=self.device)] = 0

    def _write(self, envs: torch.Tensor, rows: np.ndarray) -> None:
        """Set the rows of ``envs`` to these raw outputs (int64 ``[len(envs), row]``)."""
        self.raw[envs] = torch.from_numpy(rows).to(self.device)
        halves = rows.view(np.uint32).astype(np.int64)  # little-endian: low, high, ...
        self.halves[envs] = torch.from_numpy(halves).to(self.device)
        self._table(envs)

    def _ensure(self, envs: torch.Tensor, ahead: int) -> None:
        """Refill the rows of ``envs`` with fewer than ``ahead`` unread outputs."""
        first = self.pos[envs] >> 1  # the waiting half's output, or the next one
        if self.used_skip:
            first = first + self.skip[envs]
        low = first > self.row - ahead - 1
        if bool(low.any()):
            self._refill(envs[low])

    def _refill(self, ids: torch.Tensor) -> None:
        """Rows ``ids`` keep their unread outputs, moved to the front, then fresh ones.

        A waiting half's output is kept; the outputs 64-bit draws took after it are dropped.
        """
        rows = self.raw[ids].cpu().numpy()
        pos, skip = self.pos[ids].tolist(), self.skip[ids].tolist()
        for k, i in enumerate(ids.tolist()):
            c = pos[k] >> 1  # the waiting half's output, or the next one
            kept = rows[k, c:]
            if pos[k] & 1 and skip[k]:
                kept = np.concatenate((kept[:1], kept[1 + skip[k] :]))
            fresh = self.bitgens[i].random_raw(self.row - len(kept))
            rows[k] = np.concatenate((kept, fresh.view(np.int64)))
        self.pos[ids] &= 1
        self.skip[ids] = 0
        self._write(ids, rows)

    # ------------------------------------------------------- the episode's draw
    def table_draw(
        self, name: str, bound: int, accept: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> None:
        """Table ``integers(bound)`` (until ``accept``) at every half of every row.

        Then :meth:`draw_tabled` is that draw in two lookups: each row's values (the draw
        ending at each half) and, at each half, the next half where a draw ends (accepted).
        Rows are tabled again whenever they are written.
        """
        halves, n = 2 * self.row, len(self.bitgens)
        values = torch.zeros_like(self.halves)
        ends = torch.full((n, halves + 1), halves, dtype=torch.int64, device=self.device)
        self.tabled[name] = (bound, accept, values, ends)
        self._halves_index = torch.arange(halves, device=self.device)
        self._table(torch.arange(n, device=self.device))

    def _table(self, envs: torch.Tensor) -> None:
        halves = 2 * self.row
        for bound, accept, values, ends in self.tabled.values():
            value, ok = self.lemire(self.halves.index_select(0, envs), bound)
            if accept is not None:
                ok &= accept(value)
            end = torch.where(ok, self._halves_index, halves)
            values[envs] = value
            ends[envs, :halves] = end.flip(1).cummin(1).values.flip(1)
        if self.on_table is not None:
            self.on_table(envs)

    def refill_low(self, envs: torch.Tensor, half: int) -> None:
        """Refill the rows of ``envs`` and every row read past ``half``."""
        self._refill(torch.cat((envs, (self.pos > half).nonzero()[:, 0])).unique())

    def draw_tabled(self, name: str, envs: torch.Tensor) -> torch.Tensor:
        """:meth:`draw32` of a tabled bound and acceptance, for each of ``envs``."""
        bound, accept, values, ends = self.tabled[name]
        halves = 2 * self.row
        end = ends.view(-1).index_select(0, envs * (halves + 1) + self.pos[envs])
        if bool((end == halves).any()):  # rows without a draw ahead: refill (all half-read)
            self.refill_low(envs[end == halves], halves // 2)
            end = ends.view(-1).index_select(0, envs * (halves + 1) + self.pos[envs])
            if bool((end == halves).any()):  # not one in a whole row: draw by windows
                return self.draw32(envs, bound, accept)
        self.pos[envs] = end + 1
        return values.view(-1).index_select(0, envs * halves + end)

    def lemire(self, u: torch.Tensor, bound: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Lemire's value and acceptance of 32-bit halves ``u`` for ``bound`` (<= 2**32)."""
        if isinstance(bound, int) and bound == _TWO32:
            return u, torch.ones_like(u, dtype=torch.bool)
        threshold = (_TWO32 - bound) % bound
        if self.wraps:  # u * b < 2**64: its bits are the wrapped int64 product's
            m = u * bound
            return (m >> 32) & _M32, (m & _M32) >= threshold
        lo = (u & 0xFFFF) * bound  # in 16-bit pieces
        hi = (u >> 16) * bound
        value = (hi + (lo >> 16)) >> 16
        return value, ((lo + ((hi & 0xFFFF) << 16)) & _M32) >= threshold

    # -------------------------------------------------------------------- draws
    def draw32(
        self,
        envs: torch.Tensor,
        bound: int | torch.Tensor,
        accept: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``integers(bound)`` for each of ``envs`` (distinct), for bounds up to ``2**32``.

        With ``accept``, the draw repeats until ``accept(value)`` holds (as a loop of
        ``integers`` calls would, each consuming its outputs).

        Args:
            envs: Environment indices ``[B]``.
            bound: One bound for all, or ``[B]`` bounds (each >= 1).
            accept: Maps values ``[b, W]`` to bool ``[b, W]``.

        Returns:
            ``[B]`` int64 values.
        """
        count = envs.numel()
        const = isinstance(bound, int)
        if const and bound == 1:  # NumPy draws nothing for a range of one value
            return torch.zeros(count, dtype=torch.int64, device=self.device)
        width, span = self.window, 2 * self.row
        halves = self.halves.view(-1)
        out: torch.Tensor | None = None
        todo: torch.Tensor | None = None  # positions in envs still to draw (None: all)
        while True:
            e = envs if todo is None else envs[todo]
            self._ensure(e, width // 2 + 1)
            pos = self.pos[e]
            index = (e * span + pos)[:, None] + self._ar
            if self.used_skip:  # after a waiting half, the halves after the 64-bit draws
                later = (pos & 1).bool()[:, None] & (self._ar > 0)
                index = index + torch.where(later, 2 * self.skip[e][:, None], 0)
            u = _at(halves, index)
            b = bound if const else (bound if todo is None else bound[todo])[:, None]  # type: ignore[index]
            value, ok = self.lemire(u, b)
            if accept is not None:
                ok &= accept(value)
            found, j = ok.max(1)  # the first accepted
            used = torch.where(found, j + 1, width)
            if not const:  # a range of one value draws nothing
                single = b[:, 0] == 1  # type: ignore[index]
                used = torch.where(single, 0, used)
                found = found | single
            if self.used_skip:
                skipped = (used > 0) & (pos & 1).bool()
                pos = pos + torch.where(skipped, 2 * self.skip[e], 0)
                self.skip[e] = torch.where(used > 0, 0, self.skip[e])
            self.pos[e] = pos + used
            picked = value.gather(1, j[:, None]).squeeze(1)
            if out is None:
                out = picked
            else:
                out[todo] = picked
            if bool(found.all()):
                return out if isinstance(bound, int) else torch.where(bound == 1, 0, out)
            todo = found.logical_not().nonzero().squeeze(1) if todo is None else todo[~found]

    def draw64(
        self,
        envs: torch.Tensor,
        bound: int,
        accept: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``integers(bound)`` for each of ``envs``, for a bound above ``2**32`` (below 2**63).

        NumPy's Lemire rejection on whole outputs: the 128-bit product of an output and
        ``bound``, in 16-bit columns. A waiting half stays waiting (:attr:`skip` grows).
        """
        self.used_skip = True
        count = envs.numel()
        out = torch.zeros(count, dtype=torch.int64, device=self.device)
        threshold = ((1 << 64) - bound) % bound
        t_hi, t_lo = threshold >> 32, threshold & _M32
        limbs = [(bound >> (16 * k)) & 0xFFFF for k in range(4)]
        width = self.window
        todo = torch.arange(count, device=self.device)
        flat = self.raw.view(-1)
        while True:
            e = envs[todo]
            self._ensure(e, width)
            pos, skip = self.pos[e], self.skip[e]
            first = ((pos + 1) >> 1) + skip  # the next output no half was taken from
            r = _at(flat, (e * self.row + first)[:, None] + self._ar)
            cols: list[Any] = [0] * 8
            for k, part in enumerate((r & _M32, (r >> 32) & _M32)):
                for m, limb in enumerate(limbs):
                    if limb:
                        p = part * limb  # < 2**48
                        cols[2 * k + m] = cols[2 * k + m] + (p & 0xFFFF)
                        cols[2 * k + m + 1] = cols[2 * k + m + 1] + ((p >> 16) & 0xFFFF)
                        cols[2 * k + m + 2] = cols[2 * k + m + 2] + (p >> 32)
            carry: Any = 0
            for k in range(8):
                v = cols[k] + carry
                carry = v >> 16
                cols[k] = v & 0xFFFF
            left_lo = cols[0] | (cols[1] << 16)
            left_hi = cols[2] | (cols[3] << 16)
            value = cols[4] | (cols[5] << 16) | (cols[6] << 32) | (cols[7] << 48)
            ok = (left_hi > t_hi) | ((left_hi == t_hi) & (left_lo >= t_lo))
            if accept is not None:
                ok &= accept(value)
            found, j = ok.max(1)  # the first accepted
            used = torch.where(found, j + 1, width)
            waiting = (pos & 1).bool()
            self.skip[e] = torch.where(waiting, skip + used, skip)
            self.pos[e] = torch.where(waiting, pos, pos + 2 * used)
            out[todo] = value.gather(1, j[:, None]).squeeze(1)
            if bool(found.all()):
                return out
            todo = todo[~found]

    def draw(
        self,
        envs: torch.Tensor,
        bound: int,
        accept: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``integers(bound)`` for a fixed bound, whichever NumPy path it takes."""
        if bound <= _TWO32:
            return self.draw32(envs, bound, accept)
        return self.draw64(envs, bound, accept)

    # ---------------------------------------------------------------- save/load
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generators' states, the rows read ahead and the positions in them."""
        limbs = []
        for bitgen in self.bitgens:
            st = bitgen.state["state"]  # type: ignore[union-attr]
            words = (st["state"], st["inc"])
            limbs.append([(v >> (32 * k)) & _M32 for v in words for k in range(4)])
        return {
            "pcg64": torch.tensor(limbs, dtype=torch.int64),
            "raw": self.raw.cpu(),
            "pos": self.pos.cpu(),
            "skip": self.skip.cpu(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` saved.

        Raises:
            ValueError: A value of another kind, size or range (it may come from a file).
        """
        n = len(self.bitgens)
        if not isinstance(state, Mapping):
            raise ValueError("batched environment state 'streams': expected a dict")
        limbs = saved_tensor(state, "pcg64", (n, 8), torch.int64, 0, 1 << 32)
        raw = saved_tensor(state, "raw", (n, self.row), torch.int64)
        pos = saved_tensor(state, "pos", (n,), torch.int64, 0, 2 * self.row + 1)
        skip = saved_tensor(state, "skip", (n,), torch.int64, 0, self.row + 1)
        for i, row in enumerate(limbs.tolist()):
            value = sum(v << (32 * k) for k, v in enumerate(row[:4]))
            inc = sum(v << (32 * k) for k, v in enumerate(row[4:]))
            bitgen = np.random.PCG64()
            bitgen.state = {
                "bit_generator": "PCG64",
                "state": {"state": value, "inc": inc},
                "has_uint32": 0,
                "uinteger": 0,
            }
            self.bitgens[i] = bitgen
        self._write(torch.arange(n, device=self.device), raw.numpy())
        self.pos.copy_(pos)
        self.skip.copy_(skip)
        self.used_skip = bool(self.skip.any())


def _split_buckets(key: torch.Tensor) -> torch.Tensor:
    """:func:`rl.tasks.splits.split_of`'s bucket (0-9) of keys below ``2**32``, in torch."""
    lo = (key & 0xFFFF) * 0x9E3779B1  # key * 0x9E3779B1 mod 2**32 in 16-bit pieces
    hi = ((key >> 16) * 0x9E3779B1) & 0xFFFF
    return ((((lo + (hi << 16)) & _M32) + 0x7F4A7C15) & _M32) % 10


def _doors_in_split(
    door_v: torch.Tensor, lengths: list[int], buckets: torch.Tensor
) -> torch.Tensor:
    """Whether layouts with these door offsets (``[..., doors]``) are in a split.

    The layout key of :meth:`RoomLayout.layout_key` (modulo ``2**32``, all its hash reads), and
    ``buckets[b]``: whether bucket ``b`` is the split's.
    """
    key = torch.zeros(door_v.shape[:-1], dtype=torch.int64, device=door_v.device)
    for k, length in enumerate(lengths):
        key = (key * length + door_v[..., k]) & _M32
    return buckets[_split_buckets(key)]


@functools.lru_cache(maxsize=8)
def _one_room_split_table(size: int, split: str) -> np.ndarray:
    """Whether each packed draw of a one-room layout (goal, direction, start) is in ``split``."""
    layout = RoomLayout(size, 1)
    n = layout.n_free
    return np.array(
        [
            layout.split_of([], (u % n, (u // n) % 4, u // (4 * n))) == split
            for u in range(n * 4 * n)
        ],
        dtype=bool,
    )


# BatchedPointNav._layout_tables' NumPy tables by (size, rooms per side, view size).
_LAYOUT_TABLES: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


@functools.lru_cache(maxsize=4)
def _row_images(n: int) -> np.ndarray:
    """A view row's encodings by its key (see BatchedPointNav._views): ``[2**(2n + 4), 3n]``."""
    encodings = np.asarray([(0, 0, 0), EMPTY_ENCODING, WALL_ENCODING, GOAL_ENCODING])
    key = np.arange(1 << (2 * n + 4))
    j = np.arange(n)
    see = (key[:, None] >> j) & 1
    visible = (key[:, None] >> (n + j)) & 1
    goal = ((key >> (2 * n)) & 7)[:, None] == j + 1
    classes = np.where(goal, 3, 2 - see)  # goal, empty or wall
    classes[:, n - 1] = np.where(key >> (2 * n + 3), 1, classes[:, n - 1])  # the agent
    return encodings[classes * visible].reshape(len(key), 3 * n).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def _tabled_views(size: int, rooms_per_side: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:meth:`BatchedPointNav._view_table`'s tables (NumPy; None: more than ``_MAX_VIEWS``).

    The grid's geometry as BatchedPointNav's (padding, positions, oriented views).
    """
    layout = RoomLayout(size, rooms_per_side)
    pad = max(1, n - 2)
    side = size + 2 * pad
    cells = side * side
    slots = layout.door_slots
    nd = len(slots)
    longest = max([slot[4] for slot in slots], default=1)
    see = np.zeros(cells, dtype=np.int64)  # the rooms' cells (door slots: walls)
    interior = (layout.cell_x_np + pad) * side + layout.cell_y_np + pad
    see[interior] = 1
    slot_of = np.full(cells, -1, dtype=np.int64)
    offset_of = np.zeros(cells, dtype=np.int64)
    reachable = list(interior)
    for k, (x0, y0, ax, ay, length) in enumerate(slots):
        at = (x0 + pad) * side + y0 + pad + (ax * side + ay) * np.arange(length)
        slot_of[at], offset_of[at] = k, np.arange(length)
        reachable += list(at)
    view_x, view_y = view_indices(n, 0)
    shift = 8 * np.arange(n)[:, None] + np.arange(n)  # view cell (i, j): bit 8 i + j
    at_table = np.zeros((4 * cells, max(nd, 1), longest), dtype=np.int64)
    words, total = [], 0
    for d in range(4):
        view = view_x[d] * side + view_y[d]  # [i, j]
        for pos in reachable:
            cell = pos + view
            place_views = np.array([(see[cell] << shift).sum()])
            weight = 1
            for k in range(nd):
                i, j = np.nonzero(slot_of[cell] == k)
                if not len(i):
                    continue
                opened = np.concatenate(([0], 1 << (8 * i + j)))  # none, or that cell open
                at_table[d * cells + pos, k, offset_of[cell[i, j]]] = (
                    np.arange(1, len(i) + 1) * weight
                )
                place_views = (place_views[None, :] + opened[:, None]).reshape(-1)
                weight *= len(opened)
            at_table[d * cells + pos, 0] += total
            words.append(place_views)
            total += len(place_views)
            if total > _MAX_VIEWS:
                return None
    row_mask = (1 << n) - 1
    rows = (np.concatenate(words)[:, None] >> (8 * np.arange(n))) & row_mask  # [view, i]
    incoming: Any = 1 << (n // 2)
    visible = np.zeros_like(rows)
    for c in range(n - 1, -1, -1):  # process_vis, row c: the view cells (i, c)
        column = (((rows >> c) & 1) << np.arange(n)).sum(1)
        mask, incoming = process_vis_row(incoming, column, n)
        visible |= ((mask[:, None] >> np.arange(n)) & 1) << c
    return rows | (visible << n), at_table.reshape(-1)


class BatchedPointNav(BatchedEnv):
    """``num_envs`` :class:`~rl_envs.pointnav.PointNavEnv` stepped at once in torch on ``device``.

    Environment ``i`` gives exactly what a ``PointNavEnv`` with the same arguments gives when
    reset with ``seeds[i]`` and, after each episode, reset with ``next_seeds[i]`` (or unseeded):
    the same episodes, observations (``image`` uint8 ``(view, view, 3)``, ``goal`` float32
    ``(3,)``), rewards, flags, ``expert_actions`` and ``episode`` metrics (``success``,
    ``spl``, ``final_distance``, ``shortest_path_length``). ``final_obs`` is in a step where an
    episode was truncated (zeros in the other rows), absent from the others. See the module's
    docstring for how.

    Attributes:
        num_envs: How many environments.
        device: Where everything lives.
        observation_space: One environment's (PointNavEnv's).
        action_space: ``Discrete(4)`` (:class:`~rl_envs.pointnav.env.Actions`).
        step_fields: PointNavEnv's: ``expert_actions``.
    """

    step_fields = PointNavEnv.step_fields

    def __init__(
        self,
        *,
        size: int = 19,
        rooms_per_side: int = 2,
        max_steps: int = 100,
        step_penalty: float = 0.01,
        success_bonus: float = 2.5,
        distance_reward_scale: float = 1.0,
        min_start_distance: int = 1,
        agent_view_size: int = 7,
        split: Annotated[str | None, Check(choices=SPLITS)] = None,
        render_mode: str | None = None,
        num_envs: Annotated[int, Check(ge=1)],
        device: str | torch.device,
    ) -> None:
        """Build the environments (arguments as :class:`~rl_envs.pointnav.PointNavEnv`'s).

        Args:
            size: Side of the square grid, outer walls included.
            rooms_per_side: Rooms per row and column (1: a single open room).
            max_steps: Steps after which an episode is truncated.
            step_penalty: Subtracted from the reward on every step.
            success_bonus: Added to the reward when ``STOP`` is taken on the goal cell.
            distance_reward_scale: Multiplies the per-step decrease of geodesic distance.
            min_start_distance: Minimum geodesic distance (cells) from start to goal.
            agent_view_size: Side of the egocentric view (odd, >= 3).
            split: ``train``, ``valid``, ``test`` or None (see PointNavEnv).
            render_mode: ``None``, ``"rgb_array"`` or ``"human"``: :meth:`render` draws one
                environment through a PointNavEnv placed in its episode.
            num_envs: How many environments.
            device: Where the environments run (``"cpu"``, ``"cuda"``, ...).

        Raises:
            ValueError: If an argument is out of range (PointNavEnv's checks).
        """
        size, rooms_per_side, max_steps, min_start_distance, n = checked_args(
            size=size,
            rooms_per_side=rooms_per_side,
            max_steps=max_steps,
            min_start_distance=min_start_distance,
            agent_view_size=agent_view_size,
            floats={
                "step_penalty": step_penalty,
                "success_bonus": success_bonus,
                "distance_reward_scale": distance_reward_scale,
            },
            render_mode=render_mode,
            render_modes=PointNavEnv.metadata["render_modes"],
        )
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer):
            raise ValueError(f"num_envs must be an int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = n_envs = int(num_envs)
        self.device = dev = torch.device(device)
        self.render_mode = render_mode
        self.config: dict[str, Any] = {
            "size": size,
            "rooms_per_side": rooms_per_side,
            "max_steps": max_steps,
            "step_penalty": float(step_penalty),
            "success_bonus": float(success_bonus),
            "distance_reward_scale": float(distance_reward_scale),
            "min_start_distance": min_start_distance,
            "agent_view_size": n,
            "split": split,
        }
        self.size, self.max_steps, self.split = size, max_steps, split
        self.min_start_distance = min_start_distance
        self.agent_view_size = n
        self.observation_space = observation_space(n)
        self.action_space = spaces.Discrete(len(Actions))
        self._twin: PointNavEnv | None = None
        self._started = False
        self._batch = torch.Size([n_envs])
        layout = self._layout = RoomLayout(size, rooms_per_side)

        def tensor(values: Any, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values), dtype=dtype, device=dev)

        self._tensor = tensor
        # ---- positions: (x + pad) * side + y + pad, in grids padded with walls all around to
        # hold any view of an agent inside (the view grids, distances, moves, goal offsets)
        self._pad = pad = max(1, n - 2)
        self._side = side = size + 2 * pad
        self._cells = cells = side * side
        if n_envs * 4 * cells >= 1 << 31:
            raise ValueError(f"num_envs={n_envs} is too many for {size}x{size} grids")
        px, py = np.divmod(np.arange(cells), side)
        px, py = px - pad, py - pad  # grid coordinates (outside: the padding)
        # goal offsets (ox, oy) as ox * (2 size - 1) + oy, by differences of these
        pos_key = px * (2 * size - 1) + py
        self._pos_key = tensor(pos_key)
        self._goal_center = (size - 1) * (2 * size - 1) + size - 1
        self._rooms_and_doors(layout, px, py)
        self._views()
        self._places(pos_key)

        # ---- goal vectors, rewards
        span = 2 * size - 1
        goals = np.zeros((span * span, 4, 3), dtype=np.float32)
        for ox in range(-(size - 1), size):
            for oy in range(-(size - 1), size):
                for d, (fx, fy) in enumerate(DIR_VEC):  # as PointNavEnv._goal_vector
                    goals[(ox + size - 1) * span + oy + size - 1, d] = np.array(
                        [ox * fx + oy * fy, -ox * fy + oy * fx, math.hypot(ox, oy)],
                        dtype=np.float32,
                    )
        self._goal_table = tensor(goals.reshape(-1, 3), torch.float32)
        # the goal in the view (the grids have none), by the same index: its column in view
        # row i's key (rows of up to 7 cells), or its class bit at cell (i, j) (larger views)
        view_x, view_y = view_indices(n, 0)
        one_word = self._width == 8
        marks = np.zeros((span * span * 4, n if one_word else n * n), dtype=np.int64)
        if one_word:  # (and the agent's row's flag, see _views)
            marks[:, n // 2] = 1 << (2 * n + 3)
        for d in range(4):
            inside = (np.abs(view_x[d]) < size) & (np.abs(view_y[d]) < size)
            at = ((view_x[d] + size - 1) * span + view_y[d] + size - 1) * 4 + d
            for i, j in zip(*np.nonzero(inside), strict=True):
                if one_word:  # the goal's column + 1, in its row's key
                    marks[at[i, j], i] |= (j + 1) << (2 * n)
                else:
                    marks[at[i, j], i * n + j] = 2
        self._view_table()
        # (rows of up to 7 cells: a row of it per index, read as rows; larger: by column)
        self._goal_words = tensor(
            marks if one_word else marks.T, torch.int32 if one_word else torch.uint8
        )
        # rewards by index: distance before - after + 1 (as PointNavEnv.step sums them), then
        # a success's
        scale, penalty = float(distance_reward_scale), float(step_penalty)
        rewards = [scale * change - penalty for change in (-1, 0, 1)]
        self._rewards = tensor(
            [*rewards, scale * 0 - penalty + float(success_bonus)], torch.float32
        )
        self._zero, self._one = tensor(0.0, torch.float64), tensor(1.0, torch.float64)
        self._zero32 = tensor(0.0, torch.float32)
        self._action = {a: tensor(int(a)) for a in Actions}
        # a success's SPL by shortest path length * (max_steps + 1) + cells moved (as
        # PointNavEnv computes it, in double precision), where that table is small
        self._spl: torch.Tensor | None = None
        if layout.n_free * (max_steps + 1) <= _MAX_SPL_TABLE:
            length = np.arange(layout.n_free, dtype=np.float64)[:, None]
            moved = np.arange(max_steps + 1, dtype=np.float64)[None, :]
            with np.errstate(divide="ignore", invalid="ignore"):
                spl = np.where(length == 0, 1.0, length / np.maximum(moved, length))
            self._spl = tensor(spl.reshape(-1), torch.float32)

        # ---- episode draws (RoomLayout.draw's packed integers) and the split
        self._chunks = layout.draw_chunks
        self._n_values = sum(len(chunk) for _, chunk in self._chunks)
        self._decode = []
        for _, chunk in self._chunks:
            div = np.cumprod([1, *chunk[:-1]], dtype=object).astype(np.int64)
            self._decode.append((tensor(div), tensor(chunk)))
        self._door_lengths = [slot[4] for slot in layout.door_slots]
        nd = self._n_doors
        self._bucket_ok = tensor([b == split for b in _BUCKETS], torch.bool)
        # For a split, whether each draw's layout is in it, by packed value % modulus (the
        # doors are its lowest digits; one room: the whole draw), where that table is small.
        self._split_table: torch.Tensor | None = None
        self._split_modulus = 1
        if split is not None:
            n_layouts = math.prod(self._door_lengths) if nd else self._chunks[0][0]
            if nd == 0:
                self._split_table = tensor(_one_room_split_table(size, split), torch.bool)
            elif n_layouts <= _MAX_SPLIT_TABLE and len(self._chunks) == 1:
                codes = torch.arange(n_layouts)
                places = torch.tensor(np.cumprod([1, *self._door_lengths[:-1]]).tolist())
                door_v = (codes[:, None] // places) % torch.tensor(self._door_lengths)
                buckets = torch.tensor([b == split for b in _BUCKETS])
                table = _doors_in_split(door_v, self._door_lengths, buckets)
                self._split_table = table.to(dev)
            self._split_modulus = int(n_layouts)
        # a split no layout falls in (PointNavEnv raises at reset, after its draws)
        self._split_empty = self._split_table is not None and not bool(self._split_table.any())
        window = 16 if split is None else (32 if split == "train" else 128)
        self._streams = _Streams(n_envs, dev, window)
        if len(self._chunks) == 1 and self._chunks[0][0] <= _TWO32:  # one 32-bit draw
            self._streams.table_draw("episode", self._chunks[0][0], self._packed_in_split(0))

        # ---- the grids of the views: four oriented copies of a grid (see _places), a bit a
        # cell, per door layout (its doors open), or per environment (its doors written at
        # each reset); the goal is not in them (see _goal_words), so that environments share
        # their layout's
        lengths = self._door_lengths
        n_layouts = math.prod(lengths)
        self._layout_radix_all = tensor(np.cumprod([1, *lengths[:-1]])[:nd]).reshape(nd, 1)
        self._block = block = 8 * ((4 * cells + 7) // 8)  # bits a layout's (or environment's)
        self._shared_codes = n_layouts * block // 8 <= _MAX_SHARED_CODES
        bits = np.zeros((n_layouts if self._shared_codes else n_envs, block), dtype=np.uint8)
        bits[:, : 4 * cells] = self._code_copies
        if self._shared_codes and nd:
            radix = np.cumprod([1, *lengths[:-1]])
            offsets = (np.arange(n_layouts)[:, None] // radix) % lengths
            at = self._copies.cpu().numpy()[self._door_positions(offsets)]  # [L, D, 4]
            bits[np.arange(n_layouts)[:, None, None], at] = 1
        if not self._shared_codes:  # (a byte a bit, for the doors' writes)
            self._bits = tensor(bits.reshape(-1), torch.uint8)
            self._byte_bit = tensor(np.arange(8))  # (bit k of a byte: weight 2**k)
            self._byte_bits = tensor(1 << np.arange(8), torch.uint8)
        packed = np.packbits(bits.reshape(-1), bitorder="little")
        self._codes = tensor(np.concatenate((packed, np.zeros(8, dtype=np.uint8))), torch.uint8)
        # every 8 bytes from each byte (a view row's bits read from one int64 word)
        self._windows = self._codes.unfold(0, 8, 1)
        self._env_base = torch.arange(n_envs, device=dev) * block

        # ---- per-environment state, a row per field and a column per environment (so that
        # every operation runs along the environments): the agent and counters (int64,
        # _STATE_ROWS rows); what its episode's distances are made of (int32: _episode_rows'
        # distance rows and addends, the doors' offsets, the goal's position); each action's
        # outcome (_expert)
        self._state = torch.zeros((_STATE_ROWS, n_envs), dtype=torch.int64, device=dev)
        self._episode = torch.zeros((3 * nd + 3, n_envs), dtype=torch.int32, device=dev)
        self._layout_tables(layout)
        self._next = torch.zeros((12, n_envs), dtype=torch.int64, device=dev)
        self._next_rows = tensor([0, 4, 8])[:, None]
        self._ones = torch.ones(n_envs, dtype=torch.int64, device=dev)

    def _rooms_and_doors(self, layout: RoomLayout, px: np.ndarray, py: np.ndarray) -> None:
        """The room structure as tables by position (RoomLayout's, for distances and codes).

        The distance from cell ``p`` to the goal is the minimum over the rows of
        ``_distance_rows`` of an episode, at ``p``, plus that row's addend: the goal's row (the
        Manhattan distance within the goal's room; addend 0) and each door's row at its offset
        (the Manhattan distance from the cells of the door's rooms, 0 on the door; addend: the
        door's distance to the goal): what :meth:`RoomLayout.distance_field` computes. Walls are
        ``-far`` (then -1): in the goal rows the cells never free, in a door's rows the other
        cells of its slot; other cells are ``far``. The doors' distances are a Bellman-Ford over
        the doors from ``_goal_doors`` (the goal room's doors) along ``_door_edges``, each
        indexed by the doors' offsets.
        """
        tensor = self._tensor
        size, side = self.size, self._side
        cells = side * side
        slots = layout.door_slots
        nd = self._n_doors = len(slots)
        n_cells = self._n_cells = len(layout.cell_x)
        n_free = self._n_free = layout.n_free
        small = n_free < _FAR16 // 2  # distances and tables fit int16
        far = _FAR16 if small else _FAR32
        self._longest = longest = max([s[4] for s in slots], default=1)
        inside = (px >= 0) & (px < size) & (py >= 0) & (py < size)
        grid_index = np.where(inside, px * size + py, 0)
        room = np.where(inside, np.asarray(layout.room_of_flat)[grid_index], -1)
        slot_of = np.full(cells, -1, dtype=np.int64)
        door_pos = np.zeros((nd, longest), dtype=np.int64)
        pad = self._pad
        for d, (x0, y0, ax, ay, length) in enumerate(slots):
            for v in range(length):
                door_pos[d, v] = (x0 + ax * v + pad) * side + y0 + ay * v + pad
                slot_of[door_pos[d, v]] = d
        wall = (room < 0) & (slot_of < 0)  # never free
        cell_pos = (layout.cell_x_np + pad) * side + layout.cell_y_np + pad
        self._cell_pos = tensor(cell_pos)
        self._slot_pos0 = tensor(door_pos[:, 0])
        step = [(ax * side + ay) for _, _, ax, ay, _ in slots]
        self._slot_step = tensor(step).reshape(nd)
        self._slot_x0 = tensor([s[0] for s in slots]).reshape(nd)
        self._slot_y0 = tensor([s[1] for s in slots]).reshape(nd)
        self._slot_ax = tensor([s[2] for s in slots]).reshape(nd)
        self._slot_ay = tensor([s[3] for s in slots]).reshape(nd)

        def manhattan(at: np.ndarray) -> np.ndarray:
            return np.abs(px[None, :] - px[at][:, None]) + np.abs(py[None, :] - py[at][:, None])

        cell_room = room[cell_pos]
        goal_rows = np.full((n_free, cells), far, dtype=np.int64)
        same = room[None, :] == cell_room[:, None]
        goal_rows[:n_cells] = np.where(same, manhattan(cell_pos), far)
        goal_rows[:, wall] = -far
        door_rows = np.full((nd, longest, cells), far, dtype=np.int64)
        goal_doors = np.full((n_free, max(nd, 1), longest), _FAR32, dtype=np.int64)
        edges = np.full((max(nd, 1), max(nd, 1), longest, longest), _FAR32, dtype=np.int64)
        for d in range(nd):
            rooms = [r for r, doors in enumerate(layout.room_doors) if d in doors]
            near, in_room = np.isin(room, rooms), np.isin(cell_room, rooms)
            length = slots[d][4]
            to_cells = manhattan(door_pos[d, :length])  # [offset, cell]
            door_rows[d, :length] = np.where(near[None, :], to_cells, far)
            door_rows[d, :length, slot_of == d] = -far
            door_rows[d, np.arange(length), door_pos[d, :length]] = 0
            # an interior goal's distance to the doors of its room
            goal_doors[:n_cells, d, :length] = np.where(
                in_room[:, None], to_cells[:, cell_pos].T, _FAR32
            )
            goal_doors[n_cells + d, d, :] = 0  # the goal is door d
            for e in layout.door_adj[d]:
                between = to_cells[:, door_pos[e, : slots[e][4]]]
                edges[d, e, :length, : slots[e][4]] = between
        dtype = torch.int16 if small else torch.int32
        self._distance_rows = tensor(
            np.concatenate((goal_rows, door_rows.reshape(nd * longest, cells))).reshape(-1), dtype
        )
        # each door's first row in _distance_rows, as an index of its first value
        self._door_row0 = tensor((n_free + np.arange(nd) * longest) * cells)
        self._door_offset = tensor(np.arange(nd) * longest)
        self._goal_doors = tensor(goal_doors.reshape(-1), torch.int32)
        self._goal_doors_np = goal_doors
        self._door_edges = tensor(edges.reshape(-1), torch.int32)
        pairs = (np.arange(nd)[:, None] * nd + np.arange(nd)[None, :]) * longest * longest
        self._edge_base = tensor(pairs)[:, :, None]  # [from, to, 1]
        # With few door layouts, every layout's door-to-door distances (Floyd-Warshall), by
        # the layout's number (offsets in mixed radix): then no Bellman-Ford per reset.
        lengths = [s[4] for s in slots]
        n_layouts = math.prod(lengths)
        self._door_pairs: torch.Tensor | None = None
        self._pairs_np: np.ndarray | None = None
        if nd and n_layouts * nd * nd <= _MAX_DOOR_PAIRS:
            radix = np.cumprod([1, *lengths[:-1]])
            layouts = (np.arange(n_layouts)[:, None] // radix) % lengths  # [layouts, doors]
            a = np.arange(nd)
            pair = edges[a[:, None], a[None, :], layouts[:, :, None], layouts[:, None, :]]
            pair[:, a, a] = 0
            for k in range(nd):
                pair = np.minimum(pair, pair[:, :, k : k + 1] + pair[:, k : k + 1, :])
            self._pairs_np = pair  # [layout, door, door] (see _layout_tables)
            # by ((door, from door), layout): a column per environment is looked up flat
            pair = pair.transpose(2, 1, 0).reshape(nd * nd, n_layouts)
            self._door_pairs = tensor(pair.reshape(-1), torch.int32)
            self._pair_base = tensor(np.arange(nd * nd) * n_layouts)
            self._layout_radix = tensor(radix)
        codes = np.full(cells, _WALL_CODE, dtype=np.uint8)
        codes[cell_pos] = _EMPTY_CODE
        self._code_template = tensor(codes, torch.uint8)
        # each free cell's index (RoomLayout.free_cell's order: interior cells, then doors)
        free_index = np.zeros(cells, dtype=np.int64)
        free_index[cell_pos] = np.arange(n_cells)
        free_index[slot_of >= 0] = n_cells + slot_of[slot_of >= 0]
        self._free_index = tensor(free_index)
        self._free_template = self._code_template == _EMPTY_CODE  # the rooms' cells

    def _views(self) -> None:
        """The view's tables: cell offsets, occlusion, and image rows."""
        tensor = self._tensor
        n, side = self.agent_view_size, self._side
        # view cell (i, j) is bit side * i + j from the view's first in its oriented copy
        # (see _places): a view row of up to 7 cells is read from one int64 word
        self._width = 8 if n <= 7 else n
        self._row_step = tensor(side * np.arange(n))[:, None]
        self._cell_step = tensor(side * np.arange(n)[:, None] + np.arange(n))[:, :, None]
        self._bit_shift = tensor(list(range(n)))[:, None]
        self._byte_shift = tensor([8 * j for j in range(n)])[:, None]
        # process_vis_row as tables, by (incoming mask << n) | see-behind: the next row's
        # incoming mask (shifted by n, to index with), and the row's visible cells
        self._vis_start = (1 << (n // 2)) << n
        self._vis_next: torch.Tensor | None = None
        if n <= _MAX_TABLE_VIEW:
            index = np.arange(1 << (2 * n), dtype=np.int64)
            mask, below = process_vis_row(index >> n, index & ((1 << n) - 1), n)
            self._vis_next = tensor(below << n)
            self._vis_mask = tensor(mask)
            self._vis_first = tensor(self._vis_start + np.arange(1 << n))  # the agent's row
        # a cell's encoding by its class (unseen, empty, wall, goal)
        encodings = np.asarray([(0, 0, 0), EMPTY_ENCODING, WALL_ENCODING, GOAL_ENCODING])
        self._encodings = tensor(encodings, torch.uint8)
        if self._width != 8:
            return
        # For views of rows of up to 7 cells: bit rows transposed (bit j of row k to bit
        # 8 j + k: summed over k, byte j holds bit k of each row; the visible cells' shifted
        # by n more, for the keys); and the
        # encodings of a view row by its see-behind bits, visible cells (n bits each), the
        # goal's column + 1 (3 bits) and whether it is the agent's (its own cell shown empty)
        rows = np.arange(1 << n)
        spread = (((rows[:, None] >> np.arange(n)) & 1) << (8 * np.arange(n))).sum(1)
        self._spread_see = tensor(spread[:, None] << np.arange(n))  # [row, k]
        self._spread_shown = tensor((spread[None, :] << np.arange(n)[:, None]) << n)  # [k, row]
        self._row_step_b = self._row_step.view(-1)
        self._byte_shift_b = self._byte_shift.view(-1)
        self._row_mask = (1 << n) - 1
        self._row_images = tensor(_row_images(n), torch.uint8)

    def _view_table(self) -> None:
        """Views of rows of up to 7 cells tabled by place and the doors open in view.

        A view's cells are walls or not by the template, but for the door slots' cells in
        view: of each slot, the open one (its door) or none. ``_view_keys[c]``: the view rows'
        keys (see-behind and visible bits, see :meth:`_views`) of view ``c``; a place's views
        are numbered in mixed radix over the slots with cells in view, the door's state (0:
        not in view, k: the k-th of the slot's cells in view) a digit, so that ``_view_at[
        place's _DOORS_AT + slot * longest + door offset]`` summed over the slots is the view's
        number. None where the views would be more than ``_MAX_VIEWS`` (see _tabled_views).
        """
        self._view_keys: torch.Tensor | None = None
        if self._width != 8:
            return
        config = self.config
        tables = _tabled_views(config["size"], config["rooms_per_side"], self.agent_view_size)
        if tables is None:
            return
        keys, at = tables
        self._view_keys = self._tensor(keys, torch.int32)
        self._view_at = self._tensor(at, torch.int32)
        self._door_rows = self._tensor(np.arange(max(self._n_doors, 1)) * self._longest)[:, None]

    def _places(self, pos_key: np.ndarray) -> None:
        """The agent's places (direction * cells + position) and the grids' oriented copies.

        A layout's (or an environment's) grids are four copies of its grid, a bit a cell, one
        per direction, each turned so that the view of an agent facing that direction is ``n``
        runs of ``n`` bits, a row ``side`` bits after the previous one: view cell ``(i, j)``
        (``j`` away from the agent, ``i`` across) at bit ``side * i + j`` from the view's
        first. ``_copies[p]``: where
        position ``p`` is in each copy. ``_pos_table`` has, by place, what a step and a view
        need of it (the columns ``_START`` ... ``_GOAL_KEY``).
        """
        tensor = self._tensor
        n, side, cells = self.agent_view_size, self._side, self._cells
        p = np.arange(cells)
        x, y = np.divmod(p, side)  # padded coordinates
        forward = [fx * side + fy for fx, fy in DIR_VEC]
        copies = np.zeros((cells, 4), dtype=np.int64)
        table = np.zeros((4, cells, 8), dtype=np.int64)
        for d, (fx, fy) in enumerate(DIR_VEC):
            rx, ry = -fy, fx  # across the view (i); a step j is a step back along (fx, fy)
            across = rx * x + ry * y + (side - 1 if rx + ry < 0 else 0)
            back = -(fx * x + fy * y) + (side - 1 if fx + fy > 0 else 0)
            copies[:, d] = d * cells + across * side + back
            first = copies[:, d] - side * (n // 2) - (n - 1)  # view cell (0, 0)
            table[d, :, _START] = np.maximum(first, 0)  # (< 0: never an agent's)
            table[d, :, _LEFT_PD] = (d - 1) % 4 * cells + p
            table[d, :, _RIGHT_PD] = (d + 1) % 4 * cells + p
            ahead = np.clip(p + forward[d], 0, cells - 1)
            table[d, :, _AHEAD_PD] = d * cells + ahead
            table[d, :, _AHEAD_POS] = ahead
            table[d, :, _LEFT_POS] = np.clip(p + forward[(d - 1) % 4], 0, cells - 1)
            table[d, :, _GOAL_KEY] = pos_key * 4 - d
            table[d, :, _DOORS_AT] = (d * cells + p) * max(self._n_doors, 1) * self._longest
        self._copies = tensor(copies)
        # by column: a gather of a place's column is contiguous along the environments
        self._pos_table = tensor(table.reshape(4 * cells, 8).T)
        template = np.zeros(4 * cells, dtype=np.uint8)
        template[copies] = (self._code_template.cpu().numpy() == _EMPTY_CODE)[:, None]
        self._code_copies = template  # the see-behind bits of the four copies, a byte each

    def _door_positions(self, door_v: np.ndarray) -> np.ndarray:
        """The positions of doors at these offsets (``[..., D]``, NumPy)."""
        slots = np.array(self._layout.door_slots, dtype=np.int64).reshape(-1, 5)
        x0, y0, ax, ay = slots[:, 0], slots[:, 1], slots[:, 2], slots[:, 3]
        pad, side = self._pad, self._side
        return (x0 + pad) * side + y0 + pad + (ax * side + ay) * door_v

    def _layout_tables(self, layout: RoomLayout) -> None:
        """Per door layout, what a reset reads (where the draw is one tabled integer).

        And, where that table is small enough, each stream position's episode (:meth:`_record`).

        ``_layout_table[:, L]``: the doors' first distance-row indices, a zero (the goal's
        addend), the doors' offsets; ``_free_pos[L * n_free + k]``: free cell ``k``'s
        position (RoomLayout.free_cell's order); ``_sorted_pos``: the same in position order;
        ``_door_dist[L * n_free + goal]``: the doors' distances to the goal.
        """
        nd, n_free = self._n_doors, self._n_free
        lengths = self._door_lengths
        n_layouts = math.prod(lengths)
        self._recorded = False
        self._tabled = (
            "episode" in self._streams.tabled
            and nd > 0
            and self._pairs_np is not None
            and self.min_start_distance <= 1
            and n_layouts * n_free <= _MAX_FREE_TABLE
        )
        if not self._tabled:
            return
        assert self._pairs_np is not None
        tensor, cells = self._tensor, self._cells
        radix = np.cumprod([1, *lengths[:-1]])
        door_v = (np.arange(n_layouts)[:, None] // radix) % lengths  # [layouts, doors]
        d = np.arange(nd)
        door_pos = self._door_positions(door_v)
        columns = (
            (self._n_free + d * self._longest) * cells + door_v * cells,  # door rows
            np.zeros((n_layouts, 1), dtype=np.int64),  # the goal row's addend
            door_v,
        )
        self._layout_table = tensor(np.concatenate(columns, 1).T, torch.int32)  # [column, L]
        key = (self.size, self.config["rooms_per_side"], self.agent_view_size)
        if key not in _LAYOUT_TABLES:  # (built once per configuration and process)
            interior = np.broadcast_to(self._cell_pos.cpu().numpy(), (n_layouts, self._n_cells))
            free = np.concatenate((interior, door_pos), 1)  # [layouts, n_free]
            # the doors' distances to the goal by (layout, goal): through the goal room's doors
            far = np.full((n_layouts, n_free, nd), 1 << 40, dtype=np.int64)
            for e in range(nd):
                to_e = self._goal_doors_np[:, e, :][:, door_v[:, e]].T  # [layouts, goals]
                far = np.minimum(far, to_e[:, :, None] + self._pairs_np[:, e, None, :])
            if len(_LAYOUT_TABLES) >= 4:
                _LAYOUT_TABLES.pop(next(iter(_LAYOUT_TABLES)))
            _LAYOUT_TABLES[key] = (free, np.sort(free, 1), far.reshape(-1, nd))
        free, sorted_free, far = _LAYOUT_TABLES[key]
        self._free_pos = tensor(free.reshape(-1), torch.int32)
        self._sorted_pos = tensor(sorted_free.reshape(-1), torch.int32)
        self._door_dist = tensor(far, torch.int32)  # [L * n_free + goal, door]
        self._pos_key32 = self._pos_key.int()
        # every stream position's episode, where that table is small enough
        streams, n_envs = self._streams, self.num_envs
        known = streams.row  # the first halves of each row
        width = 1 + _STATE_ROWS + 3 * nd + 3
        self._recorded = n_envs * (known + 1) * width <= _MAX_RECORDS
        if self._recorded:
            records = torch.zeros((n_envs * known + 1, width), dtype=torch.int32)
            records[-1, 0] = -1  # the last: no episode
            self._records = records.to(self.device)  # (a row each: one read per reset)
            self._record_at = torch.zeros_like(streams.tabled["episode"][3])
            self._record_base = torch.arange(n_envs, device=self.device) * known
            self._next_half = torch.arange(1, known + 1, device=self.device)
            streams.on_table = self._record
            self._record(torch.arange(n_envs, device=self.device))

    # ====================================================================== API
    def reset(self, seeds: Sequence[int | None]) -> TensorDict:
        """Start an episode in every environment, ``seeds[i]`` as ``PointNavEnv.reset(seed=)``."""
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        self._start(torch.arange(self.num_envs, device=self.device), list(seeds))
        self._started = True
        return self._first()

    def step(
        self, actions: torch.Tensor, next_seeds: Sequence[int | None] | None = None
    ) -> TensorDict:
        """Step every environment; ended episodes start the next one (see :class:`BatchedEnv`)."""
        if not self._started:
            raise RuntimeError("step() before reset()")
        a = torch.as_tensor(actions, device=self.device)
        if a.shape != self._batch:
            raise ValueError(f"expected actions of shape ({self.num_envs},), got {tuple(a.shape)}")
        a = a.long()
        if a.device.type != "cpu" and bool((a & ~3).any()):
            self._unknown_action(a)
        if next_seeds is not None and len(next_seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} next seeds, got {len(next_seeds)}")

        # the action's outcome (see _expert): place, distance, reward index
        try:  # (an action out of 0..3 reads past _next: on the CPU, gather raises)
            pd, new_dist, r = self._next.gather(0, a[None, :] + self._next_rows)
        except RuntimeError:
            self._unknown_action(a)
            raise
        state = self._state.unbind(0)
        steps = state[_STEPS] + 1
        moved = state[_MOVED] + (new_dist != state[_DIST])
        stop = a == Actions.STOP
        success = r == 3
        truncated = (steps >= self.max_steps) > stop  # and not stopped
        rewards = self._rewards.index_select(0, r)
        start_dist = state[_START_DIST]
        if self._spl is not None:
            spl = self._spl.index_select(0, state[_SPL_ROW] + moved)
            spl = torch.where(success, spl, self._zero32)
        else:
            length = start_dist.double()
            spl = torch.where(success, length / torch.maximum(moved.double(), length), self._zero)
            spl = torch.where(success & (start_dist == 0), self._one, spl).float()
        metrics = {
            "success": success.float(),
            "spl": spl,
            "final_distance": new_dist.float(),
            "shortest_path_length": start_dist.float(),
        }
        rows = (pd, state[_GOAL], state[_GOAL_TERM], start_dist, state[_SPL_ROW], state[_CODES])
        self._state = torch.stack((*rows, new_dist, steps, moved))

        final = None
        ended = (stop | truncated).nonzero().squeeze(1)
        if ended.numel():
            cut = truncated.nonzero().squeeze(1)
            if cut.numel():
                n = self.agent_view_size
                image_shape = (self.num_envs, n, n, 3)
                final = {
                    "image": torch.zeros(image_shape, dtype=torch.uint8, device=self.device),
                    "goal": torch.zeros(
                        (self.num_envs, 3), dtype=torch.float32, device=self.device
                    ),
                }
                places = self._places_of(pd.index_select(0, cut))
                state = self._state.index_select(1, cut).unbind(0)
                nd = self._n_doors
                doors = self._episode[2 * nd + 2 : 3 * nd + 2].index_select(1, cut)
                final["image"][cut], final["goal"][cut] = self._observe(state, places, doors)
            seeds = None
            if next_seeds is not None:
                seeds = [next_seeds[i] for i in ended.tolist()]
            self._start(ended, seeds)
        image, goal, expert = self._look()
        out = {
            "obs": self._td({"image": image, "goal": goal}),
            EXPERT_ACTIONS: expert,
            "rewards": rewards,
            "terminated": stop,
            "truncated": truncated,
        }
        if final is not None:
            out["final_obs"] = self._td(final)
        out[EPISODE_KEY] = self._td(metrics)
        return self._td(out)

    @staticmethod
    def _unknown_action(a: torch.Tensor) -> None:
        bad = a[(a & ~3) != 0]
        if bad.numel():
            raise ValueError(f"unknown action {bad[0].item()!r}; expected 0..{len(Actions) - 1}")

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight and every environment's random stream, exactly."""
        if not self._started:
            raise RuntimeError("state_dict() before reset()")
        state = self._state
        place = state[_PD]
        ahead = self._places_of(place)[_AHEAD_POS : _AHEAD_POS + 1]
        rows = (
            place % self._cells,
            place // self._cells,
            state[_GOAL],
            state[_STEPS],
            state[_MOVED],
            state[_START_DIST],
            state[_DIST],
            self._distances(self._episode, ahead)[0].long(),
        )
        return {
            "num_envs": self.num_envs,
            "config": dict(self.config),
            "state": torch.stack(rows).cpu(),
            "episode": self._saved_episode().cpu(),
            "streams": self._streams.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore :meth:`state_dict`'s episodes; return what :meth:`reset` returns.

        Raises:
            ValueError: The state is of another number of environments or configuration, or
                of another kind, size or range, or inconsistent (it may come from a file).
        """
        saved, episode = self._checked_state(state)
        nd = self._n_doors
        door_v, goal_index = episode[2 * nd + 2 :].long().split((nd, 1))
        goal_index = goal_index[0]
        doors = self._doors(door_v)
        goal = self._free_cells(goal_index[None, :], doors)[0]
        if not torch.equal(goal, saved[2]):
            raise ValueError("inconsistent state: the goals are not the episodes' goals")
        self._streams.load_state_dict(state["streams"])
        everyone = torch.arange(self.num_envs, device=self.device)
        if not self._shared_codes:  # the template's, then the episodes' doors (first "closed")
            template = torch.from_numpy(self._code_copies).to(self.device)
            self._bits.view(self.num_envs, -1)[:, : 4 * self._cells] = template
            grids = self._codes[:-8].view(self.num_envs, -1)
            packed = np.packbits(self._code_copies, bitorder="little")
            grids[:, : len(packed)] = torch.from_numpy(packed).to(self.device)
        self._episode = torch.cat((episode[: 2 * nd + 2], door_v.int(), goal[None, :].int()))
        self._set_doors(everyone, door_v)
        layout = (door_v * self._layout_radix_all).sum(0)
        pos, direction, _, steps, moved, start_dist, dist, _ = saved
        codes = self._codes_of(everyone, layout)
        self._state = self._state_rows(direction * self._cells + pos, goal, start_dist, codes)
        self._state[_STEPS], self._state[_MOVED], self._state[_DIST] = steps, moved, dist
        self._started = True
        return self._first()

    def _checked_state(self, state: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """A saved state's rows and episodes, on the device, once every value is checked.

        The episodes' rows must be what their doors and goals make, the goals the episodes'
        goals, and the distances those at the agents' cells (a crafted value would index
        past a table: an error on the CPU, a device-side assert on a GPU).
        """
        keys = {"num_envs", "config", "state", "episode", "streams"}
        if not isinstance(state, Mapping) or set(state) != keys:
            raise ValueError(f"a BatchedPointNav state is a dict of {sorted(keys)}")
        saved_envs = state["num_envs"]
        if saved_envs != self.num_envs or isinstance(saved_envs, bool):
            raise ValueError(f"state of {saved_envs!r:.20} environments, this has {self.num_envs}")
        config = state["config"]
        if not isinstance(config, Mapping) or not (
            dict(config) == self.config
            and all(type(config[k]) is type(v) for k, v in self.config.items())
        ):
            raise ValueError(
                f"state of a PointNav configured {state['config']!r:.400}, this is {self.config}"
            )
        n, nd = self.num_envs, self._n_doors
        rows = saved_tensor(state, "state", (_SAVED_ROWS, n), torch.int64)
        episode = saved_tensor(state, "episode", (3 * nd + 3, n), torch.int32)
        layout = episode[2 * nd + 2 :]  # the doors' offsets, then the goal's free-cell index
        highs = torch.tensor([*self._door_lengths, self._n_free])[:, None]
        if bool(((layout < 0) | (layout >= highs)).any()):
            raise ValueError("batched environment state 'episode': a door or goal out of range")
        pos, direction, _, steps, moved, start_dist, _, _ = rows
        for name, values, high in (
            ("position", pos, self._cells),
            ("direction", direction, 4),
            ("steps", steps, self.max_steps),
            ("start distance", start_dist, self._n_free),
        ):
            if bool(((values < 0) | (values >= high)).any()):
                raise ValueError(f"batched environment state: {name} out of [0, {high})")
        if bool(((moved < 0) | (moved > steps)).any()):
            raise ValueError("batched environment state: moved out of [0, steps]")
        saved, episode = rows.to(self.device), episode.to(self.device)
        door_v, goal_index = episode[2 * nd + 2 :].long().split((nd, 1))
        # (a split of one room is by its episodes' starts, which are not saved)
        if self.split is not None and nd and not bool(self._in_split(door_v.t()).all()):
            raise ValueError(f"inconsistent state: a door layout not in split {self.split!r}")
        if not torch.equal(self._episode_rows(goal_index[0], door_v), episode):
            raise ValueError("inconsistent state: the episodes are not their layouts'")
        place = saved[1] * self._cells + saved[0]
        ahead = self._places_of(place)[_AHEAD_POS : _AHEAD_POS + 1]
        cells = torch.stack((saved[0], ahead[0]))
        distances = self._distances(episode, cells).long()
        if bool((distances[0] < 0).any()) or not torch.equal(distances, saved[6:8]):
            raise ValueError("inconsistent state: the distances are not the agents' cells'")
        return saved, episode

    def _saved_episode(self) -> torch.Tensor:
        """``_episode`` as :meth:`state_dict` saves it (:meth:`_episode_rows`' rows)."""
        door_v, goal_index = self._layout_of(self._episode)
        rows = (self._episode[: 2 * self._n_doors + 2], door_v.int(), goal_index[None, :].int())
        return torch.cat(rows)

    def render(self, index: int = 0) -> Any:
        """An RGB frame of environment ``index`` (a PointNavEnv placed in its episode)."""
        if self.render_mode is None or not self._started:
            return None
        if self._twin is None:
            self._twin = PointNavEnv(**self.config, render_mode=self.render_mode)
        twin = self._twin
        size, pad, side = self.size, self._pad, self._side
        episode = self._episode[:, index : index + 1]
        door_v, _ = self._layout_of(episode)
        door_x = (self._slot_x0 + self._slot_ax * door_v[:, 0]).tolist()
        door_y = (self._slot_y0 + self._slot_ay * door_v[:, 0]).tolist()
        place, goal, steps = self._state[[_PD, _GOAL, _STEPS], index].tolist()
        pos, d = place % self._cells, place // self._cells
        field = self._fields(episode)[:, 0].view(side, side)
        dist = field[pad : pad + size, pad : pad + size].cpu().numpy().astype(np.int64)

        def xy(position: int) -> tuple[int, int]:
            return position // side - pad, position % side - pad

        twin.place(door_x, door_y, xy(goal), dist, xy(pos), d)
        twin.step_count = steps
        return twin.render()

    def close(self) -> None:
        """Release the rendering twin (idempotent)."""
        if self._twin is not None:
            self._twin.close()
            self._twin = None

    # ============================================================== internals
    def _td(self, entries: dict[Any, Any]) -> TensorDict:
        return TensorDict._new_unsafe(entries, batch_size=self._batch, device=self.device)

    def _first(self) -> TensorDict:
        """Observations and expert actions of the current state (what a reset returns)."""
        image, goal, expert = self._look()
        return self._td({"obs": self._td({"image": image, "goal": goal}), EXPERT_ACTIONS: expert})

    def _look(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every environment's ``image``, ``goal`` and expert action (and actions' outcomes)."""
        state = self._state.unbind(0)
        places = self._places_of(state[_PD])
        nd = self._n_doors
        image, goal = self._observe(state, places, self._episode[2 * nd + 2 : 3 * nd + 2])
        return image, goal, self._expert(state, places)

    def _places_of(self, place: torch.Tensor) -> torch.Tensor:
        """``_pos_table``'s columns of these places ``[B]``: ``[columns, B]``."""
        return self._pos_table.gather(1, place.expand(self._pos_table.shape[0], -1))

    def _observe(
        self, state: Sequence[torch.Tensor], places: torch.Tensor, doors: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``image`` and ``goal`` of environments in these ``_state`` rows (doors' offsets).

        ``places``: their columns of ``_pos_table`` (``[columns, B]``). A view row's see-behind
        bits are read from one int64 word (bit ``j``: cell ``(i, j)``, see :meth:`_places`);
        spread to bytes (a table) and summed, process_vis's row ``j`` is byte ``j``;
        process_vis's row tables give the visible cells, spread back the same way; a row's
        see-behind and visible bits and the goal's column index the table of its encodings.
        """
        n = self.agent_view_size
        count = places.shape[1]
        start, goal_key = places[_START], places[_GOAL_KEY]
        first = state[_CODES] + start
        goal_at = state[_GOAL_TERM] - goal_key  # (goal - agent, direction)
        if self._view_keys is not None:  # tabled views (by environment, then view row)
            nd = self._n_doors
            doors = doors if nd else torch.zeros_like(goal_at)[None, :]
            at = places[_DOORS_AT] + self._door_rows + doors  # [slot, B]
            view = self._view_at.index_select(0, at.view(-1)).view(-1, count).sum(0)
            keys = self._view_keys.index_select(0, view) | self._goal_words.index_select(
                0, goal_at
            )
            image = self._row_images.index_select(0, keys.view(-1)).view(count, n, n, 3)
        elif self._width == 8:  # (by environment, then view row: the image's order)
            where = first[:, None] + self._row_step_b  # [B, i]: view row i's first bit
            words = self._windows.index_select(0, (where >> 3).view(-1)).view(torch.int64)
            see = (words.view(count, n) >> (where & 7)) & self._row_mask  # [B, i]: bit j
            packed = self._spread_see.gather(0, see).sum(1)  # byte j, bit i: (i, j) see-behind
            visible = self._visible_rows((packed >> self._byte_shift) & 0xFF)  # [j, B]: bit i
            shown = self._spread_shown.gather(1, visible).sum(0)[:, None]  # byte i, bit n + j
            goal = self._goal_words.index_select(0, goal_at)
            keys = see | goal | ((shown >> self._byte_shift_b) & (self._row_mask << n))
            image = self._row_images.index_select(0, keys.view(-1)).view(count, n, n, 3)
        else:  # views of more than 7 cells: the same, cell by cell
            goal = self._goal_words.gather(1, goal_at.expand(self._goal_words.shape[0], -1))
            where = first + self._cell_step
            cells = self._codes.index_select(0, (where >> 3).view(-1)).view(n, n, count)
            see = (cells >> (where & 7)) & 1  # [i, j, B]
            visible = self._visible_rows((see << self._bit_shift[:, :, None]).sum(0))
            shown = (visible >> self._bit_shift[:, :, None]) & 1  # [i, j, B]
            classes = ((2 - see) | goal.view(n, n, -1)) * shown  # (a goal on an empty cell)
            classes[n // 2, n - 1] = 1  # the agent's cell: empty, not goal
            keys = classes.permute(2, 0, 1).reshape(-1)
            image = self._encodings.index_select(0, keys).view(count, n, n, 3)
        return image, self._goal_table.index_select(0, goal_at)

    def _visible_rows(self, see_rows: torch.Tensor) -> torch.Tensor:
        """process_vis row by row (``see_rows[j]``: row ``j``'s see-behind bits); ``[j, B]``."""
        n = self.agent_view_size
        if self._vis_next is not None:
            see = see_rows.unbind(0)
            index = [see[0]] * n
            index[n - 1] = self._vis_first.index_select(0, see[n - 1])
            for j in range(n - 2, -1, -1):
                index[j] = self._vis_next.index_select(0, index[j + 1]) | see[j]
            return self._vis_mask.index_select(0, torch.cat(index)).view(n, -1)
        rows: list[torch.Tensor] = [see_rows[0]] * n
        incoming = torch.full_like(see_rows[0], 1 << (n // 2), dtype=torch.int64)
        for j in range(n - 1, -1, -1):
            rows[j], incoming = process_vis_row(incoming, see_rows[j].long(), n)
        return torch.stack(rows)

    def _expert(self, state: Sequence[torch.Tensor], places: torch.Tensor) -> torch.Tensor:
        """PointNavEnv.expert_action of every environment; sets each action's outcome.

        ``_next[a + 4 k]``: after action ``a``, the place (k = 0), the distance (1) and the
        reward's index in ``_rewards`` (2; 3: a success), for :meth:`step` to read at once.
        """
        place, dist = state[_PD], state[_DIST]
        near = self._distances(self._episode, places[_AHEAD_POS : _LEFT_POS + 1])  # [2, B]
        ahead = near[0]
        free = ahead >= 0
        forward_dist = torch.where(free, ahead, dist)
        at_goal = dist == 0
        one = self._ones
        torch.stack(
            (
                places[_LEFT_PD],
                places[_RIGHT_PD],
                torch.where(free, places[_AHEAD_PD], place),
                place,
                dist,
                dist,
                forward_dist,
                dist,
                one,
                one,
                dist - forward_dist + 1,
                torch.where(at_goal, 3, 1),
            ),
            out=self._next,  # (read by the next step only)
        )
        hit = near == dist - 1  # (ahead, left)
        act = self._action
        turn = torch.where(hit[1], act[Actions.LEFT], act[Actions.RIGHT])
        turn = torch.where(hit[0], act[Actions.FORWARD], turn)
        return torch.where(at_goal, act[Actions.STOP], turn)

    def _distances(self, episode: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """Distances to the goal (int32; -1 on walls) of ``cells`` ``[k, B]`` in these episodes.

        The minimum over the episodes' distance rows of the row at the cell plus its addend.
        """
        rows = self._n_doors + 1
        where = episode[None, :rows] + cells[:, None, :]  # [k, rows, B]
        via = self._distance_rows.index_select(0, where.reshape(-1)).view(where.shape)
        return (via + episode[None, rows : 2 * rows]).amin(1).clamp_min_(-1)

    def _fields(self, episode: torch.Tensor) -> torch.Tensor:
        """Whole distance fields ``[side * side, B]`` of these episodes (padding: -1)."""
        cells = torch.arange(self._cells, device=self.device)[:, None]
        return self._distances(episode, cells.expand(-1, episode.shape[1]))

    # ------------------------------------------------------------------ resets
    def _in_split(self, door_v: torch.Tensor) -> torch.Tensor:
        """Whether layouts of these door offsets (``[..., doors]``) are in the split."""
        return _doors_in_split(door_v, self._door_lengths, self._bucket_ok)

    def _packed_in_split(self, chunk: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """For a single packed draw: whether a drawn value's layout is in the split."""
        if self.split is None:
            return None
        table = self._split_table
        if table is not None:
            modulus = self._split_modulus
            if modulus & (modulus - 1) == 0:
                return lambda value: _at(table, value & (modulus - 1))
            return lambda value: _at(table, value % modulus)
        div, radix = self._decode[chunk]
        nd = self._n_doors
        return lambda value: self._in_split((value[..., None] // div[:nd]) % radix[:nd])

    def _draw_values(self, envs: torch.Tensor) -> torch.Tensor:
        """Each environment's episode draw (RoomLayout.draw, in its split): ``[values, B]``."""
        if self._split_empty:
            raise ValueError(
                f"split {self.split!r}: no episode of it in {MAX_SPLIT_DRAWS} draws; the task "
                f"has too few layouts to split ({self.size}x{self.size}, "
                f"{self.config['rooms_per_side']} rooms per side)"
            )
        streams = self._streams
        if len(self._chunks) == 1:
            bound, _ = self._chunks[0]
            if "episode" in streams.tabled:
                packed = streams.draw_tabled("episode", envs)
            else:
                packed = streams.draw(envs, bound, self._packed_in_split(0))
            div, radix = self._decode[0]
            return (packed[None, :] // div[:, None]) % radix[:, None]
        # several packed integers per draw: whole draws until one's layout is in the split
        out = torch.zeros((self._n_values, envs.numel()), dtype=torch.int64, device=self.device)
        todo = torch.arange(envs.numel(), device=self.device)
        for _ in range(MAX_SPLIT_DRAWS):
            e = envs[todo]
            parts = []
            for (bound, _), (div, radix) in zip(self._chunks, self._decode, strict=True):
                parts.append((streams.draw(e, bound)[None, :] // div[:, None]) % radix[:, None])
            values = torch.cat(parts)
            out[:, todo] = values
            if self.split is None:
                return out
            ok = self._in_split(values[: self._n_doors].t())
            if bool(ok.all()):
                return out
            todo = todo[~ok]
        raise ValueError(
            f"split {self.split!r}: no episode of it in {MAX_SPLIT_DRAWS} draws; the task has "
            f"too few layouts to split"
        )

    def _doors(self, door_v: torch.Tensor) -> torch.Tensor:
        """The doors' positions ``[D, B]``."""
        return self._slot_pos0[:, None] + self._slot_step[:, None] * door_v

    def _free_cells(self, index: torch.Tensor, doors: torch.Tensor) -> torch.Tensor:
        """Positions of free cells ``index`` ``[k, B]`` (RoomLayout.free_cell's order)."""
        inside = index.clamp(max=self._n_cells - 1).view(-1)
        interior = self._cell_pos.index_select(0, inside).view(index.shape)
        if not self._n_doors:
            return interior
        door = doors.gather(0, (index - self._n_cells).clamp(0, self._n_doors - 1))
        return torch.where(index < self._n_cells, interior, door)

    def _episode_rows(self, goal_index: torch.Tensor, door_v: torch.Tensor) -> torch.Tensor:
        """What distances are made of, in these episodes (int32 ``[3 D + 3, B]``; D doors).

        Rows: the first index of the goal's and the doors' distance rows (R = D + 1), their
        addends (0, then the doors' distances to the goal: R), the doors' offsets (D), the
        goal's free-cell index (:meth:`state_dict`'s ``episode``; ``_episode`` has the goal's
        position last).
        """
        nd, cells = self._n_doors, self._cells
        goal_index = goal_index[None, :]
        zero = torch.zeros_like(goal_index)
        if not nd:
            return torch.cat((goal_index * cells, zero, goal_index)).int()
        # the goal room's doors' distances (far for the others), then along the doors
        rows = goal_index * (nd * self._longest) + (self._door_offset[:, None] + door_v)
        door_dist = self._goal_doors.index_select(0, rows.view(-1)).view(rows.shape)
        if self._door_pairs is not None:
            layout = (door_v * self._layout_radix[:, None]).sum(0)
            pairs = self._pair_base[:, None] + layout[None, :]
            pairs = self._door_pairs.index_select(0, pairs.view(-1)).view(nd, nd, -1)
            door_dist = (door_dist[None, :, :] + pairs).amin(1)
        else:
            edges = self._edge_base + door_v[:, None, :] * self._longest + door_v[None, :, :]
            weights = self._door_edges.index_select(0, edges.view(-1)).view(edges.shape)
            for _ in range(nd - 1):  # Bellman-Ford: shortest paths have at most nd - 1 edges
                door_dist = torch.minimum(door_dist, (door_dist[:, None, :] + weights).amin(0))
        bases = (goal_index * cells, self._door_row0[:, None] + door_v * cells)
        return torch.cat((*bases, zero, door_dist, door_v, goal_index)).int()

    def _layout_of(self, episode: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The doors' offsets ``[D, B]`` and goals' free-cell indices ``[B]`` of ``_episode``."""
        nd = self._n_doors
        door_v, goal = episode[2 * nd + 2 :].long().split((nd, 1))
        return door_v, self._free_index.index_select(0, goal[0])

    def _set_doors(self, envs: torch.Tensor, door_v: torch.Tensor) -> None:
        """The grids of ``envs``' new doors (offsets ``[D, B]``) where each has its own grids.

        Their previous doors closed (walls), the new ones open (empty), in every copy: in
        ``_bits`` (a byte a bit), then the bytes of ``_codes`` they are in packed again.
        """
        if self._shared_codes or not self._n_doors:
            return
        nd = self._n_doors
        door_v = torch.cat((self._episode[2 * nd + 2 : 3 * nd + 2].index_select(1, envs), door_v))
        cells = self._slot_pos0[:, None] + self._slot_step[:, None] * door_v.view(2, nd, -1)
        copies = self._copies.index_select(0, cells.view(-1)).view(*cells.shape, 4)
        where = self._env_base.index_select(0, envs)[None, None, :, None] + copies
        self._bits.index_fill_(0, where[0].reshape(-1), 0)  # the previous doors
        self._bits.index_fill_(0, where[1].reshape(-1), 1)
        touched = (where >> 3).view(-1)
        bits = self._bits.index_select(0, ((touched << 3)[:, None] + self._byte_bit).view(-1))
        packed = (bits.view(-1, 8) * self._byte_bits).sum(1, dtype=torch.uint8)
        self._codes.index_copy_(0, touched, packed)

    def _state_rows(
        self,
        place: torch.Tensor,
        goal: torch.Tensor,
        start_dist: torch.Tensor,
        codes: torch.Tensor,
    ) -> torch.Tensor:
        """``_state``'s rows of new episodes (int64 ``[_STATE_ROWS, B]``)."""
        goal_term = (self._pos_key.index_select(0, goal) + self._goal_center) * 4
        zeros = torch.zeros_like(place)
        spl_row = start_dist * (self.max_steps + 1)
        rows = (place, goal, goal_term, start_dist, spl_row, codes, start_dist, zeros, zeros)
        return torch.stack(rows)

    def _codes_of(self, envs: torch.Tensor, layout: torch.Tensor) -> torch.Tensor:
        """The first bit of the view grids of ``envs`` in these door layouts (``[B]``)."""
        if self._shared_codes:
            return layout * self._block
        return self._env_base.index_select(0, envs)

    def _start(self, envs: torch.Tensor, seeds: list[int | None] | None) -> None:
        """New episodes in ``envs`` (distinct): PointNavEnv.reset(seed=...) of each."""
        streams = self._streams
        if seeds is not None:
            fresh = [
                (i, s)
                for i, s in zip(envs.tolist(), seeds, strict=True)
                if s is not None or streams.bitgens[i] is None
            ]
        elif not self._started:
            fresh = [(i, None) for i in envs.tolist() if streams.bitgens[i] is None]
        else:
            fresh = []
        if fresh:
            streams.seed([i for i, _ in fresh], [s for _, s in fresh])
        if self._recorded and self._recorded_episodes(envs):
            return
        if self._tabled:
            state, episode = self._tabled_episodes(envs)
        else:
            state, episode = self._drawn_episodes(envs)
        self._begin(envs, state, episode)

    def _begin(self, envs: torch.Tensor, state: torch.Tensor, episode: torch.Tensor) -> None:
        """Start these episodes: ``_state`` rows (int64) and ``_episode`` rows (int32)."""
        if not self._shared_codes:
            self._set_doors(envs, episode[2 * self._n_doors + 2 : 3 * self._n_doors + 2])
        self._state.index_copy_(1, envs, state)
        self._episode.index_copy_(1, envs, episode)

    def _recorded_episodes(self, envs: torch.Tensor) -> bool:
        """Start ``envs``' episodes from the tables of :meth:`_record` (False: not all there).

        An environment whose next draw has no record (past the tabled halves, or a start's
        redraw past its row) has its row refilled, with every row read past 3/8 of it.
        """
        streams = self._streams
        for attempt in range(2):
            at = streams.row_base.index_select(0, envs) + streams.pos.index_select(0, envs)
            at = self._record_at.view(-1).index_select(0, at)
            record = self._records.index_select(0, at).t()  # [columns, B]
            head = record[: 1 + _STATE_ROWS].long()  # the next position, the state's rows
            missing = head[0] < 0
            if not bool(missing.any()):
                streams.pos.index_copy_(0, envs, head[0])
                self._begin(envs, head[1:], record[1 + _STATE_ROWS :])
                return True
            if not attempt:
                streams.refill_low(envs[missing], streams.row * 3 // 4)
        return False

    def _record(self, envs: torch.Tensor) -> None:
        """Table the episode a draw ending at each of the first halves of rows ``envs`` starts.

        ``_records`` holds, by row and half where a draw ends, the stream position after the
        episode's draws (-1: a start's redraw past the row), ``_state``'s and ``_episode``'s
        rows; its last row has none. ``_record_at`` has, by row and position, the record of
        the next draw (the last where that draw ends past the tabled halves).
        """
        streams = self._streams
        known, halves = streams.row, 2 * streams.row
        _, _, values, ends = streams.tabled["episode"]
        ends = ends.index_select(0, envs)
        # the halves where a draw ends (accepted), as row * known + half
        at = (ends[:, :known] == self._next_half - 1).view(-1).nonzero().squeeze(1)
        half, owners = at % known, envs.index_select(0, at // known)
        draws = self._unpack(values.index_select(0, envs)[:, :known].reshape(-1)[at])
        after = half + 1
        redrawn = None
        if self.min_start_distance == 1:  # the start's draw, from the next half on
            todo = (draws[3] == draws[1]).nonzero().squeeze(1)
            if todo.numel():
                read = half[todo, None] + 1 + streams.window_index  # [redraws, window]
                held = streams.halves[owners[todo, None], read.clamp(max=halves - 1)]
                value, ok = streams.lemire(held, self._n_free - 1)
                found, first = (ok & (read < halves)).max(1)
                k = value.gather(1, first[:, None])[:, 0]
                after[todo] = torch.where(found, read.gather(1, first[:, None])[:, 0] + 1, -1)
                redrawn = todo, k
        table = torch.stack((after.int(), *self._new_episodes(owners, *draws, redrawn)))
        self._records.index_copy_(0, owners * known + half, table.t().contiguous())
        rows = self._record_base.index_select(0, envs)[:, None] + ends
        self._record_at[envs] = torch.where(ends < known, rows, self._records.shape[0] - 1)

    def _unpack(
        self, packed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A tabled draw's door layout, goal index, direction and start index."""
        n_layouts, n_free = math.prod(self._door_lengths), self._n_free
        if n_layouts & (n_layouts - 1):
            layout, rest = packed % n_layouts, packed // n_layouts
        else:
            layout, rest = packed & (n_layouts - 1), packed >> (n_layouts.bit_length() - 1)
        # rest // n_free in double precision (exact: rest < 2**53), faster than int64 division
        quotient = torch.floor(rest.double() / n_free).long()
        goal_index = rest - quotient * n_free
        values = torch.stack((layout, goal_index, quotient & 3, quotient >> 2)).int()
        return values[0], values[1], values[2], values[3]

    def _tabled_episodes(self, envs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_state`` and ``_episode`` rows of ``envs``' new episodes, drawn (one tabled draw).

        A start drawn on the goal (``min_start_distance=1``) is redrawn (as _start_off_goal).
        """
        streams = self._streams
        if self._split_empty:
            self._draw_values(envs)  # raises
        draws = self._unpack(streams.draw_tabled("episode", envs))
        redrawn = None
        if self.min_start_distance == 1:
            todo = (draws[3] == draws[1]).nonzero().squeeze(1)
            if todo.numel():
                redrawn = todo, streams.draw32(envs[todo], self._n_free - 1)
        block = torch.stack(self._new_episodes(envs, *draws, redrawn))
        return block[:_STATE_ROWS].long(), block[_STATE_ROWS:]

    def _new_episodes(
        self,
        envs: torch.Tensor,
        layout: torch.Tensor,
        goal_index: torch.Tensor,
        direction: torch.Tensor,
        start_index: torch.Tensor,
        redrawn: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> list[torch.Tensor]:
        """``_state``'s and ``_episode``'s rows of episodes of these draws (int32 ``[B]``).

        From per-layout tables. ``envs``: the environment of each; ``redrawn``: where the start
        drawn is the goal, and ``k``: the start is the ``k``-th of the other free cells in
        position order (as _start_off_goal).
        """
        nd, n_free, cells = self._n_doors, self._n_free, self._cells
        table = self._layout_table
        columns = table.gather(1, layout.expand(table.shape[0], -1))  # [column, B]
        row = layout * n_free
        index = torch.stack((row + goal_index, row + start_index))
        goal, start = self._free_pos.index_select(0, index.view(-1)).view(2, -1)
        if redrawn is not None:
            todo, k = redrawn
            at = row.index_select(0, todo) + k
            sorted_pos = self._sorted_pos
            at = at + (sorted_pos.index_select(0, at) >= goal.index_select(0, todo))
            start = start.index_put((todo,), sorted_pos.index_select(0, at))
        door_dist = self._door_dist.index_select(0, index[0]).t()
        # the goal's and the doors' distance rows, their addends (0, the doors' distances)
        rows = torch.cat(((goal_index * cells)[None, :], columns[: nd + 1], door_dist))
        start_dist = self._distances(rows, start[None, :])[0]
        goal_term = (self._pos_key32.index_select(0, goal) + self._goal_center) * 4
        codes = self._codes_of(envs, layout).int()
        zero = torch.zeros_like(codes)
        state = [
            direction * cells + start,
            goal,
            goal_term,
            start_dist,
            start_dist * (self.max_steps + 1),
            codes,
            start_dist,
            zero,
            zero,
        ]
        return [*state, *rows.unbind(0), *columns[nd + 1 :].unbind(0), goal]

    def _drawn_episodes(self, envs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_tabled_episodes` for any layout: draws decoded, distances computed."""
        nd = self._n_doors
        values = self._draw_values(envs)  # [values, B]
        door_v, goal_index, direction = values[:nd], values[nd], values[nd + 1]
        doors = self._doors(door_v)
        goal_start = self._free_cells(values[nd : nd + 3 : 2], doors)  # [2, B]
        rows = self._episode_rows(goal_index, door_v)
        if self.min_start_distance > 0:
            start_dist = self._distances(rows, goal_start[1:])[0]
            near = start_dist < self.min_start_distance
            if bool(near.any()):
                todo = near.nonzero().squeeze(1)
                if self.min_start_distance == 1:  # the start drawn on the goal
                    self._start_off_goal(envs, todo, goal_start, doors)
                else:
                    self._other_starts(envs, todo, goal_index, goal_start, door_v)
                    rows[:, todo] = self._episode_rows(goal_index[todo], door_v[:, todo])
        episode = torch.cat((rows[: 2 * nd + 2], door_v.int(), goal_start[:1].int()))
        goal, start = goal_start
        start_dist = self._distances(episode, start[None, :])[0].long()
        codes = self._codes_of(envs, (door_v * self._layout_radix_all).sum(0))
        state = self._state_rows(direction * self._cells + start, goal, start_dist, codes)
        return state, episode

    def _start_off_goal(
        self,
        envs: torch.Tensor,
        todo: torch.Tensor,
        goal_start: torch.Tensor,
        doors: torch.Tensor,
    ) -> None:
        """:meth:`_other_starts` for ``min_start_distance=1``: the goal stays.

        The cells far enough are the free cells but the goal: ``n_free - 1`` of them.
        """
        k = self._streams.draw32(envs[todo], self._n_free - 1)
        free = self._free_template.expand(todo.numel(), -1).clone()
        if self._n_doors:
            free.scatter_(1, doors[:, todo].t(), True)
        free.scatter_(1, goal_start[0, todo][:, None], False)
        ranks = free.cumsum(1)  # in x-major order, as flatnonzero
        goal_start[1, todo] = torch.searchsorted(ranks, (k + 1)[:, None])[:, 0]

    def _other_starts(
        self,
        envs: torch.Tensor,
        todo: torch.Tensor,
        goal_index: torch.Tensor,
        goal_start: torch.Tensor,
        door_v: torch.Tensor,
    ) -> None:
        """A start among the cells far enough, or a new goal (PointNavEnv._gen_grid's loop).

        For the positions ``todo`` of ``envs`` whose pre-drawn start is too close; updates
        ``goal_index`` and ``goal_start`` (goal and start positions) in place.
        """
        for attempt in range(1, 101):
            field = self._fields(self._episode_rows(goal_index[todo], door_v[:, todo])).t()
            candidates = field >= self.min_start_distance  # in x-major order, as flatnonzero
            count = candidates.sum(1)
            some = count > 0
            if bool(some.any()):
                k = self._streams.draw32(envs[todo[some]], count[some])
                ranks = candidates[some].cumsum(1)
                goal_start[1, todo[some]] = torch.searchsorted(ranks, (k + 1)[:, None])[:, 0]
            todo = todo[~some]
            if not todo.numel():
                return
            if attempt == 100:
                break
            goal_index[todo] = self._streams.draw32(envs[todo], self._n_free)
            doors = self._doors(door_v[:, todo])
            goal_start[0, todo] = self._free_cells(goal_index[None, todo], doors)[0]
        raise RuntimeError(
            f"no start cell at geodesic distance >= {self.min_start_distance} from the goal "
            f"after 100 goal draws; lower min_start_distance"
        )
