"""Version 28's persistent block (three consumer warpgroups, Br = 192, no turns), as
flashref.hardware.persistent3 models it on the CPU, and its work tiles from
flashref.hardware.work_tiles.

Where version 28 differs from version 27's model (tests/gpu/test_pingpong_model.py): three
warpgroups' causal splits of a 192-row query block, warpgroups with no tile of their own (rows
past Nq), all three freeing Q before the next one is loaded, and no turns. Version 30 keeps
version 28's schedule: the checks that the model follows the kernel run on its text too.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from flashref.gpu.forward_versions import VERSIONS
from flashref.hardware import persistent3 as p3
from flashref.hardware import work_tiles as wt
from flashref.hardware.pingpong import ScheduleError

BR = VERSIONS[28].Br  # 192


def _tiles28(b, grid, Nq, Nk, BH, causal):
    return wt.block_tiles(b, grid, Nq, Nk, BH, causal, d=64, Br=BR, Bc=128, idle_past_nq=True)


def test_v28_splits_of_a_192_row_query_block():
    """n_mine per warpgroup (rows 0-63, 64-127, 128-191 of the block), 0 for rows past Nq."""
    # Nq = Nk = 1000, causal, one block: q blocks 5 (rows 960..: warpgroups 1 and 2 past Nq) to 0
    tiles = _tiles28(0, 1, 1000, 1000, 1, True)
    assert tiles[0] == (8, (8, 0, 0)) and tiles[-1] == (2, (1, 1, 2))
    assert [n for n, _ in tiles] == [8, 8, 6, 5, 3, 2]  # ceil(min(Nk, q0 + 192) / 128)
    assert tiles[2] == (6, (5, 6, 6))  # q0 = 576: rows 576..639 see keys up to tile 4
    assert _tiles28(0, 1, 1, 1, 1, True) == [(1, (1, 0, 0))]
    assert _tiles28(0, 1, 17, 4097, 1, False) == [(33, (33, 0, 0))]
    last = _tiles28(0, 1, 4097, 4097, 1, False)[-1]  # q0 = 4032: rows 4096.. are warpgroup 1's
    assert last == (33, (33, 33, 0))
    # without idle_past_nq (version 27's rule) the same block computes every warpgroup's rows
    assert wt.block_tiles(0, 1, 17, 4097, 1, False, d=64, Br=BR)[0] == (33, (33, 33, 33))
    assert wt.block_tiles(0, 1, 1000, 1000, 1, True)[0][1] == (8, 8)  # version 27: a pair


SHAPES = [
    (1, 1),
    (17, 17),
    (1000, 1000),
    (4097, 4097),
    (1000, 4097),
    (4097, 1000),
    (1000, 130),
    (17, 4097),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", SHAPES)
def test_v28_every_block_schedule_runs(Nq, Nk, causal):
    """Every block of version 28's grid (one work tile each, 3 blocks, 1 block) runs its whole
    schedule to the end with 2 and 3 stages: no deadlock, every barrier balanced, every Q freed
    by all three warpgroups before the next is loaded, and no turns taken."""
    BH = 3
    Tr = -(-Nq // BR)
    for grid in sorted({Tr * BH, 3, 1}):
        for b in range(grid):
            tiles = _tiles28(b, grid, Nq, Nk, BH, causal)
            for stages in (2, 3):
                events = p3.run_blocks3(tiles, stages)
                assert not any(e.op[0] in ("sync", "arrive") for e in events)
                where = {(e.who, e.op): i for i, e in enumerate(events)}
                for n in range(1, len(tiles)):
                    load = where[("producer", ("load_q", n))]
                    assert load > max(where[(cw, ("free_q", n - 1))] for cw in range(3))
                    assert all(where[(cw, ("wait_q", n))] > load for cw in range(3))


def _random_tiles3(rng, n_items):
    """Causal-like splits: later warpgroups' rows come later (as many tiles or more), and rows
    past Nq (n_mine = 0) only in the last warpgroups, warpgroup 0 always has a row."""
    tiles = []
    for _ in range(n_items):
        n = int(rng.integers(1, 6))
        split = sorted(int(x) for x in rng.integers(1, n + 1, size=3))
        idle = int(rng.integers(0, 3))  # how many of the last warpgroups lie past Nq
        tiles.append((n, tuple(split[: 3 - idle] + [0] * idle)))
    return tiles


@pytest.mark.parametrize("seed", range(12))
def test_v28_random_work_tile_lists(seed):
    rng = np.random.default_rng(seed)
    tiles = _random_tiles3(rng, int(rng.integers(1, 7)))
    if any(max(s) >= 2 for _, s in tiles):  # the skewed loop waits for tile it before it
        with pytest.raises(ScheduleError, match="deadlock"):  # releases it - 1: one stage hangs
            p3.run_blocks3(tiles, 1)
    for stages in (2, 3):
        events = p3.run_blocks3(tiles, stages)
        kv = sum(n for n, _ in tiles)
        assert sum(e.op[0] == "load" for e in events) == kv, (tiles, stages)
        for cw in range(3):
            mine = [op for who, op in ((e.who, e.op) for e in events) if who == cw]
            assert sum(op[0] == "release" for op in mine) == kv
            assert sum(op[0] == "free_q" for op in mine) == len(tiles)
            gemms = sum(op[0] == "gemm" for op in mine)
            assert gemms == sum(s[cw] + 1 for _, s in tiles if s[cw]), (tiles, cw)


def test_v28_producer_runs_into_the_next_work_tile():
    """With warpgroups 1 and 2 idle on the first work tile, the next Q and its first K/V tile
    are loaded before warpgroup 0's last O += P V of the first one is issued."""
    events = p3.run_blocks3([(4, (4, 0, 0)), (4, (4, 4, 4))], 3)
    where = {(e.who, e.op): i for i, e in enumerate(events)}
    last_pv = where[(0, ("gemm", None, 3))]
    assert where[("producer", ("load_q", 1))] < last_pv
    assert where[("producer", ("load", 4))] < last_pv


