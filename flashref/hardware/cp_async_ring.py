"""The order of copies, barriers and arithmetic in versions 5 and 11's ``cp.async`` loops.

Version 5 (``v05_cp_async.cu``) keeps two buffers each of K_j and V_j, version 11
(``v11_three_stage.cu``) three. Both issue the copies of tile ``t`` into buffer
``t % stages``, ``stages - 1`` tiles ahead of the arithmetic: before the loop, the tiles
``0 .. stages - 2`` (one ``cp.async.commit_group`` each); then in iteration ``t`` the copy of
tile ``t + stages - 1``, which runs while the warps compute on tile ``t``. The buffer it
fills is the one tile ``t - 1`` was read from, so every warp must have finished tile
``t - 1`` before the copy is issued: version 5 has a ``__syncthreads()`` at the end of each
iteration for that, besides the one after ``cp.async.wait_group 1`` that makes tile ``t``
visible; version 11 issues its copy after that first barrier, which every warp passes only
once it has finished tile ``t - 1``, and drops the second.

``schedule(stages, n_tiles)`` lists, per iteration (``-1`` for the code before the loop),
what is issued, what is computed and where the barriers are, in program order;
``refills_are_safe(events)`` checks that a barrier separates every buffer's last read from
its refill, and ``in_flight(events)`` gives the copies running during each tile's
arithmetic. ``flashref.hardware.kernel_figures.draw_cp_async_ring`` draws the timeline.
Pure Python.
"""

from __future__ import annotations

from typing import NamedTuple

# the barriers of each version's loop body, in program order around the copy it issues
ORDERS = {
    2: ("issue", "wait", "barrier", "compute", "barrier"),  # version 5
    3: ("wait", "barrier", "issue", "compute"),  # version 11
}


class Event(NamedTuple):
    step: int  # loop iteration; -1 before the loop
    what: str  # "issue" (a copy starts), "wait", "barrier", "compute"
    tile: int | None  # the tile copied or computed on (None for a wait or barrier)
    buffer: int | None  # its buffer


def _positive(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def schedule(stages: int, n_tiles: int, order: tuple[str, ...] | None = None) -> list[Event]:
    """The events of one block's key-tile loop, in program order.

    ``stages``: 2 (version 5) or 3 (version 11); ``order`` the loop body (default
    ``ORDERS[stages]``), given to try another placement of the barriers.
    """
    _positive("n_tiles", n_tiles, 1)
    if order is None:
        if stages not in ORDERS:
            raise ValueError(f"stages must be one of {sorted(ORDERS)}, got {stages!r}")
        order = ORDERS[stages]
    _positive("stages", stages, 2)
    if sorted(set(order) - {"barrier"}) != ["compute", "issue", "wait"]:
        raise ValueError(f"order must hold issue, wait and compute once each, got {order!r}")
    ahead = stages - 1
    events = [Event(-1, "issue", t, t % stages) for t in range(min(ahead, n_tiles))]
    for t in range(n_tiles):
        for what in order:
            if what == "issue":
                if t + ahead < n_tiles:
                    events.append(Event(t, "issue", t + ahead, (t + ahead) % stages))
            elif what == "compute":
                events.append(Event(t, "compute", t, t % stages))
            else:
                events.append(Event(t, what, None, None))
    return events


def refills_are_safe(events: list[Event]) -> bool:
    """True if a barrier lies between every buffer's last read and the copy that refills it."""
    last_read: dict[int, int] = {}  # buffer -> index of the compute that last read it
    last_barrier = -1
    for i, e in enumerate(events):
        if e.what == "barrier":
            last_barrier = i
        elif e.what == "compute":
            last_read[e.buffer] = i
        elif e.what == "issue" and last_read.get(e.buffer, -1) > last_barrier:
            return False
    return True


def in_flight(events: list[Event]) -> dict[int, list[int]]:
    """tile -> the tiles whose copies run while it is computed (issued, not yet computed)."""
    issued: list[int] = []
    out = {}
    for e in events:
        if e.what == "issue":
            issued.append(e.tile)
        elif e.what == "compute":
            out[e.tile] = [t for t in issued if t > e.tile]
    return out


def barriers_per_tile(events: list[Event]) -> int:
    """The ``__syncthreads()`` of one loop iteration (of the first)."""
    return sum(e.what == "barrier" and e.step == 0 for e in events)
