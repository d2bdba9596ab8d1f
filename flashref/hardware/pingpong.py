"""Version 23's ping-pong schedule, modelled step by step on the CPU.

The two consumer warpgroups of ``flashref/kernels/hopper/v23_pingpong.cu`` take turns at the tensor
cores on two named barriers, beside the producer's ring of full/empty mbarriers. A wrong count
of turns hangs the kernel (or leaves an arrival pending at exit), and with Br = Bc = 128 the
case that the kernel's header reasons about, one warpgroup with fewer tiles than the other
(causal), never happens on the GPU. This model runs each warpgroup's sequence of operations
as the kernel's consumer code issues them, for any tile count and split.

``consumer(cw, n_tiles, n_mine)``: warpgroup cw's operations, in the kernel's order:
``("wait_full", j)`` (tile j has landed), ``("sync", cw)`` (bar.sync: wait for its turn),
``("gemm", j, k)`` (S_j = Q K_j^T and O += P_k V_k issued; None where the turn has no such
product), ``("arrive", b)`` (bar.arrive on warpgroup b's barrier: the turn handed on),
``("softmax", j)`` and ``("release", j)`` (the stage of tile j is free).
``without_turns(program)``: the same operations with the turns left out, which is version
21's consumer code (version 23's text less its turn lines; a test compares the two sources).
``run(n_tiles, n_mine, stages, program)``: both warpgroups and the producer in steps until
all finish; returns the events in order. Each step, every warpgroup that can go on does one
operation, so a step is a place in the order of events, not a length of time.

Version 27 (``flashref/kernels/hopper/v27_persistent.cu``) runs the same turns over a list of work
tiles per block, without stopping between them: ``block_consumer(cw, tiles)`` is its consumer
code for ``tiles``, a list of ``(n_tiles, (n_mine of warpgroup 0, of 1))``; K/V tiles are
numbered by the block's running count, and two operations guard the one Q buffer:
``("wait_q", n)`` (Q of work tile n has landed) and ``("free_q", n)`` (this warpgroup's last
S of work tile n is done; the producer waits for both before loading the next Q).
``run_blocks(tiles, stages)`` runs both warpgroups and that producer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from .._checks import check_block

Program = Callable[[int, int, int], Iterable[tuple]]
TURN_OPS = ("sync", "arrive")


class ScheduleError(RuntimeError):
    """The schedule deadlocks or ends with a barrier out of balance."""


class Event(NamedTuple):
    step: int  # the scheduler's sweep in which it happened
    who: int | str  # consumer warpgroup 0 or 1, or "producer"
    op: tuple  # one of consumer()'s operations, or the producer's ("load", j)


def consumer(cw: int, n_tiles: int, n_mine: int) -> Iterator[tuple]:
    """The operations of consumer warpgroup cw, in the kernel's order: tiles 0 .. n_mine - 1
    are its own, the rest (causal) lie past its last row."""
    cw = check_block(cw, "cw", 0, 1)
    n_tiles = check_block(n_tiles, "n_tiles", 1)
    n_mine = check_block(n_mine, "n_mine", 1, n_tiles)
    return _consumer(cw, n_tiles, n_mine)


def _consumer(cw: int, n_tiles: int, n_mine: int) -> Iterator[tuple]:
    n_turns = n_tiles + 1

    def turn_end(turn):
        if cw == 0 or turn + 1 < n_turns:
            yield ("arrive", 1 - cw)

    if cw == 1:
        yield ("arrive", 0)
    yield ("wait_full", 0)
    yield ("sync", cw)  # turn 0: S_0 alone
    yield ("gemm", 0, None)
    yield from turn_end(0)
    yield ("softmax", 0)
    for it in range(1, n_mine):  # turn it: S_it and O += P_{it-1} V_{it-1}
        yield ("wait_full", it)
        yield ("sync", cw)
        yield ("gemm", it, it - 1)
        yield from turn_end(it)
        yield ("softmax", it)
        yield ("release", it - 1)
    yield ("sync", cw)  # turn n_mine: the last O += P V alone
    yield ("gemm", None, n_mine - 1)
    yield from turn_end(n_mine)
    yield ("release", n_mine - 1)
    for it in range(n_mine, n_tiles):  # empty turns, passed on to keep the turns in step
        yield ("wait_full", it)
        yield ("sync", cw)
        yield from turn_end(it + 1)
        yield ("release", it)


def without_turns(program: Program = consumer) -> Program:
    """``program`` with its bar.sync and bar.arrive left out: version 21's consumers."""

    def free(cw: int, n_tiles: int, n_mine: int) -> Iterator[tuple]:
        return (op for op in program(cw, n_tiles, n_mine) if op[0] not in TURN_OPS)

    return free


