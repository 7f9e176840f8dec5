"""The grid PointNav (:mod:`rl.tasks.nav`) as a batched environment written in torch.

:class:`BatchedPointNav` steps ``num_envs`` PointNav environments at once on one device (CPU or
CUDA) and gives, for the same seeds, exactly what as many :class:`~rl.tasks.nav.PointNavEnv`
stepped one by one give: layouts, observations, rewards, flags, expert actions and episode
metrics, bit for bit, auto-resets included (an unseeded reset goes on with the environment's
own ``np_random``, as ``gymnasium``'s ``env.reset(seed=None)`` does).

Precomputed once per configuration, as tensors on the device: the room tables of
:class:`~rl.tasks.nav_layout.RoomLayout` (door slots, interior cells, per-cell door tables of the
distance field), the view's cell offsets per direction, minigrid's occlusion one view row at a
time as a lookup table (:func:`~rl.tasks.nav_view.process_vis_row` over every pair of incoming
row mask and see-behind row: 16,384 entries for a 7x7 view), the goal vector of every
(offset to the goal, direction), the six possible rewards, and, for a split, whether each door
layout belongs to it.

Per environment and episode: the geodesic distance field in a wall-padded grid (``-1`` off free
cells). It is the whole map: a cell is a wall, the goal (0) or empty, and its see-behind is
"not a wall", so views, moves, rewards and the expert all read it. Per step, over all
environments at once: the move (one gather), reward and flags, episode metrics, then the
observation (one gather of the view's cells, seven row lookups for the occlusion, one lookup of
the encodings) and the expert action (two gathers). No per-environment Python.

Resets: every environment whose episode ended in a step starts its next one in the same call,
all together. A PointNavEnv draws an episode with a few ``np_random.integers(bound)`` calls
(see ``PointNavEnv._gen_grid``); here each environment's PCG64 bit generator fills a row of raw
outputs ahead (refilled in Python when a row runs low, about once per hundred episodes), and
NumPy's bounded-integer arithmetic (Lemire's rejection on 32-bit halves of the outputs, the
other half kept for the next draw, or on whole outputs above ``2**32``) runs on those rows in
torch for all resetting environments at once: a window of the next outputs each, the first one
accepted (by the rejection and, for a split, by the layout's split). The distance fields of the
new episodes come from the room structure in a batch (a Bellman-Ford over the doors, then the
minimum over each cell's room doors), as :meth:`RoomLayout.distance_field` computes them one by
one. Only seeded resets (``reset``, evaluation's ``next_seeds``) build a bit generator in Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.utils import seeding
from tensordict import TensorDict

from rl.tasks.batched import EPISODE_KEY, BatchedEnv
from rl.tasks.fields import EXPERT_ACTIONS
from rl.tasks.nav import Actions, PointNavEnv
from rl.tasks.nav_checks import checked_args, observation_space
from rl.tasks.nav_layout import RoomLayout
from rl.tasks.nav_view import (
    DIR_VEC,
    EMPTY_ENCODING,
    GOAL_ENCODING,
    WALL_ENCODING,
    process_vis_row,
    view_indices,
)
from rl.tasks.splits import _BUCKETS, MAX_SPLIT_DRAWS, SPLITS
from rl.utils.config import Check

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
# Raw outputs kept ahead per environment (at least twice the look-ahead window).
_MIN_ROW = 128
# The low bit of every byte of an int64.
_LOW_BITS = 0x0101010101010101
# The columns of the per-environment state: the agent's position (x * size + y) and direction,
# the goal's position, steps taken, cells moved, the start's, the current distance and the
# distance of the cell ahead (-1: a wall).
_POS, _DIR, _GOAL, _STEPS, _MOVED, _START_DIST, _DIST, _AHEAD = range(8)
_STATE_COLUMNS = 8


# A cell's one-byte code: its class (the row of the encodings: 0 unseen, 1 empty, 2 wall,
# 3 goal) in the low bits, and in the top bit whether one sees behind it (not a wall).
_EMPTY_CODE, _WALL_CODE, _GOAL_CODE = 0x81, 0x02, 0x83


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
        self._ar = torch.arange(window, device=device)

    # ------------------------------------------------------------------ seeding
    def seed(self, envs: list[int], seeds: list[int | None]) -> None:
        """New generators, as ``gymnasium``'s ``reset(seed=...)`` makes them (None: OS entropy)."""
        rows = []
        for i, seed in zip(envs, seeds, strict=True):
            rng, _ = seeding.np_random(int(seed) if isinstance(seed, np.integer) else seed)
            bitgen = rng.bit_generator
            self.bitgens[i] = bitgen  # type: ignore[assignment]
            rows.append(bitgen.random_raw(self.row).view(np.int64))
        self._write(torch.tensor(envs, device=self.device), np.stack(rows))
        self.pos[torch.tensor(envs, device=self.device)] = 0
        self.skip[torch.tensor(envs, device=self.device)] = 0

    def _write(self, envs: torch.Tensor, rows: np.ndarray) -> None:
        """Set the rows of ``envs`` to these raw outputs (int64 ``[len(envs), row]``)."""
        self.raw[envs] = torch.from_numpy(rows).to(self.device)
        halves = rows.view(np.uint32).astype(np.int64)  # little-endian: low, high, ...
        self.halves[envs] = torch.from_numpy(halves).to(self.device)

    def _ensure(self, envs: torch.Tensor, ahead: int) -> None:
        """Refill the rows of ``envs`` with fewer than ``ahead`` unread outputs."""
        first = self.pos[envs] >> 1  # the waiting half's output, or the next one
        if self.used_skip:
            low = first + self.skip[envs] > self.row - ahead - 1
        else:
            low = first > self.row - ahead - 1
        if not bool(low.any()):
            return
        ids = envs[low]
        rows = self.raw[ids].cpu().numpy()
        for k, (i, c) in enumerate(zip(ids.tolist(), first[low].tolist(), strict=True)):
            keep = self.row - c
            rows[k, :keep] = rows[k, c:].copy()
            rows[k, keep:] = self.bitgens[i].random_raw(c).view(np.int64)  # type: ignore[union-attr]
        self._write(ids, rows)
        self.pos[ids] &= 1

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
        threshold = (_TWO32 - bound) % bound
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
            b = bound if const or todo is None else bound[todo]
            t = threshold if const or todo is None else threshold[todo]
            if not const:
                b, t = b[:, None], t[:, None]  # type: ignore[index]
            if const and bound == _TWO32:
                value, ok = u, torch.ones_like(u, dtype=torch.bool)
            elif self.wraps:  # u * b < 2**64: its bits are the wrapped int64 product's
                m = u * b
                value = (m >> 32) & _M32
                ok = (m & _M32) >= t
            else:  # in 16-bit pieces
                lo = (u & 0xFFFF) * b
                hi = (u >> 16) * b
                value = (hi + (lo >> 16)) >> 16
                ok = ((lo + ((hi & 0xFFFF) << 16)) & _M32) >= t
            if accept is not None:
                ok &= accept(value)
            found, j = ok.max(1)  # the first accepted
            used = torch.where(found, j + 1, width)
            if not const:  # a range of one value draws nothing
                single = b.squeeze(1) == 1  # type: ignore[union-attr]
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
                return out if const else torch.where(bound == 1, 0, out)
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
        """Restore what :meth:`state_dict` saved."""
        for i, row in enumerate(state["pcg64"].tolist()):
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
        self._write(torch.arange(len(self.bitgens), device=self.device), state["raw"].numpy())
        self.pos.copy_(state["pos"])
        self.skip.copy_(state["skip"])
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


