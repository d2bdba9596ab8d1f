"""Version 28's block, modelled step by step on the CPU: three consumer warpgroups without turns.

``flashref/kernels/hopper/v28_persistent3.cu`` is version 24 (three consumer warpgroups of 64 rows,
Br = 192, the next S issued during this softmax, no ping-pong) made persistent as version 27 is:
a block walks a list of work tiles, its producer runs on into the next one with one running
count of K/V tiles, and one Q buffer of 192 rows is refilled once every consumer thread has
arrived on q_empty. What differs from version 27's model (``flashref.hardware.pingpong``) is what
the consumers do: no turns, a third warpgroup, and a warpgroup whose rows all lie past Nq (the
last query block of a ragged Nq) has no tile of its own (n_mine = 0), so it frees Q as soon as Q
has landed and only waits for and releases the K/V tiles.

``block_consumer3(cw, tiles)``: warpgroup cw's operations over ``tiles``, a list of
``(n_tiles, (n_mine of warpgroup 0, 1, 2))`` as ``flashref.hardware.work_tiles.block_tiles`` gives
them with ``Br=192, idle_past_nq=True``; the operations are version 27's model's without
``sync`` and ``arrive``. ``run_blocks3(tiles, stages)``: the three warpgroups and the producer
(pingpong's scheduler) until all finish; raises ``pingpong.ScheduleError`` on a deadlock or a
barrier out of balance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from .._checks import check_block
from .pingpong import Event, producer_loads, run_schedule

NWG = 3  # consumer warpgroups of version 28
Tiles3 = list[tuple[int, tuple[int, int, int]]]  # (n_tiles, (n_mine of warpgroup 0, 1, 2)) each


def _tiles3(tiles) -> Tiles3:
    if not isinstance(tiles, list) or not tiles:
        raise ValueError(
            f"tiles must be a non-empty list of (n_tiles, (n0, n1, n2)), got {tiles!r}"
        )
    out = []
    for i, item in enumerate(tiles):
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[1], tuple)
            and len(item[1]) == NWG
        ):
            raise ValueError(f"tiles[{i}] must be (n_tiles, (n0, n1, n2)), got {item!r}")
        n_tiles = check_block(item[0], f"tiles[{i}] n_tiles", 1)
        split = tuple(
            check_block(n, f"tiles[{i}] n_mine[{cw}]", 0, n_tiles) for cw, n in enumerate(item[1])
        )
        out.append((n_tiles, split))
    return out


def block_consumer3(cw: int, tiles: Tiles3) -> Iterator[tuple]:
    """Version 28's consumer warpgroup cw over a block's work tiles, in the kernel's order."""
    cw = check_block(cw, "cw", 0, NWG - 1)
    return _block_consumer3(cw, _tiles3(tiles))


def _block_consumer3(cw: int, tiles: Tiles3) -> Iterator[tuple]:
    kv = 0  # the block's running count of K/V tiles
    for n, (n_tiles, split) in enumerate(tiles):
        n_mine = split[cw]
        yield ("wait_q", n)  # every warpgroup waits for Q (qbar's phases stay in step)
        if n_mine == 0:
            yield ("free_q", n)  # no S of this warpgroup reads this Q
        else:
            yield ("wait_full", kv)
            yield ("gemm", kv, None)  # S_0 alone
            if n_mine == 1:
                yield ("free_q", n)
            yield ("softmax", kv)
            for it in range(1, n_mine):  # S_it and O += P_{it-1} V_{it-1}
                yield ("wait_full", kv + it)
                yield ("gemm", kv + it, kv + it - 1)
                if it + 1 == n_mine:
                    yield ("free_q", n)
                yield ("softmax", kv + it)
                yield ("release", kv + it - 1)
            yield ("gemm", None, kv + n_mine - 1)  # the last O += P V
            yield ("release", kv + n_mine - 1)
        for it in range(n_mine, n_tiles):  # the tiles it does not use
            yield ("wait_full", kv + it)
            yield ("release", kv + it)
        kv += n_tiles


def run_blocks3(
    tiles: Tiles3,
    stages: int,
    program: Callable[[int, Tiles3], Iterable[tuple]] = block_consumer3,
) -> list[Event]:
    """Version 28's block over ``tiles``: the three warpgroups and the producer (per work tile:
    wait for every warpgroup's free_q of the one before, load Q, then its K/V tiles into the
    ring of ``stages``) until all finish; returns the events in order."""
    tiles = _tiles3(tiles)
    stages = check_block(stages, "stages", 1)
    progs = [iter(program(cw, tiles)) for cw in range(NWG)]
    return run_schedule(progs, producer_loads(tiles), stages, f"work tiles {tiles}")
