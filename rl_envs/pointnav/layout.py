"""Room layouts of the PointNav task: room structure, per-episode draws, exact distance fields.

:class:`RoomLayout` precomputes, once per ``(size, rooms_per_side)``, what every episode's layout
shares: the wall lines, the door slots (one per interior wall segment between two adjacent
rooms), the interior cells grouped by room, the per-cell door tables behind
:meth:`RoomLayout.distance_field` (the geodesic distance field, computed exactly from the room
structure instead of by a breadth-first search), and the packing of an episode's uniform draws
into as few random integers as fit. :func:`build_minigrid_grid` builds the minigrid ``Grid`` of
a layout, which only rendering and minigrid's own methods need.
"""

from __future__ import annotations

import numpy as np
from minigrid.core.grid import Grid
from minigrid.core.world_object import Goal, Wall

from rl.tasks.splits import split_of

__all__ = ["RoomLayout", "build_minigrid_grid", "room_walls"]

# Larger than any geodesic distance; marks "no entry" in the distance computation.
_FAR = 1 << 40
# Random draws are packed into integers below this bound (numpy's int64 range, with margin).
_MAX_PACKED = 1 << 62

# A door slot: the door is at (x0 + ax * v, y0 + ay * v) for v uniform in range(length).
DoorSlot = tuple[int, int, int, int, int]  # (x0, y0, ax, ay, length)


def room_walls(size: int, rooms_per_side: int) -> list[int]:
    """Coordinates of the wall lines (outer walls included) splitting ``size`` into rooms.

    Interior cells are shared as evenly as possible, the first rooms taking any remainder;
    size 19 with 2 rooms gives ``[0, 9, 18]`` like minigrid's FourRooms.

    Args:
        size: Side of the square grid, outer walls included.
        rooms_per_side: Rooms per row and column.

    Returns:
        The ``rooms_per_side + 1`` wall line coordinates, increasing from 0 to ``size - 1``.
    """
    interior = size - rooms_per_side - 1
    base, extra = divmod(interior, rooms_per_side)
    walls = [0]
    for r in range(rooms_per_side):
        walls.append(walls[-1] + base + (1 if r < extra else 0) + 1)
    return walls


def _door_slots(lines: list[int], k: int) -> tuple[list[DoorSlot], list[list[int]]]:
    """Door slots in drawing order (per room, row-major: the wall to its right, then below).

    Returns:
        The slots, and per room (row-major) the indices of the slots in its walls.
    """
    slots: list[DoorSlot] = []
    room_doors: list[list[int]] = [[] for _ in range(k * k)]
    for j in range(k):
        for i in range(k):
            r = j * k + i
            y_top, y_bottom = lines[j], lines[j + 1]
            x_left, x_right = lines[i], lines[i + 1]
            if i + 1 < k:
                slots.append((x_right, y_top + 1, 0, 1, y_bottom - y_top - 1))
                room_doors[r].append(len(slots) - 1)
                room_doors[r + 1].append(len(slots) - 1)
            if j + 1 < k:
                slots.append((x_left + 1, y_bottom, 1, 0, x_right - x_left - 1))
                room_doors[r].append(len(slots) - 1)
                room_doors[r + k].append(len(slots) - 1)
    return slots, room_doors


def _room_cells(
    lines: list[int], k: int, size: int
) -> tuple[list[int], list[int], list[int], list[tuple[int, int]], list[int]]:
    """Interior cells grouped by room (contiguous slices), and the cell -> room map.

    Returns:
        ``(cell_x, cell_y, cell_room, room_slice, room_of_flat)``: the cells' coordinates and
        rooms, each room's ``(first, end)`` cell indices, and the room of flat cell
        ``x * size + y`` (-1 for walls and doors).
    """
    cell_x: list[int] = []
    cell_y: list[int] = []
    cell_room: list[int] = []
    room_slice: list[tuple[int, int]] = []
    room_of_flat = [-1] * (size * size)
    for j in range(k):
        for i in range(k):
            r = j * k + i
            first = len(cell_x)
            for x in range(lines[i] + 1, lines[i + 1]):
                for y in range(lines[j] + 1, lines[j + 1]):
                    cell_x.append(x)
                    cell_y.append(y)
                    cell_room.append(r)
                    room_of_flat[x * size + y] = r
            room_slice.append((first, len(cell_x)))
    return cell_x, cell_y, cell_room, room_slice, room_of_flat