class BatchedPointNav(BatchedEnv):
    """``num_envs`` :class:`~rl.tasks.nav.PointNavEnv` stepped at once in torch on ``device``.

    Environment ``i`` gives exactly what a ``PointNavEnv`` with the same arguments gives when
    reset with ``seeds[i]`` and, after each episode, reset with ``next_seeds[i]`` (or unseeded):
    the same episodes, observations (``image`` uint8 ``(view, view, 3)``, ``goal`` float32
    ``(3,)``), rewards, flags, ``expert_actions`` and ``episode`` metrics (``success``,
    ``spl``, ``final_distance``, ``shortest_path_length``). ``final_obs`` is in every step
    (zeros where no episode was truncated). See the module's docstring for how.

    Attributes:
        num_envs: How many environments.
        device: Where everything lives.
        observation_space: One environment's (PointNavEnv's).
        action_space: ``Discrete(4)`` (:class:`~rl.tasks.nav.Actions`).
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
        device: str | torch.device = "cpu",
    ) -> None:
        """Build the environments (arguments as :class:`~rl.tasks.nav.PointNavEnv`'s).

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
        layout = RoomLayout(size, rooms_per_side)

        def tensor(values: Any, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values), dtype=dtype, device=dev)

        self._tensor = tensor
        # ---- positions: x * size + y for the agent, the goal and distances; the cells' codes
        # are padded with walls around the grid, at (x + pad) * side + y + pad, for the views
        grid = size * size
        self._pad = pad = max(1, n - 2)
        self._side = side = size + 2 * pad
        if n_envs * side * side >= 1 << 31:
            raise ValueError(f"num_envs={n_envs} is too many for {size}x{size} grids")
        gx, gy = np.divmod(np.arange(grid), size)
        self._code_pos = tensor((gx + pad) * side + gy + pad)
        # goal offsets (ox, oy) as ox * (2 size - 1) + oy, by differences of these
        self._pos_key = tensor(gx * (2 * size - 1) + gy)
        self._goal_center = (size - 1) * (2 * size - 1) + size - 1
        self._rooms_and_doors(layout)
        self._views()

        # ---- moves, goal vectors, rewards
        self._turn = tensor([-1, 1, 0, 0])
        forward = [fx * size + fy for fx, fy in DIR_VEC]
        self._forward = tensor(forward)
        # the cells the expert looks at: ahead, and ahead after a left turn
        self._expert_cells = tensor([[forward[d], forward[(d - 1) % 4]] for d in range(4)])
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
        # rewards by distance before - after + 1 (as PointNavEnv.step sums them), a success's
        scale, penalty = float(distance_reward_scale), float(step_penalty)
        self._rewards = tensor([scale * change - penalty for change in (-1, 0, 1)], torch.float32)
        self._success_reward = float(np.float32(scale * 0 - penalty + float(success_bonus)))

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
                div = torch.tensor(np.cumprod([1, *self._door_lengths[:-1]]).tolist())
                door_v = (codes[:, None] // div) % torch.tensor(self._door_lengths)
                buckets = torch.tensor([b == split for b in _BUCKETS])
                table = _doors_in_split(door_v, self._door_lengths, buckets)
                self._split_table = table.to(dev)
            self._split_modulus = int(n_layouts)
        # a split no layout falls in (PointNavEnv raises at reset, after its draws)
        self._split_empty = self._split_table is not None and not bool(self._split_table.any())
        window = 16 if split is None else (32 if split == "train" else 128)
        self._streams = _Streams(n_envs, dev, window)

        # ---- per-environment state: the agent and counters (int64, _STATE_COLUMNS) and what
        # its episode's distances are computed from (int32, _episode_columns)
        self._code_rowbase = torch.arange(n_envs, device=dev) * side * side
        self._state = torch.zeros((n_envs, _STATE_COLUMNS), dtype=torch.int64, device=dev)
        self._state[:, _GOAL] = self._cell_grid[0]  # an interior cell (see _set_codes)
        self._episode = torch.zeros((n_envs, 3 * nd + 2), dtype=torch.int32, device=dev)
        self._codes = self._code_template.repeat(n_envs, 1)

    def _rooms_and_doors(self, layout: RoomLayout) -> None:
        """The room structure as tables, by position (RoomLayout's, for distances and codes).

        The distance from cell ``p`` to the goal is the minimum of the goal's row of
        ``_goal_rows`` at ``p`` (the Manhattan distance in the goal's room) and, per door, its
        row of ``_door_rows`` at ``p`` (the Manhattan distance from the cells of the door's
        rooms, 0 on the door) plus the door's distance to the goal: what
        :meth:`RoomLayout.distance_field` computes. Walls are ``-far`` in those rows (then -1:
        the door slots' other cells in their door's rows, the walls that are never doors in
        the goal rows), other cells ``far``. The doors' distances are a Bellman-Ford over the
        doors from ``_goal_doors`` (the goal room's doors) along ``_door_edges``, each indexed
        by the doors' offsets.
        """
        tensor = self._tensor
        size, pad, side = self.size, self._pad, self._side
        grid = size * size
        slots = layout.door_slots
        nd = self._n_doors = len(slots)
        n_cells = self._n_cells = len(layout.cell_x)
        n_free = self._n_free = layout.n_free
        small = n_free < _FAR16 // 2  # distances and tables fit int16
        self._dtype = torch.int16 if small else torch.int32
        far = _FAR16 if small else _FAR32
        self._longest = longest = max([s[4] for s in slots], default=1)
        gx, gy = np.divmod(np.arange(grid), size)
        room = np.full(grid, -1, dtype=np.int64)
        room[layout.cell_flat] = [layout.room_of_flat[f] for f in layout.cell_flat]
        slot_of = np.full(grid, -1, dtype=np.int64)
        door_xy = np.zeros((nd, longest, 2), dtype=np.int64)
        for d, (x0, y0, ax, ay, length) in enumerate(slots):
            for v in range(length):
                door_xy[d, v] = (x0 + ax * v, y0 + ay * v)
                slot_of[(x0 + ax * v) * size + y0 + ay * v] = d
        wall = (room < 0) & (slot_of < 0)  # never free
        cell_grid = np.asarray(layout.cell_flat, dtype=np.int64)
        self._cell_grid = tensor(cell_grid)
        slot = np.asarray([s[:4] for s in slots], dtype=np.int64).reshape(nd, 4)
        self._slot_x0, self._slot_y0 = tensor(slot[:, 0]), tensor(slot[:, 1])
        self._slot_ax, self._slot_ay = tensor(slot[:, 2]), tensor(slot[:, 3])
        self._slot_grid0 = tensor(slot[:, 0] * size + slot[:, 1])
        self._slot_grid_step = tensor(slot[:, 2] * size + slot[:, 3])
        self._door_offset = tensor(np.arange(nd) * longest)  # door d's first offset row
        self._door_row0 = self._door_offset * grid  # ... its start in the flat door rows

        goal_rows = np.full((n_free, grid), far, dtype=np.int64)
        cell_room = room[cell_grid]
        same = room[None, :] == cell_room[:, None]
        manhattan = np.abs(gx[None, :] - gx[cell_grid][:, None]) + np.abs(
            gy[None, :] - gy[cell_grid][:, None]
        )
        goal_rows[:n_cells] = np.where(same, manhattan, far)
        goal_rows[:, wall] = -far
        door_rows = np.full((max(nd, 1) * longest, grid), far, dtype=np.int64)
        goal_doors = np.full((n_free, max(nd, 1), longest), _FAR32, dtype=np.int64)
        edges = np.full((max(nd, 1), max(nd, 1), longest, longest), _FAR32, dtype=np.int64)
        for d in range(nd):
            rooms = [r for r, doors in enumerate(layout.room_doors) if d in doors]
            near, in_room = np.isin(room, rooms), np.isin(cell_room, rooms)
            for v in range(slots[d][4]):
                x, y = door_xy[d, v]
                row = door_rows[d * longest + v]
                row[near] = (np.abs(gx - x) + np.abs(gy - y))[near]
                row[slot_of == d] = -far
                row[x * size + y] = 0
                # an interior goal's distance to the doors of its room
                to_door = np.abs(gx[cell_grid] - x) + np.abs(gy[cell_grid] - y)
                goal_doors[:n_cells][in_room, d, v] = to_door[in_room]
                for e in layout.door_adj[d]:
                    for w in range(slots[e][4]):
                        ex, ey = door_xy[e, w]
                        edges[d, e, v, w] = abs(x - ex) + abs(y - ey)
            goal_doors[n_cells + d, d, :] = 0  # the goal is door d
        self._goal_rows = tensor(goal_rows.reshape(-1), self._dtype)
        self._door_rows = tensor(door_rows.reshape(-1), self._dtype)
        self._goal_doors = tensor(goal_doors.reshape(-1), torch.int32)
        self._door_edges = tensor(edges.reshape(-1), torch.int32)
        pairs = (np.arange(nd)[:, None] * nd + np.arange(nd)[None, :]) * longest * longest
        self._edge_base = tensor(pairs)
        codes = np.full(side * side, _WALL_CODE, dtype=np.uint8)
        codes[(gx[cell_grid] + pad) * side + gy[cell_grid] + pad] = _EMPTY_CODE
        self._code_template = tensor(codes, torch.uint8)

    def _views(self) -> None:
        """The view's tables: cell offsets per direction, occlusion, and image rows."""
        tensor = self._tensor
        n, pad, side = self.agent_view_size, self._pad, self._side
        # view cell (i, j) at i * width + j, rows j padded to whole 8-byte words (the padding
        # reads the padded grid's first cell, a wall, and is never visible)
        self._width = width = 8 * ((n + 7) // 8)
        view_x, view_y = view_indices(n, 0)
        view = np.full((4, n, width), -(pad * side + pad), dtype=np.int64)  # cell 0
        for d in range(4):
            view[d, :, :n] = view_x[d] * side + view_y[d]
        self._view = tensor(view.reshape(4, -1), torch.int32)
        self._bit_shift = tensor(list(range(n)))
        self._byte_shift = tensor([8 * j for j in range(n)])
        # process_vis_row as tables, by (incoming mask << n) | see-behind: the next row's
        # incoming mask (shifted by n, to index with), and the row's visible cells
        self._vis_start = (1 << (n // 2)) << n
        self._vis_next: torch.Tensor | None = None
        if n <= _MAX_TABLE_VIEW:
            index = np.arange(1 << (2 * n), dtype=np.int64)
            mask, below = process_vis_row(index >> n, index & ((1 << n) - 1), n)
            self._vis_next = tensor(below << n)
            self._vis_mask = tensor(mask)
        # a cell's encoding by its code's class (unseen, empty, wall, goal), and, for views of
        # one word per row, a view row's encodings by its cells' classes (2 bits each)
        encodings = np.asarray([(0, 0, 0), EMPTY_ENCODING, WALL_ENCODING, GOAL_ENCODING])
        self._encodings = tensor(encodings, torch.uint8)
        if width == 8:
            keys = np.arange(4**n)
            classes = (keys[:, None] >> (2 * np.arange(n))) & 3
            self._row_images = tensor(encodings[classes].reshape(4**n, 3 * n), torch.uint8)

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
        if bool((a & ~3).any()):
            bad = a[(a & ~3) != 0][0].item()
            raise ValueError(f"unknown action {bad!r}; expected 0..{len(Actions) - 1}")
        if next_seeds is not None and len(next_seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} next seeds, got {len(next_seeds)}")

        pos, d, goal, steps, moved, start_dist, dist, ahead_dist = self._state.unbind(1)
        move = (a == Actions.FORWARD) & (ahead_dist >= 0)
        pos = torch.where(move, pos + _at(self._forward, d), pos)
        new_dist = torch.where(move, ahead_dist, dist)
        stop = a == Actions.STOP
        success = stop & (dist == 0)
        steps = steps + 1
        moved = moved + move
        truncated = (steps >= self.max_steps) & ~stop
        rewards = torch.where(
            success, self._success_reward, _at(self._rewards, dist - new_dist + 1)
        )
        length = start_dist.double()
        spl = torch.where(success, length / torch.maximum(moved.double(), length), 0.0)
        spl = torch.where(success & (start_dist == 0), 1.0, spl)
        episode = self._td(
            {
                "success": success.float(),
                "spl": spl.float(),
                "final_distance": new_dist.float(),
                "shortest_path_length": start_dist.float(),
            }
        )
        d = (d + _at(self._turn, a)) & 3
        self._state = torch.stack((pos, d, goal, steps, moved, start_dist, new_dist, dist), 1)

        image_shape = (self.num_envs, *self.observation_space["image"].shape)
        final = {
            "image": torch.zeros(image_shape, dtype=torch.uint8, device=self.device),
            "goal": torch.zeros((self.num_envs, 3), dtype=torch.float32, device=self.device),
        }
        ended = (stop | truncated).nonzero().squeeze(1)
        if ended.numel():
            cut = truncated.nonzero().squeeze(1)
            if cut.numel():
                final["image"][cut], final["goal"][cut] = self._observe(cut)
            seeds = None
            if next_seeds is not None:
                seeds = [next_seeds[i] for i in ended.tolist()]
            self._start(ended, seeds)
        out = self._first()
        out.update(
            {
                "rewards": rewards,
                "terminated": stop,
                "truncated": truncated,
                "final_obs": self._td(final),
                EPISODE_KEY: episode,
            }
        )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The episodes in flight and every environment's random stream, exactly."""
        if not self._started:
            raise RuntimeError("state_dict() before reset()")
        return {
            "num_envs": self.num_envs,
            "config": dict(self.config),
            "state": self._state.cpu(),
            "episode": self._episode.cpu(),
            "streams": self._streams.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> TensorDict:
        """Restore :meth:`state_dict`'s episodes; return what :meth:`reset` returns.

        Raises:
            ValueError: The state is of another number of environments or configuration.
        """
        if int(state["num_envs"]) != self.num_envs:
            raise ValueError(
                f"state of {state['num_envs']} environments, this has {self.num_envs}"
            )
        if dict(state["config"]) != self.config:
            raise ValueError(
                f"state of a PointNav configured {state['config']}, this is {self.config}"
            )
        saved = state["state"].to(self.device, torch.int64)
        nd = self._n_doors
        door_v = state["episode"][:, :nd].to(self.device, torch.int64)
        goal_index = state["episode"][:, nd].to(self.device, torch.int64)
        goal = self._free_cells(goal_index, self._door_cells(door_v))
        if not torch.equal(goal, saved[:, _GOAL]):
            raise ValueError("inconsistent state: the goals are not the episodes' goals")
        self._streams.load_state_dict(state["streams"])
        envs = torch.arange(self.num_envs, device=self.device)
        self._codes = self._code_template.repeat(self.num_envs, 1)
        self._set_codes(envs, door_v, goal)
        self._episode = self._episode_rows(goal_index, door_v)
        self._state = saved.clone()
        self._started = True
        return self._first()

    def render(self, index: int = 0) -> Any:
        """An RGB frame of environment ``index`` (a PointNavEnv placed in its episode)."""
        if self.render_mode is None or not self._started:
            return None
        if self._twin is None:
            self._twin = PointNavEnv(**self.config, render_mode=self.render_mode)
        twin = self._twin
        size, nd = self.size, self._n_doors
        door_v = self._episode[index : index + 1, :nd].long()
        goal_index = self._episode[index : index + 1, nd].long()
        door_x = (self._slot_x0 + self._slot_ax * door_v)[0].tolist()
        door_y = (self._slot_y0 + self._slot_ay * door_v)[0].tolist()
        pos, d, goal, steps = self._state[index, [_POS, _DIR, _GOAL, _STEPS]].tolist()
        dist = self._fields(goal_index, door_v)[0].view(size, size).cpu().numpy().astype(np.int64)
        twin.place(door_x, door_y, divmod(goal, size), dist, divmod(pos, size), d)
        twin.step_count = steps
        return twin.render()

    def close(self) -> None:
        """Release the rendering twin (idempotent)."""
        if self._twin is not None:
            self._twin.close()
            self._twin = None

    # ============================================================== internals
    def _td(self, entries: dict[str, Any]) -> TensorDict:
        return TensorDict._new_unsafe(entries, batch_size=self._batch, device=self.device)

    def _first(self) -> TensorDict:
        """Observations and expert actions of the current state (what a reset returns)."""
        image, goal = self._observe()
        return self._td(
            {"obs": self._td({"image": image, "goal": goal}), EXPERT_ACTIONS: self._expert()}
        )

    def _observe(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``image`` and ``goal`` of every environment (or of environments ``rows``).

        The view's cells' codes in one gather, as one int64 word per view row ``i`` (cells
        ``j``, a byte each). Shifting row ``i``'s 0/1 see-behind bytes by ``i`` and summing
        puts process_vis's row ``j`` in byte ``j``; process_vis's row tables give the visible
        cells, spread back to bytes the same way; a row's visible cells' classes (2 bits each)
        index the table of its encodings.
        """
        n, width = self.agent_view_size, self._width
        state = self._state if rows is None else _at(self._state, rows)
        rowbase = self._code_rowbase if rows is None else _at(self._code_rowbase, rows)
        pos, d, goal = state[:, _POS], state[:, _DIR], state[:, _GOAL]
        count = pos.numel()
        where = (rowbase + _at(self._code_pos, pos)).int()[:, None] + _at(self._view, d)
        cells = _at(self._codes.view(-1), where.view(-1)).view(count, n, width)  # [B, i, j]
        see = cells >> 7  # 0/1 bytes
        if width == 8:
            packed = (see.view(torch.int64).view(count, n) << self._bit_shift).sum(1)
            see_rows = packed.view(torch.uint8).view(count, 8).long().t()  # [j, B]
        else:
            see_rows = (see.long() << self._bit_shift[:, None]).sum(1).t()
        visible = self._visible_rows(see_rows)  # [B, j]: bit i
        if width == 8:
            words = (visible << self._byte_shift).sum(1)  # byte j: row j's visible cells
            classes = cells.view(torch.int64).view(count, n) & (
                ((words[:, None] >> self._bit_shift) & _LOW_BITS) * 3
            )
            classes[:, n // 2] &= ~(2 << (8 * (n - 1)))  # the agent's cell: empty, not goal
            keys = (classes | (classes >> 6)) & 0x000F000F000F000F  # class j at bits 2j
            keys = (keys | (keys >> 12)) & 0x000000FF000000FF
            keys = (keys | (keys >> 24)) & 0xFFFF
            image = _at(self._row_images, keys).view(count, n, n, 3)
        else:
            shown = (visible[:, None, :] >> self._bit_shift[:, None]) & 1  # [B, i, j]
            classes = (cells[:, :, :n] & 3).long() * shown
            classes[:, n // 2, n - 1] = 1  # the agent's cell: empty, not goal
            image = _at(self._encodings, classes)
        key = _at(self._pos_key, goal) - _at(self._pos_key, pos) + self._goal_center
        goal_vec = _at(self._goal_table, key * 4 + d)
        return image, goal_vec

    def _visible_rows(self, see_rows: torch.Tensor) -> torch.Tensor:
        """process_vis row by row (``see_rows[j]``: row ``j``'s see-behind bits); ``[B, j]``."""
        n = self.agent_view_size
        if self._vis_next is not None:
            index = [see_rows[0]] * n
            index[n - 1] = see_rows[n - 1] | self._vis_start
            for j in range(n - 2, -1, -1):
                index[j] = _at(self._vis_next, index[j + 1]) | see_rows[j]
            return _at(self._vis_mask, torch.stack(index, 1))
        rows: list[torch.Tensor] = [see_rows[0]] * n
        incoming = torch.full_like(see_rows[0], 1 << (n // 2), dtype=torch.int64)
        for j in range(n - 1, -1, -1):
            rows[j], incoming = process_vis_row(incoming, see_rows[j].long(), n)
        return torch.stack(rows, 1)

    def _expert(self) -> torch.Tensor:
        """PointNavEnv.expert_action of every environment; caches the distance ahead."""
        pos, d, dist = self._state[:, _POS], self._state[:, _DIR], self._state[:, _DIST]
        near = self._distances(self._episode, pos[:, None] + _at(self._expert_cells, d))
        self._state[:, _AHEAD] = near[:, 0]
        target = dist - 1
        turn = torch.where(near[:, 1] == target, int(Actions.LEFT), int(Actions.RIGHT))
        act = torch.where(near[:, 0] == target, int(Actions.FORWARD), turn)
        return torch.where(dist == 0, int(Actions.STOP), act)

    def _distances(self, episode: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """Distances to the goal of ``cells`` ``[B, k]`` (-1 on walls) in these episodes."""
        nd = self._n_doors
        where = cells.int()
        dist = _at(self._goal_rows, episode[:, nd + 1, None] + where)
        if nd:
            door_rows = episode[:, None, nd + 2 : 2 * nd + 2] + where[:, :, None]
            via = _at(self._door_rows, door_rows) + episode[:, None, 2 * nd + 2 :]
            dist = torch.minimum(dist, via.amin(2))
        return dist.clamp_min(-1).long()

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
        """Each environment's episode draw (RoomLayout.draw, in its split): ``[B, values]``."""
        if self._split_empty:
            raise ValueError(
                f"split {self.split!r}: no episode of it in {MAX_SPLIT_DRAWS} draws; the task "
                f"has too few layouts to split ({self.size}x{self.size}, "
                f"{self.config['rooms_per_side']} rooms per side)"
            )
        streams = self._streams
        if len(self._chunks) == 1:
            bound, _ = self._chunks[0]
            packed = streams.draw(envs, bound, self._packed_in_split(0))
            div, radix = self._decode[0]
            return (packed[:, None] // div) % radix
        # several packed integers per draw: whole draws until one's layout is in the split
        out = torch.zeros((envs.numel(), self._n_values), dtype=torch.int64, device=self.device)
        todo = torch.arange(envs.numel(), device=self.device)
        for _ in range(MAX_SPLIT_DRAWS):
            e = envs[todo]
            parts = []
            for (bound, _), (div, radix) in zip(self._chunks, self._decode, strict=True):
                parts.append((streams.draw(e, bound)[:, None] // div) % radix)
            values = torch.cat(parts, 1)
            out[todo] = values
            if self.split is None:
                return out
            ok = self._in_split(values[:, : self._n_doors])
            if bool(ok.all()):
                return out
            todo = todo[~ok]
        raise ValueError(
            f"split {self.split!r}: no episode of it in {MAX_SPLIT_DRAWS} draws; the task has "
            f"too few layouts to split"
        )

    def _door_cells(self, door_v: torch.Tensor) -> torch.Tensor:
        """The doors' positions ``[B, doors]``."""
        return self._slot_grid0 + self._slot_grid_step * door_v

    def _free_cells(self, index: torch.Tensor, doors: torch.Tensor) -> torch.Tensor:
        """Positions of free cells ``index`` (RoomLayout.free_cell: rooms' cells, then doors)."""
        interior = _at(self._cell_grid, index.clamp(max=self._n_cells - 1))
        if not self._n_doors:
            return interior
        door = (index - self._n_cells).clamp(0, self._n_doors - 1)
        return torch.where(
            index < self._n_cells, interior, doors.gather(1, door[:, None]).squeeze(1)
        )

    def _episode_rows(self, goal_index: torch.Tensor, door_v: torch.Tensor) -> torch.Tensor:
        """Rows of ``_episode`` (int32, D doors): what the episode's distances are made of.

        The doors' offsets (D columns), the goal's free-cell index, the start of its row of
        ``_goal_rows``, the starts of the doors' rows of ``_door_rows`` (D), the doors'
        distances to the goal (D).
        """
        nd, grid = self._n_doors, self.size * self.size
        columns = [door_v, goal_index[:, None], goal_index[:, None] * grid]
        if nd:
            columns.append(self._door_row0 + door_v * grid)
            rows = goal_index[:, None] * (nd * self._longest) + self._door_offset + door_v
            door_dist = _at(self._goal_doors, rows)
            weights = _at(
                self._door_edges,
                self._edge_base + door_v[:, :, None] * self._longest + door_v[:, None, :],
            )
            for _ in range(nd - 1):  # Bellman-Ford: shortest paths have at most nd - 1 edges
                door_dist = torch.minimum(door_dist, (door_dist[:, :, None] + weights).amin(1))
            columns.append(door_dist)
        return torch.cat([c.int() for c in columns], 1)

    def _fields(self, goal_index: torch.Tensor, door_v: torch.Tensor) -> torch.Tensor:
        """Whole distance fields ``[B, size * size]`` (RoomLayout.distance_field's)."""
        grid = self.size * self.size
        cells = torch.arange(grid, device=self.device).expand(goal_index.numel(), -1)
        return self._distances(self._episode_rows(goal_index, door_v), cells)

    def _set_codes(self, envs: torch.Tensor, door_v: torch.Tensor, goal: torch.Tensor) -> None:
        """Codes of ``envs``' new episodes: the previous doors and goal undone, the new set."""
        base = _at(self._code_rowbase, envs)
        flat = self._codes.view(-1)
        old_goal = _at(self._code_pos, _at(self._state, envs)[:, _GOAL])
        flat[base + old_goal] = _EMPTY_CODE  # the goal was in a room or a door
        if self._n_doors:
            old_v = _at(self._episode, envs)[:, : self._n_doors].long()
            old_doors = _at(self._code_pos, self._door_cells(old_v))
            flat[(base[:, None] + old_doors).view(-1)] = _WALL_CODE
            doors = _at(self._code_pos, self._door_cells(door_v))
            flat[(base[:, None] + doors).view(-1)] = _EMPTY_CODE
        flat[base + _at(self._code_pos, goal)] = _GOAL_CODE

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
        nd = self._n_doors
        values = self._draw_values(envs)
        door_v = values[:, :nd]
        goal_index, direction, start_index = values[:, nd], values[:, nd + 1], values[:, nd + 2]
        doors = self._door_cells(door_v)
        start = self._free_cells(start_index, doors)
        episode = self._episode_rows(goal_index, door_v)
        start_dist = self._distances(episode, start[:, None]).squeeze(1)
        if self.min_start_distance > 0:
            far_enough = start_dist >= self.min_start_distance
            if not bool(far_enough.all()):
                todo = far_enough.logical_not().nonzero().squeeze(1)
                self._other_starts(envs, todo, goal_index, start, door_v)
                episode[todo] = self._episode_rows(goal_index[todo], door_v[todo])
                start_dist[todo] = self._distances(episode[todo], start[todo, None]).squeeze(1)
        goal = self._free_cells(goal_index, doors)
        self._set_codes(envs, door_v, goal)
        zeros = torch.zeros_like(start)
        self._state[envs] = torch.stack(
            (start, direction, goal, zeros, zeros, start_dist, start_dist, zeros), 1
        )
        self._episode[envs] = episode

    def _other_starts(
        self,
        envs: torch.Tensor,
        todo: torch.Tensor,
        goal_index: torch.Tensor,
        start: torch.Tensor,
        door_v: torch.Tensor,
    ) -> None:
        """A start among the cells far enough, or a new goal (PointNavEnv._gen_grid's loop).

        For the positions ``todo`` of ``envs`` whose pre-drawn start is too close; updates
        ``goal_index`` and ``start`` in place.
        """
        for attempt in range(1, 101):
            field = self._fields(goal_index[todo], door_v[todo])
            candidates = field >= self.min_start_distance
            count = candidates.sum(1)
            some = count > 0
            if bool(some.any()):
                k = self._streams.draw32(envs[todo[some]], count[some])
                ranks = candidates[some].cumsum(1)
                start[todo[some]] = torch.searchsorted(ranks, (k + 1)[:, None]).squeeze(1)
            todo = todo[~some]
            if not todo.numel():
                return
            if attempt == 100:
                break
            goal_index[todo] = self._streams.draw32(envs[todo], self._n_free)
        raise RuntimeError(
            f"no start cell at geodesic distance >= {self.min_start_distance} from the goal "
            f"after 100 goal draws; lower min_start_distance"
        )