def test_v28_model_catches_mistakes():
    tiles = [(3, (2, 3, 0)), (2, (1, 2, 2)), (1, (1, 0, 0))]

    def idle_keeps_q(cw, tiles):  # a warpgroup with no tile of its own never frees Q
        n_idle = [n for n, (_, s) in enumerate(tiles) if s[cw] == 0]
        return [
            op
            for op in p3.block_consumer3(cw, tiles)
            if not (op[0] == "free_q" and op[1] in n_idle)
        ]

    with pytest.raises(ScheduleError, match="deadlock"):
        p3.run_blocks3(tiles, 3, program=idle_keeps_q)

    def free_after_every_s(cw, tiles):  # Q freed after each S, not only after the last one
        out, n = [], -1
        for op in p3.block_consumer3(cw, tiles):
            n += op[0] == "wait_q"
            if op[0] == "free_q" and tiles[n][1][cw]:
                continue  # replaced by one after every S below
            out.append(op)
            if op[0] == "gemm" and op[1] is not None:
                out.append(("free_q", n))
        return out

    with pytest.raises(ScheduleError, match="freed Q of work tile 0 twice"):
        p3.run_blocks3(tiles, 3, program=free_after_every_s)

    def idle_skips_tiles(cw, tiles):  # idle warpgroup 2 does not release work tile 0's K/V
        ops = list(p3.block_consumer3(cw, tiles))
        return [op for op in ops if not (cw == 2 and op[0] == "release" and op[1] < 3)]

    with pytest.raises(ScheduleError, match="deadlock"):
        p3.run_blocks3(tiles, 2, program=idle_skips_tiles)