def run(
    n_tiles: int,
    n_mine: tuple[int, int],
    stages: int,
    program: Program = consumer,
) -> list[Event]:
    """Runs both warpgroups and the producer until all finish; returns the events in order.
    Raises ScheduleError on a deadlock or a barrier left with arrivals pending at exit."""
    n_tiles = check_block(n_tiles, "n_tiles", 1)
    n_mine = _split(n_mine, n_tiles, "n_mine")
    stages = check_block(stages, "stages", 1)
    progs = [iter(program(cw, n_tiles, n_mine[cw])) for cw in (0, 1)]
    return run_schedule(
        progs, [("load", j) for j in range(n_tiles)], stages, f"n_tiles {n_tiles}, n_mine {n_mine}"
    )


def _split(n_mine, n_tiles: int, name: str) -> tuple[int, int]:
    if not isinstance(n_mine, tuple) or len(n_mine) != 2:
        raise ValueError(f"{name} must be a pair (tiles of warpgroup 0, of 1), got {n_mine!r}")
    return tuple(check_block(n, f"{name}[{cw}]", 1, n_tiles) for cw, n in enumerate(n_mine))


def run_schedule(progs: list, loads: list[tuple], stages: int, what: str) -> list[Event]:
    """The consumer programs beside a producer issuing ``loads`` in order: ("load", j) once
    K/V tile j - stages is released by every warpgroup, ("load_q", n) once all have freed
    Q of work tile n - 1."""
    pending = [next(p, None) for p in progs]
    count = [0, 0]  # warpgroups arrived at named barrier b in its current generation
    members: list[set] = [set(), set()]  # which ones
    gen = [0, 0]  # completed generations of barrier b
    waiting = [None] * len(progs)  # (barrier, generation) a warpgroup's bar.sync waits for
    released = [set() for _ in progs]  # K/V tiles each warpgroup has released
    freed = [set() for _ in progs]  # work tiles whose Q each warpgroup has freed
    filled, q_loaded, done = 0, 0, 0  # K/V tiles and Qs loaded, producer operations done
    n_kv = sum(op[0] == "load" for op in loads)
    n_q = len(loads) - n_kv

    def can_load(op) -> bool:
        if op[0] == "load_q":
            return op[1] == 0 or all(op[1] - 1 in f for f in freed)
        return op[1] < stages or all(op[1] - stages in r for r in released)

    events: list[Event] = []
    step = 0
    while any(op is not None for op in pending) or done < len(loads):
        moved = False
        while done < len(loads) and can_load(loads[done]):
            events.append(Event(step, "producer", loads[done]))
            if loads[done][0] == "load":
                filled += 1
            else:
                q_loaded += 1
            done, moved = done + 1, True
        for cw in range(len(progs)):  # two warpgroups (three in version 28, without turns)
            op = pending[cw]
            if op is None:
                continue
            if waiting[cw] is not None:  # inside bar.sync
                b, g = waiting[cw]
                if gen[b] <= g:
                    continue
                waiting[cw] = None  # the turn begins
            elif op[0] == "wait_full":
                if op[1] >= filled:
                    continue
            elif op[0] == "wait_q":
                if op[1] >= q_loaded:
                    continue
            elif op[0] in TURN_OPS:
                b = op[1]
                if cw in members[b]:
                    raise ScheduleError(f"warpgroup {cw} arrived twice at barrier {b}")
                count[b] += 1
                members[b].add(cw)
                if op[0] == "sync":
                    waiting[cw] = (b, gen[b])
                if count[b] == 2:
                    count[b], gen[b], members[b] = 0, gen[b] + 1, set()
                if op[0] == "sync":
                    moved = True
                    continue  # the warpgroup passes when the generation completes
            elif op[0] == "release":
                released[cw].add(op[1])
            elif op[0] == "free_q":
                if op[1] in freed[cw]:
                    raise ScheduleError(f"warpgroup {cw} freed Q of work tile {op[1]} twice")
                freed[cw].add(op[1])
            events.append(Event(step, cw, op))
            pending[cw] = next(progs[cw], None)
            moved = True
        if not moved:
            raise ScheduleError(f"deadlock: {what}, waiting at {pending}")
        step += 1
    if count != [0, 0]:
        raise ScheduleError(f"arrivals left pending at exit: {count}")
    if filled != n_kv or any(r != set(range(n_kv)) for r in released):
        raise ScheduleError(f"tiles loaded {filled} of {n_kv}, released {released}")
    if n_q and any(f != set(range(n_q)) for f in freed):
        raise ScheduleError(f"Q of {n_q} work tiles, freed {freed}")
    return events


