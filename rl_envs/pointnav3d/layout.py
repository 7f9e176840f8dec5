"""Floorplans of the 3D PointNav task: a grid of rectangular rooms joined by doorways.

A :class:`Floorplan` is ``rows x cols`` rooms tiling a rectangle (x to the east, z to the south,
metres, the origin at the north-west corner). Column widths and row depths are drawn per episode
from a range in ``size_step`` increments. Rooms share zero-thickness walls; a random spanning tree
of the room grid gets a doorway on each of its walls (so every room is reachable), and each other
wall between adjacent rooms gets one with probability ``extra_door_prob``. A doorway is
``door_width`` wide, placed along its wall in ``size_step`` increments at least ``door_margin``
from the wall's ends. Each room also draws its wall, floor and ceiling textures.

Everything here is numpy and plain Python (no OpenGL): the navigation grid
(:mod:`rl_envs.pointnav3d.grid`) and the MiniWorld scene (:mod:`rl_envs.pointnav3d.world`) are both
built from the same :class:`Floorplan`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

__all__ = [
    "CEILING_TEXTURES",
    "FLOOR_TEXTURES",
    "WALL_TEXTURES",
    "Door",
    "Floorplan",
    "FloorplanSpec",
    "draw_floorplan",
]

# MiniWorld texture names (each has at least a `<name>_1.png`), chosen for indoor scenes.
WALL_TEXTURES = (
    "brick_wall",
    "cinder_blocks",
    "concrete",
    "drywall",
    "marble",
    "stucco",
    "wood",
    "wood_planks",
)
FLOOR_TEXTURES = ("asphalt", "concrete_tiles", "floor_tiles_bw", "marble", "wood", "wood_planks")
CEILING_TEXTURES = ("ceiling_tiles", "ceiling_tile_noborder", "concrete_tiles", "white")


@dataclasses.dataclass(frozen=True)
class Door:
    """A doorway between rooms ``a`` and ``b`` (row-major indices, ``b`` east or south of ``a``).

    Attributes:
        a: The west or north room.
        b: The east or south room.
        lo: Start of the opening along the shared wall (z for an east wall, x for a south wall).
        hi: End of the opening.
    """

    a: int
    b: int
    lo: float
    hi: float


@dataclasses.dataclass(frozen=True)
class FloorplanSpec:
    """The distribution floorplans are drawn from (see the module docstring).

    Attributes:
        rows: Rooms per column (north to south).
        cols: Rooms per row (west to east).
        room_size: ``(min, max)`` width and depth of a room, metres.
        size_step: Granularity of room sizes and door positions, metres.
        door_width: Width of every doorway, metres.
        door_margin: Least distance from a doorway to the ends of its wall, metres.
        extra_door_prob: Probability of a doorway on a wall outside the spanning tree.
    """

    rows: int
    cols: int
    room_size: tuple[float, float]
    size_step: float = 0.5
    door_width: float = 1.0
    door_margin: float = 0.25
    extra_door_prob: float = 0.3

    def check(self) -> None:
        """Raise ``ValueError`` naming the argument if the spec cannot produce a floorplan."""
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"rooms must be >= 1 per side, got {self.rows}x{self.cols}")
        lo, hi = self.room_size
        if not 0 < lo <= hi:
            raise ValueError(f"room_size must be (min, max) with 0 < min <= max, got {lo}, {hi}")
        if self.size_step <= 0:
            raise ValueError(f"size_step must be > 0, got {self.size_step}")
        if self.door_width <= 0 or self.door_margin < 0:
            raise ValueError("door_width must be > 0 and door_margin >= 0")
        if self.door_width + 2 * self.door_margin > lo:
            raise ValueError(
                f"door_width + 2 * door_margin = {self.door_width + 2 * self.door_margin} does "
                f"not fit in the smallest room side (room_size min {lo})"
            )
        if not 0.0 <= self.extra_door_prob <= 1.0:
            raise ValueError(f"extra_door_prob must be in [0, 1], got {self.extra_door_prob}")

    def sizes(self) -> np.ndarray:
        """The room sides that can be drawn: ``min, min + step, ..., <= max``."""
        lo, hi = self.room_size
        n = int(math.floor((hi - lo) / self.size_step + 1e-9)) + 1
        return lo + self.size_step * np.arange(n)


@dataclasses.dataclass(frozen=True)
class Floorplan:
    """One drawn floorplan (see the module docstring).

    Attributes:
        col_widths: Width of each column of rooms (x), west to east.
        row_depths: Depth of each row of rooms (z), north to south.
        doors: The doorways.
        textures: Per room (row-major), its ``(wall, floor, ceiling)`` texture names.
    """

    col_widths: tuple[float, ...]
    row_depths: tuple[float, ...]
    doors: tuple[Door, ...]
    textures: tuple[tuple[str, str, str], ...]

    @property
    def rows(self) -> int:
        """Rooms per column."""
        return len(self.row_depths)

    @property
    def cols(self) -> int:
        """Rooms per row."""
        return len(self.col_widths)

    @property
    def x_lines(self) -> np.ndarray:
        """X of the north-south walls, west to east (``cols + 1`` values from 0)."""
        return np.concatenate([[0.0], np.cumsum(self.col_widths)])

    @property
    def z_lines(self) -> np.ndarray:
        """Z of the east-west walls, north to south (``rows + 1`` values from 0)."""
        return np.concatenate([[0.0], np.cumsum(self.row_depths)])

    @property
    def extent(self) -> tuple[float, float]:
        """``(width, depth)`` of the whole floorplan, metres."""
        return float(sum(self.col_widths)), float(sum(self.row_depths))

    def room_rect(self, room: int) -> tuple[float, float, float, float]:
        """``(min_x, max_x, min_z, max_z)`` of a room (row-major index)."""
        j, i = divmod(room, self.cols)
        xs, zs = self.x_lines, self.z_lines
        return float(xs[i]), float(xs[i + 1]), float(zs[j]), float(zs[j + 1])

    def key(self) -> int:
        """The layout key of :func:`rl.tasks.splits.split_of`: the geometry, not the textures.

        Sizes and door positions in whole millimetres, in a fixed order, hashed with BLAKE2b
        into 48 bits (stable across processes and runs). A cryptographic hash, not a polynomial
        one: sizes are multiples of the size step, so a polynomial key keeps their common
        factors in its low bits, and ``split_of``'s buckets would not all be reached.
        """
        values = [len(self.col_widths), len(self.row_depths)]
        values += [round(w * 1000) for w in (*self.col_widths, *self.row_depths)]
        for door in self.doors:
            values += [door.a, door.b, round(door.lo * 1000)]
        digest = hashlib.blake2b(repr(values).encode(), digest_size=6).digest()
        return int.from_bytes(digest, "big")

    def wall_segments(self) -> np.ndarray:
        """The walls as ``(n, 2, 2)`` segments ``[[x0, z0], [x1, z1]]``, doorways left open.

        Each wall appears once (MiniWorld's rooms list shared walls twice, which collides alike).
        """
        xs, zs = self.x_lines, self.z_lines
        openings: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
        for door in self.doors:
            ja, ia = divmod(door.a, self.cols)
            jb, ib = divmod(door.b, self.cols)
            wall = ("x", ia + 1, ja) if jb == ja else ("z", ja + 1, ia)
            openings.setdefault(wall, []).append((door.lo, door.hi))
        segments: list[list[list[float]]] = []

        def add(axis: str, line: int, cell: int, fixed: float, lo: float, hi: float) -> None:
            cuts = sorted(openings.get((axis, line, cell), []))
            start = lo
            for a, b in [*cuts, (hi, hi)]:
                if a > start:
                    if axis == "x":
                        segments.append([[fixed, start], [fixed, a]])
                    else:
                        segments.append([[start, fixed], [a, fixed]])
                start = b

        for i in range(self.cols + 1):  # north-south walls at x = xs[i], one per row
            for j in range(self.rows):
                add("x", i, j, float(xs[i]), float(zs[j]), float(zs[j + 1]))
        for j in range(self.rows + 1):  # east-west walls at z = zs[j], one per column
            for i in range(self.cols):
                add("z", j, i, float(zs[j]), float(xs[i]), float(xs[i + 1]))
        return np.asarray(segments, dtype=np.float64).reshape(-1, 2, 2)


def _spanning_tree(rows: int, cols: int, rng: np.random.Generator) -> set[tuple[int, int]]:
    """A uniformly shuffled randomized-Kruskal spanning tree of the room grid's adjacency."""
    edges = [(r, r + 1) for r in range(rows * cols) if (r + 1) % cols]
    edges += [(r, r + cols) for r in range(rows * cols - cols)]
    order = rng.permutation(len(edges))
    parent = list(range(rows * cols))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree: set[tuple[int, int]] = set()
    for e in order:
        a, b = edges[int(e)]
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            tree.add((a, b))
    return tree


def draw_floorplan(spec: FloorplanSpec, rng: np.random.Generator) -> Floorplan:
    """Draw a floorplan from ``spec`` with ``rng`` (see the module docstring).

    Args:
        spec: The distribution (checked with :meth:`FloorplanSpec.check` by the caller).
        rng: The episode's generator.
    """
    sizes = spec.sizes()
    widths = tuple(float(sizes[k]) for k in rng.integers(len(sizes), size=spec.cols))
    depths = tuple(float(sizes[k]) for k in rng.integers(len(sizes), size=spec.rows))
    tree = _spanning_tree(spec.rows, spec.cols, rng)
    adjacent = [(r, r + 1) for r in range(spec.rows * spec.cols) if (r + 1) % spec.cols]
    adjacent += [(r, r + spec.cols) for r in range(spec.rows * spec.cols - spec.cols)]
    xs = np.concatenate([[0.0], np.cumsum(widths)])
    zs = np.concatenate([[0.0], np.cumsum(depths)])
    doors: list[Door] = []
    for a, b in sorted(adjacent):
        extra = rng.random() < spec.extra_door_prob
        if (a, b) not in tree and not extra:
            continue
        j, i = divmod(a, spec.cols)
        # The shared wall runs along z (east neighbour) or x (south neighbour).
        lo, hi = (zs[j], zs[j + 1]) if b == a + 1 else (xs[i], xs[i + 1])
        first = lo + spec.door_margin
        slots = int(
            math.floor((hi - spec.door_margin - spec.door_width - first) / spec.size_step + 1e-9)
        )
        start = first + spec.size_step * int(rng.integers(slots + 1))
        doors.append(Door(a, b, float(start), float(start + spec.door_width)))
    textures = tuple(
        (
            WALL_TEXTURES[int(rng.integers(len(WALL_TEXTURES)))],
            FLOOR_TEXTURES[int(rng.integers(len(FLOOR_TEXTURES)))],
            CEILING_TEXTURES[int(rng.integers(len(CEILING_TEXTURES)))],
        )
        for _ in range(spec.rows * spec.cols)
    )
    return Floorplan(widths, depths, tuple(doors), textures)