def test_v28_block_tiles_balanced():
    """Version 27's order with Tr = ceil(Nq / 192): every work tile once, and the blocks' work
    (key tiles + 1 per work tile) within two of the longest work tiles of each other."""
    for Nq, BH in [(1024, 512), (4096, 128), (16384, 32), (1000, 7), (17, 3)]:
        for causal in (False, True):
            if causal and (Nq, BH) == (4096, 128):
                continue  # below: the one shape whose sections hold a multiple of the grid
            Tr, G = -(-Nq // BR), wt.section_heads(Nq, 64, BH)
            order = [wt.work_tile(i, Tr, BH, causal, G) for i in range(Tr * BH)]
            assert sorted(order) == [(qb, bh) for qb in range(Tr) for bh in range(BH)]
            grid = VERSIONS[28].grid(Nq, BH, 132)[0]
            work = [
                sum(n + 1 for n, _ in _tiles28(b, grid, Nq, Nq, BH, causal)) for b in range(grid)
            ]
            n_max = -(-Nq // 128)
            assert max(work) - min(work) <= 2 * (n_max + 1), (Nq, BH, causal, work)
    # B*H = 128 heads at Nq = 4096, d = 64, causal: sections of 30 heads x 22 levels = 660 =
    # 5 x 132 work tiles, so block b takes the same places of every section (block 0 the
    # longest ones of each) and the spread grows with the number of sections: version 27's
    # order, kept, leaves version 28's blocks here further apart than two work tiles
    assert wt.section_heads(4096, 64, 128) * -(-4096 // BR) % 132 == 0
    work = [sum(n + 1 for n, _ in _tiles28(b, 132, 4096, 4096, 128, True)) for b in range(132)]
    assert max(work) - min(work) > 2 * (32 + 1) and sum(work) / 132 / max(work) > 0.8


@pytest.mark.parametrize("number", [28, 30])
def test_v28_model_follows_the_kernel(number):
    """The model's Q operations, idle rule and running count are the kernel's (version 30
    keeps version 28's schedule)."""
    own = VERSIONS[number].path.read_text()
    text = VERSIONS[number].source()  # its headers pasted in (work_tile, ring_next)
    assert "#define NWG 3" in text and "#define Bc 128" in text and "#define KV_STAGES 3" in text
    assert "mbar_init(q_empty, NCONSUMERS);" in text and "#define NCONSUMERS (NWG * 128)" in text
    assert text.count("mbar_arrive(q_empty);") == 3
    assert "if (n_mine == 0) mbar_arrive(q_empty);" in text
    assert "if (n_mine == 1) mbar_arrive(q_empty);" in text
    assert "if (it + 1 == n_mine) mbar_arrive(q_empty);" in text
    assert "mbar_wait(qbar, n & 1);" in text  # version 30's producer sleeps in its waits:
    assert re.search(r"mbar_wait(_suspend)?\(q_empty, \(n - 1\) & 1[,)]", text)
    assert "const int n_mine = q0 + cw * 64 >= Nq ? 0" in text
    assert "causal ? min(n_tiles, (q0 + cw * 64 + 63) / Bc + 1) : n_tiles;" in text
    assert "named_bar" not in own and "turn_" not in own  # no ping-pong
    consumer_code = text.split("setmaxnreg_inc<CONSUMER_REGS>")[1].split("// finish:")[0]
    if number == 28:  # the K/V stage and parity from the block's running count, not the tile's
        assert "(kv + it) % KV_STAGES" in consumer_code and " it % KV_STAGES" not in consumer_code
    else:  # version 30: (st, ph) carried over the block's work tiles, one ring_next per tile
        code = "\n".join(line.split("//")[0] for line in text.splitlines())  # no comments
        assert "% KV_STAGES" not in code and "/ KV_STAGES" not in code
        # S_0, the loop, the tiles it does not use (all of them for an idle warpgroup)
        assert consumer_code.count("ring_next(st, ph);") == 3
        idle = consumer_code.split("for (int it = n_mine; it < n_tiles; it++) {")[1]
        assert "ring_next(st, ph);" in idle.split("\n        }\n")[0]
        assert "int st = 0;" in consumer_code.split("for (int item")[0]  # once per block
        producer_code = text.split("setmaxnreg_dec<PRODUCER_REGS>")[1].split("return;")[0]
        assert producer_code.count("ring_next(st, ph);") == 1
        assert "int st = 0;" in producer_code.split("for (int item")[0]
    # work_tile() is version 27's: both take it from one header
    for v in (27, number):
        assert '#include "tile_scheduler.cuh"' in VERSIONS[v].path.read_text()
    assert "L2_KV_BYTES / ((long long)Nk * D * 4)" in text


def test_v28_bad_work_tiles_are_refused_before_any_step():
    with pytest.raises(ValueError, match=r"tiles must be a non-empty list"):
        p3.run_blocks3([], 3)
    with pytest.raises(ValueError, match=r"tiles\[0\] must be \(n_tiles, \(n0, n1, n2\)\)"):
        p3.run_blocks3([(2, (2, 2))], 3)
    with pytest.raises(ValueError, match=r"tiles\[0\] n_mine\[2\] must be in 0\.\.2, got 3"):
        p3.block_consumer3(0, [(2, (2, 2, 3))])
    with pytest.raises(ValueError, match=r"cw must be in 0\.\.2, got 3"):
        p3.block_consumer3(3, [(2, (2, 2, 2))])
    with pytest.raises(ValueError, match=r"stages must be >= 1, got 0"):
        p3.run_blocks3([(2, (2, 2, 2))], 0)
    with pytest.raises(ValueError, match=r"Br must be a multiple of 64 \(64 rows per warpgroup\)"):
        wt.block_tiles(0, 1, 200, 200, 3, False, Br=100)