WorkTiles = list[tuple[int, tuple[int, int]]]  # (n_tiles, (n_mine of warpgroup 0, of 1)) each


def _work_tiles(tiles) -> WorkTiles:
    if not isinstance(tiles, list) or not tiles:
        raise ValueError(f"tiles must be a non-empty list of (n_tiles, (n0, n1)), got {tiles!r}")
    out = []
    for i, item in enumerate(tiles):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValueError(f"tiles[{i}] must be (n_tiles, (n0, n1)), got {item!r}")
        n_tiles = check_block(item[0], f"tiles[{i}] n_tiles", 1)
        out.append((n_tiles, _split(item[1], n_tiles, f"tiles[{i}] n_mine")))
    return out


def block_consumer(cw: int, tiles: WorkTiles) -> Iterator[tuple]:
    """Version 27's consumer warpgroup cw over a block's work tiles, in the kernel's order."""
    cw = check_block(cw, "cw", 0, 1)
    return _block_consumer(cw, _work_tiles(tiles))


def _block_consumer(cw: int, tiles: WorkTiles) -> Iterator[tuple]:
    if cw == 1:
        yield ("arrive", 0)
    kv = 0  # the block's running count of K/V tiles
    for n, (n_tiles, split) in enumerate(tiles):
        n_mine, n_turns, more = split[cw], n_tiles + 1, n + 1 < len(tiles)

        def turn_end(turn, more=more, n_turns=n_turns):
            if cw == 0 or more or turn + 1 < n_turns:
                yield ("arrive", 1 - cw)

        yield ("wait_q", n)
        yield ("wait_full", kv)
        yield ("sync", cw)  # turn 0: S_0 alone
        yield ("gemm", kv, None)
        yield from turn_end(0)
        if n_mine == 1:
            yield ("free_q", n)
        yield ("softmax", kv)
        for it in range(1, n_mine):
            yield ("wait_full", kv + it)
            yield ("sync", cw)
            yield ("gemm", kv + it, kv + it - 1)
            yield from turn_end(it)
            if it + 1 == n_mine:
                yield ("free_q", n)
            yield ("softmax", kv + it)
            yield ("release", kv + it - 1)
        yield ("sync", cw)  # turn n_mine: the last O += P V alone
        yield ("gemm", None, kv + n_mine - 1)
        yield from turn_end(n_mine)
        yield ("release", kv + n_mine - 1)
        for it in range(n_mine, n_tiles):  # empty turns
            yield ("wait_full", kv + it)
            yield ("sync", cw)
            yield from turn_end(it + 1)
            yield ("release", kv + it)
        kv += n_tiles


def run_blocks(
    tiles: WorkTiles,
    stages: int,
    program: Callable[[int, WorkTiles], Iterable[tuple]] = block_consumer,
) -> list[Event]:
    """Version 27's block over ``tiles``: both warpgroups and the producer (per work tile: wait
    for both warpgroups' free_q of the one before, load Q, then its K/V tiles into the ring)
    until all finish. Raises ScheduleError on a deadlock or a barrier out of balance at exit."""
    tiles = _work_tiles(tiles)
    stages = check_block(stages, "stages", 1)
    progs = [iter(program(cw, tiles)) for cw in (0, 1)]
    return run_schedule(progs, producer_loads(tiles), stages, f"work tiles {tiles}")


def producer_loads(tiles) -> list[tuple]:
    """A persistent block's producer, in order: per work tile ``(n_tiles, split)``, its Q
    (after the previous tile's free_q), then its K/V tiles numbered by the running count."""
    loads, kv = [], 0
    for n, (n_tiles, _) in enumerate(tiles):
        loads.append(("load_q", n))
        loads += [("load", kv + j) for j in range(n_tiles)]
        kv += n_tiles
    return loads


def turns(events: list[Event]) -> list[int]:
    """The order in which the warpgroups' turns began (their bar.sync passed)."""
    return [e.who for e in events if e.op[0] == "sync"]


def alternate_everywhere(max_tiles: int = 12, stages: tuple[int, ...] = (2, 3)) -> bool:
    """Whether the turns go 0, 1, 0, 1, ... (n_tiles + 1 each) for every tile count up to
    ``max_tiles``, every causal split (warpgroup 1 has as many tiles as warpgroup 0 or more)
    and every number of stages; any deadlock or unbalanced barrier raises ScheduleError."""
    max_tiles = check_block(max_tiles, "max_tiles", 1)
    ok = True
    for n_tiles in range(1, max_tiles + 1):
        for n0 in range(1, n_tiles + 1):
            for n1 in range(n0, n_tiles + 1):
                for st in stages:
                    ok &= turns(run(n_tiles, (n0, n1), st)) == [0, 1] * (n_tiles + 1)
    return ok