def _cell_slot_tables(
    slots: list[DoorSlot],
    room_doors: list[list[int]],
    cell_x: list[int],
    cell_y: list[int],
    cell_room: list[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (slot, cell) tables for the Manhattan distance from a cell to its room's doors.

    Each cell's room's door slots are padded with a dummy entry (index ``len(slots)``, never
    best: its distance is ``_FAR``). Per (cell, slot), ``perp`` is the distance from the cell to
    the slot's wall line and ``along`` the cell's coordinate along that wall relative to the
    slot's start, so the Manhattan distance to a door drawn at offset ``v`` is
    ``perp + |along - v|``. Stored slot-major, ``(slots, cells)``: ``take`` and a min over axis
    0 are fast on these.

    Returns:
        ``(cell_slots, slot_perp, slot_along)``, each of shape ``(slots per room, cells)``.
    """
    n_rooms, n_doors = len(room_doors), len(slots)
    width = max(1, max(len(d) for d in room_doors))
    table = np.full((n_rooms, width), n_doors, dtype=np.intp)
    for r, doors in enumerate(room_doors):
        table[r, : len(doors)] = doors
    cell_slots = table[np.asarray(cell_room, dtype=np.intp)]
    slot_params = np.asarray([*(slot[:4] for slot in slots), (0, 0, 0, 0)], dtype=np.int64)
    x0, y0, ax, ay = slot_params[cell_slots].transpose(2, 0, 1)
    cx = np.asarray(cell_x, dtype=np.int64)[:, None]
    cy = np.asarray(cell_y, dtype=np.int64)[:, None]
    # Vertical wall (ax=0, ay=1): perp |cx - x0|, along cy - y0; horizontal: swapped.
    return (
        np.ascontiguousarray(cell_slots.T),
        np.ascontiguousarray((ay * np.abs(cx - x0) + ax * np.abs(cy - y0)).T),
        np.ascontiguousarray((ay * (cy - y0) + ax * (cx - x0)).T),
    )


def _pack_radices(radices: list[int]) -> list[tuple[int, list[int]]]:
    """Group radices into chunks whose product stays within ``_MAX_PACKED``.

    Returns:
        ``(bound, radices)`` per chunk: one uniform integer below ``bound`` per chunk, split by
        mixed-radix ``divmod`` into one exactly uniform value per radix.
    """
    chunks: list[tuple[int, list[int]]] = []
    bound = 1
    group: list[int] = []
    for radix in radices:
        if group and bound * radix > _MAX_PACKED:
            chunks.append((bound, group))
            bound, group = 1, []
        bound *= radix
        group.append(radix)
    chunks.append((bound, group))
    return chunks


class RoomLayout:
    """What every episode of a ``rooms_per_side x rooms_per_side`` room grid shares.

    Rooms are the rectangles between consecutive wall lines; each interior wall segment between
    two adjacent rooms holds one door, drawn uniformly along the segment. Free cells are indexed
    interior cells first (grouped by room), then doors (in slot order).

    Attributes:
        size: Side of the square grid, outer walls included.
        walls_at: The wall line coordinates (see :func:`room_walls`).
        door_slots: ``(x0, y0, ax, ay, length)`` per door, in drawing order.
        room_doors: Per room (row-major), the indices of the doors in its walls.
        door_adj: Per door, the other doors sharing a room with it (the only door-to-door moves
            that do not pass another door).
        cell_x: Interior cells' x coordinates, grouped by room.
        cell_y: Interior cells' y coordinates, grouped by room.
        room_slice: Per room, its ``(first, end)`` interior cell indices.
        room_of_flat: Room of flat cell ``x * size + y`` (-1 for walls and doors).
        cell_x_np: ``cell_x`` as an int64 array.
        cell_y_np: ``cell_y`` as an int64 array.
        cell_flat: Flat index ``x * size + y`` of each interior cell.
        cell_slots: ``(slots per room, cells)`` door index per cell and slot (a dummy index
            ``len(door_slots)`` pads rooms with fewer doors).
        slot_perp: Per (slot, cell), the cell's distance to the slot's wall line.
        slot_along: Per (slot, cell), the cell's coordinate along the slot's wall, from its
            start.
        interior: ``(size, size)`` bool, True on room interiors (doors excluded).
        n_free: Number of free cells in every layout (interior cells plus doors).
        draw_chunks: How :meth:`draw` packs an episode's uniform values into random integers.
    """

    def __init__(self, size: int, rooms_per_side: int) -> None:
        """Precompute the tables of a ``size x size`` grid of ``rooms_per_side**2`` rooms.

        Args:
            size: Side of the square grid, outer walls included.
            rooms_per_side: Rooms per row and column (1: a single open room).
        """
        k = rooms_per_side
        self.size = size
        self.walls_at = room_walls(size, k)
        slots, room_doors = _door_slots(self.walls_at, k)
        n_doors = len(slots)
        self.door_slots = slots
        self.room_doors = room_doors
        self.door_adj = [
            sorted({e for r in range(k * k) if d in room_doors[r] for e in room_doors[r]} - {d})
            for d in range(n_doors)
        ]
        cell_x, cell_y, cell_room, self.room_slice, self.room_of_flat = _room_cells(
            self.walls_at, k, size
        )
        self.cell_x, self.cell_y = cell_x, cell_y
        self.cell_x_np = np.asarray(cell_x, dtype=np.int64)
        self.cell_y_np = np.asarray(cell_y, dtype=np.int64)
        self.cell_flat = self.cell_x_np * size + self.cell_y_np
        self.cell_slots, self.slot_perp, self.slot_along = _cell_slot_tables(
            slots, room_doors, cell_x, cell_y, cell_room
        )
        self.interior = np.zeros((size, size), dtype=bool)
        self.interior.flat[self.cell_flat] = True
        self.n_free = len(cell_x) + n_doors
        # Random draws per episode: each door's offset, goal cell, direction, start cell (the
        # latter by rejection, see PointNavEnv._gen_grid).
        self.draw_chunks = _pack_radices(
            [slot[4] for slot in slots] + [self.n_free, 4, self.n_free]
        )

    def draw(
        self, rng: np.random.Generator
    ) -> tuple[list[int], list[int], list[int], int, int, int]:
        """Draw an episode's doors, goal, direction and start, each exactly uniform.

        One uniform integer per chunk of ``draw_chunks`` (usually a single random call), split
        into the values by mixed-radix ``divmod``.

        Args:
            rng: The episode's generator.

        Returns:
            ``(door_x, door_y, door_v, goal_index, direction, start_index)``: the doors'
            coordinates and offsets along their slots, the goal's free-cell index, the
            direction, and the (pre-drawn, see ``PointNavEnv._gen_grid``) start's free-cell
            index.
        """
        values: list[int] = []
        for bound, radices in self.draw_chunks:
            u = int(rng.integers(bound))
            for radix in radices:
                u, v = divmod(u, radix)
                values.append(v)
        door_x: list[int] = []
        door_y: list[int] = []
        for (x0, y0, ax, ay, _), v in zip(self.door_slots, values, strict=False):
            door_x.append(x0 + ax * v)
            door_y.append(y0 + ay * v)
        n_doors = len(door_x)
        goal_index, direction, start_index = values[n_doors : n_doors + 3]
        return door_x, door_y, values[:n_doors], goal_index, direction, start_index

    def layout_key(self, door_v: list[int], episode: tuple[int, ...]) -> int:
        """An episode's layout key for :func:`rl.tasks.splits.split_of`: its doors.

        The doors' offsets as one mixed-radix number, so that splits share no layout. A layout
        without doors (one room) has a single layout, so its episodes (goal, direction, start)
        are split instead.
        """
        key = 0
        for v, (*_, length) in zip(door_v, self.door_slots, strict=True):
            key = key * length + v
        if not self.door_slots:
            key = hash(episode) & 0xFFFFFFFF
        return key

    def split_of(self, door_v: list[int], episode: tuple[int, ...]) -> str:
        """The split an episode belongs to (see :meth:`layout_key`)."""
        return split_of(self.layout_key(door_v, episode))

    def free_cell(self, index: int, door_x: list[int], door_y: list[int]) -> tuple[int, int]:
        """Free cell ``index`` in ``range(n_free)``: interior cells (by room), then doors.

        Args:
            index: The free-cell index.
            door_x: The episode's door x coordinates.
            door_y: The episode's door y coordinates.

        Returns:
            The cell's ``(x, y)``.
        """
        m = len(self.cell_x)
        if index < m:
            return self.cell_x[index], self.cell_y[index]
        return door_x[index - m], door_y[index - m]

    def distance_field(
        self, gx: int, gy: int, door_x: list[int], door_y: list[int], door_v: list[int]
    ) -> np.ndarray:
        """Geodesic (4-connected) distance from ``(gx, gy)`` over free cells; -1 elsewhere.

        Exactly what a breadth-first search gives, computed from the room structure: inside a
        rectangular room the shortest path between two cells (or a cell and a door in the
        room's wall) is their Manhattan distance, and a shortest path to a cell outside the
        goal's room enters that room last through one of its doors. So door distances come
        from a Dijkstra over the doors (edges between doors of a common room), and each
        interior cell takes the minimum over its room's doors of door distance + Manhattan
        distance (or its Manhattan distance to the goal, in the goal's room).

        Args:
            gx: The goal's x.
            gy: The goal's y.
            door_x: The episode's door x coordinates.
            door_y: The episode's door y coordinates.
            door_v: The episode's door offsets along their slots.

        Returns:
            ``(size, size)`` int64 distances.
        """
        h = self.size
        n_doors = len(door_x)
        far = _FAR
        door_dist = [far] * n_doors
        goal_room = self.room_of_flat[gx * h + gy]
        if goal_room >= 0:
            for d in self.room_doors[goal_room]:
                door_dist[d] = abs(door_x[d] - gx) + abs(door_y[d] - gy)
        else:  # the goal is a door
            for d in range(n_doors):
                if door_x[d] == gx and door_y[d] == gy:
                    door_dist[d] = 0
        # Dijkstra over the doors (a handful of nodes: O(n^2) without a heap).
        pending = list(range(n_doors))
        adj = self.door_adj
        while pending:
            u = min(pending, key=door_dist.__getitem__)
            pending.remove(u)
            du, ux, uy = door_dist[u], door_x[u], door_y[u]
            for v in adj[u]:
                dv = du + abs(door_x[v] - ux) + abs(door_y[v] - uy)
                if dv < door_dist[v]:
                    door_dist[v] = dv

        # (slots, cells): Manhattan distance to the slot's door plus the door's distance.
        gathered = np.array([[*door_v, 0], [*door_dist, far]], dtype=np.int64).take(
            self.cell_slots, axis=1
        )
        cell_to_door = gathered[0]
        cell_to_door -= self.slot_along
        np.abs(cell_to_door, out=cell_to_door)
        cell_to_door += self.slot_perp
        cell_to_door += gathered[1]
        cell_dist = cell_to_door.min(axis=0)
        if goal_room >= 0:  # direct Manhattan distance within the goal's room
            lo, hi = self.room_slice[goal_room]
            cx = self.cell_x_np[lo:hi]
            cy = self.cell_y_np[lo:hi]
            cell_dist[lo:hi] = np.abs(cx - gx) + np.abs(cy - gy)

        field = np.full(h * h, -1, dtype=np.int64)
        field[self.cell_flat] = cell_dist
        for x, y, d in zip(door_x, door_y, door_dist, strict=True):
            field[x * h + y] = d
        return field.reshape(h, h)


def build_minigrid_grid(
    width: int, height: int, free: np.ndarray, goal_pos: tuple[int, int]
) -> Grid:
    """The minigrid ``Grid`` of a layout: one shared ``Wall`` on non-free cells, and the ``Goal``.

    Args:
        width: Grid width.
        height: Grid height.
        free: ``(width, height)`` bool, True on free cells.
        goal_pos: The goal's ``(x, y)``; no goal is placed if ``x < 0`` (before any reset).

    Returns:
        The grid.
    """
    grid = Grid(width, height)
    wall = Wall()
    free_list = free.T.ravel().tolist()  # index j * width + i
    grid.grid = [None if f else wall for f in free_list]
    if goal_pos[0] >= 0:
        goal = Goal()
        grid.set(*goal_pos, goal)
        goal.init_pos = goal.cur_pos = goal_pos
    return grid
