"""Version 23's ping-pong schedule, as flashref.hardware.pingpong models it on the CPU.

The model runs each consumer warpgroup's barrier operations as the kernel's consumer code
issues them, beside the producer's ring, for every tile count and causal split (also the
unequal splits that Br = Bc = 128 never produces on the GPU), and these tests check that
nothing waits forever, the turns alternate 0, 1, 0, 1, ... and every barrier ends balanced,
and that the model's operations are the kernel's.
"""

from __future__ import annotations

import re

import pytest

from flashref.gpu.forward_versions import VERSIONS
from flashref.hardware import pingpong as pp
from flashref.hardware import work_tiles as wt
from flashref.hardware.pingpong import ScheduleError, consumer, run, turns

TURN_LINE = re.compile(r"turn_begin\(cw\);|turn_end\(cw, |n_turns = |named_bar_arrive\(PINGPONG")


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 5])
def test_turns_alternate_and_end_balanced(n_tiles, stages):
    for n0 in range(1, n_tiles + 1):
        for n1 in range(n0, n_tiles + 1):  # warpgroup 1's rows come later: as many tiles or more
            order = turns(run(n_tiles, (n0, n1), stages))
            assert order == [0, 1] * (n_tiles + 1), (n_tiles, n0, n1, order)


def test_alternate_everywhere_is_what_the_chapter_prints():
    assert pp.alternate_everywhere(6)
    with pytest.raises(ScheduleError, match="deadlock"):  # one stage: a turn waits for a tile
        pp.alternate_everywhere(3, stages=(1,))  # that only a later release would free


def _consumer_code(version):
    text = VERSIONS[version].path.read_text()
    return text.split("setmaxnreg_inc<CONSUMER_REGS>")[1].split("// finish:")[0]


def test_model_follows_the_kernel():
    """The model's turn count and its one skipped hand-over are the kernel's."""
    text = VERSIONS[23].path.read_text()
    assert "const int n_turns = n_tiles + 1;" in text
    assert re.search(r"if \(cw == 0 \|\| turn \+ 1 < n_turns\) named_bar_arrive", text)
    assert "if (cw == 1) named_bar_arrive(PINGPONG_BAR, NCONSUMERS);" in text
    consumer_code = _consumer_code(23)
    # turn 0, the skewed loop, the last O += P V and the skipped tiles: four turns in the code
    assert consumer_code.count("turn_begin(cw);") == 4
    assert consumer_code.count("turn_end(cw, ") == 4
    # products in three of them (S alone, S and P V, P V alone), a softmax after two
    assert consumer_code.count("qk_issue(") == 2 and consumer_code.count("pv_issue(") == 2
    assert consumer_code.count("softmax_tile(") == 2
    ops = [op[0] for op in consumer(0, 3, 2)]
    assert ops.count("sync") == 4 and ops.count("gemm") == 3 and ops.count("softmax") == 2


def test_version_21_is_version_23_without_its_turn_lines():
    """without_turns() models version 21: its consumer code is version 23's, line for line,
    less the lines that take and hand on the turns."""
    v23 = [ln for ln in _consumer_code(23).splitlines() if not TURN_LINE.search(ln)]
    v21 = _consumer_code(21).splitlines()
    assert [ln for ln in v23 if ln.strip()] == [ln for ln in v21 if ln.strip()]
    free = list(pp.without_turns()(1, 4, 2))
    assert free == [op for op in consumer(1, 4, 2) if op[0] not in ("sync", "arrive")]


def test_turns_keep_the_warpgroups_from_issuing_together():
    """Version 21's model issues both warpgroups' products in the same step, each time;
    version 23's never does, and between its turns a warpgroup computes the softmax of the
    S it issued while the other takes its turn."""

    def gemm_steps(events, cw):
        return [e.step for e in events if e.who == cw and e.op[0] == "gemm"]

    for n_tiles in (1, 2, 5):
        free = run(n_tiles, (n_tiles, n_tiles), 2, program=pp.without_turns())
        assert gemm_steps(free, 0) == gemm_steps(free, 1)
        events = run(n_tiles, (n_tiles, n_tiles), 2)
        assert not set(gemm_steps(events, 0)) & set(gemm_steps(events, 1))
        order = [(e.who, e.op[0]) for e in events if e.op[0] in ("sync", "softmax")]
        for cw in (0, 1):  # turn, softmax, turn, softmax, ..., turn: the other's turn between
            mine = [i for i, (who, _) in enumerate(order) if who == cw]
            assert [order[i][1] for i in mine] == ["sync", "softmax"] * n_tiles + ["sync"]
            for a, b in zip(mine, mine[1:], strict=False):
                if order[a][1] == "sync":  # from this turn to the next one of its own
                    nxt = next(i for i in mine if i > a and order[i][1] == "sync")
                    others = [i for i in range(a, nxt) if order[i] == (1 - cw, "sync")]
                    assert len(others) == 1, (n_tiles, cw, order)
                    assert b < nxt


def test_bad_arguments_are_refused_before_any_step():
    with pytest.raises(ValueError, match=r"cw must be in 0\.\.1, got 2"):
        consumer(2, 3, 3)
    with pytest.raises(ValueError, match=r"n_mine must be in 1\.\.3, got 4"):
        consumer(0, 3, 4)
    with pytest.raises(TypeError, match="n_tiles must be an int, got float"):
        consumer(0, 3.0, 3)
    with pytest.raises(ValueError, match=r"n_tiles must be >= 1, got 0"):
        run(0, (1, 1), 2)
    with pytest.raises(ValueError, match=r"n_mine must be a pair"):
        run(3, [3, 3], 2)
    with pytest.raises(ValueError, match=r"n_mine\[1\] must be in 1\.\.3, got 0"):
        run(3, (3, 0), 2)
    with pytest.raises(ValueError, match=r"stages must be >= 1, got 0"):
        run(3, (3, 3), 0)


def test_model_catches_a_missing_turn():
    """Without the empty turns of the skipped tiles, the warpgroup with fewer tiles stops
    handing the turn on and the other waits forever: the model says so."""

    def short(cw, n_tiles, n_mine):
        ops = list(consumer(cw, n_tiles, n_mine))
        if n_mine < n_tiles:  # drop the empty turns
            cut = next(i for i, op in enumerate(ops) if op == ("release", n_mine - 1))
            kept = [op for op in ops[cut + 1 :] if op[0] in ("wait_full", "release")]
            ops = ops[: cut + 1] + kept
        return ops

    with pytest.raises(ScheduleError, match="deadlock|pending"):
        run(3, (2, 3), 2, program=short)


def test_model_catches_a_last_hand_over():
    """Warpgroup 1 handing on after its last turn would leave an arrival pending at exit."""

    def always_hand_over(cw, n_tiles, n_mine):
        ops = list(consumer(cw, n_tiles, n_mine))
        return ops + [("arrive", 0)] if cw == 1 else ops

    with pytest.raises(ScheduleError, match="pending"):
        run(2, (2, 2), 2, program=always_hand_over)


# ---------------------------------------------------------------- version 27: work tiles per block


def _random_tiles(rng, n_items):
    """Work tiles with their causal splits (warpgroup 1 as many tiles as 0 or more), 1-tile ones
    included."""
    tiles = []
    for _ in range(n_items):
        n = int(rng.integers(1, 6))
        n0 = int(rng.integers(1, n + 1))
        tiles.append((n, (n0, int(rng.integers(n0, n + 1)))))
    return tiles


def _barrier_counts(events):
    """{barrier: (arrivals, waits)}: bar.arrive of the other warpgroup against bar.sync."""
    ops = [(e.who, e.op) for e in events if e.who != "producer"]
    return {
        b: (sum(op == ("arrive", b) for _, op in ops), sum(op == ("sync", b) for _, op in ops))
        for b in (0, 1)
    }


@pytest.mark.parametrize("seed", range(12))
def test_work_tile_lists_alternate_and_end_balanced(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    tiles = _random_tiles(rng, int(rng.integers(1, 7)))
    for stages in (2, 3):
        events = pp.run_blocks(tiles, stages)
        n_turns = sum(n + 1 for n, _ in tiles)
        assert turns(events) == [0, 1] * n_turns, (tiles, stages)
        assert _barrier_counts(events) == {0: (n_turns, n_turns), 1: (n_turns, n_turns)}
        where = {(e.who, e.op): i for i, e in enumerate(events)}
        for n in range(1, len(tiles)):  # the next Q only after both warpgroups' last S
            assert where[("producer", ("load_q", n))] > max(
                where[(cw, ("free_q", n - 1))] for cw in (0, 1)
            )
            for cw in (0, 1):
                assert where[(cw, ("wait_q", n))] > where[("producer", ("load_q", n))]


def test_the_producer_runs_into_the_next_work_tile():
    """The next work tile's Q and first K/V tile are loaded before the last O += P V of this
    one is issued (the model's order of events)."""
    events = pp.run_blocks([(4, (4, 4)), (4, (4, 4))], 3)
    where = {(e.who, e.op): i for i, e in enumerate(events)}
    last_pv = max(where[(cw, ("gemm", None, 3))] for cw in (0, 1))
    assert where[("producer", ("load_q", 1))] < last_pv
    assert where[("producer", ("load", 4))] < last_pv


def test_one_work_tile_is_version_23():
    """A block with one work tile does what version 23's block does, Q operations aside."""
    for n, split in [(1, (1, 1)), (3, (2, 3)), (5, (5, 5))]:
        ops = [op for op in pp.block_consumer(1, [(n, split)]) if op[0] not in ("wait_q", "free_q")]
        assert ops == list(consumer(1, n, split[1]))


def test_v27_block_tiles_cover_the_list_longest_first():
    """Every work tile goes to one block; causal runs the longest first inside each section of
    heads (over the whole list when one section holds all heads), a section's K/V fits
    L2_KV_BYTES, and the blocks' turns differ by at most two of the longest work tiles';
    each block's whole schedule runs."""
    from flashref.hardware.work_tiles import L2_KV_BYTES, block_tiles, section_heads, work_tile

    shapes = [
        (1024, 512, 128),
        (1024, 512, 64),
        (4096, 128, 128),
        (16384, 32, 64),
        (1000, 7, 64),
        (17, 3, 128),
    ]
    for (Nq, BH, d), causal in [(s, c) for s in shapes for c in (True, False)]:
        Tr, G = -(-Nq // 128), section_heads(Nq, d, BH)
        assert G == BH or G * Nq * d * 4 <= L2_KV_BYTES < (G + 1) * Nq * d * 4
        order = [work_tile(i, Tr, BH, causal, G) for i in range(Tr * BH)]
        assert sorted(order) == [(qb, bh) for qb in range(Tr) for bh in range(BH)]
        if causal:  # sections of G heads, one after another, each longest first
            for h0 in range(0, BH, G):
                part = order[h0 * Tr : (h0 + min(G, BH - h0)) * Tr]
                assert {bh for _, bh in part} == set(range(h0, min(BH, h0 + G)))
                assert [qb for qb, _ in part] == sorted((qb for qb, _ in part), reverse=True)
        else:  # a head's query blocks side by side
            assert [bh for _, bh in order] == sorted(bh for _, bh in order)
        grid = min(Tr * BH, 132)
        work = [
            sum(n + 1 for n, _ in block_tiles(b, grid, Nq, Nq, BH, causal, d)) for b in range(grid)
        ]
        assert max(work) - min(work) <= 2 * (Tr + 1), (Nq, BH, d, causal, min(work), max(work))
    assert section_heads(1024, 64, 7) == 7  # small cases: one section, longest first overall
    for b in range(6):  # ragged Nq != Nk, causal: the whole schedule of each block runs
        pp.run_blocks(block_tiles(b, 6, 1000, 4097, 3, True), 3)
        pp.run_blocks(block_tiles(b, 6, 1000, 130, 3, True), 3)


@pytest.mark.parametrize("number", [27, 29])
def test_model_follows_the_v27_kernel(number):
    """The model's hand-over rule, Q operations and work-tile order are the kernel's (version
    29 keeps version 27's schedule)."""
    text = VERSIONS[number].source()  # work_tile() from tile_scheduler.cuh pasted in
    assert re.search(r"if \(cw == 0 \|\| more \|\| turn \+ 1 < n_turns\) named_bar_arrive", text)
    assert "const bool more = item + (int)gridDim.x < n_items;" in text
    assert text.count("mbar_arrive(q_empty);") == 2
    assert "if (n_mine == 1) mbar_arrive(q_empty);" in text
    assert "if (it + 1 == n_mine) mbar_arrive(q_empty);" in text
    assert "mbar_wait(qbar, n & 1);" in text  # version 29's producer sleeps in its waits:
    assert re.search(r"mbar_wait(_suspend)?\(q_empty, \(n - 1\) & 1[,)]", text)
    assert "bh = h0 + ((level & 1) ? Gs - 1 - r : r);" in text
    assert "q_block = Tr - 1 - level;" in text and "const int j = item - h0 * Tr;" in text
    assert f"#define L2_KV_BYTES ({wt.L2_KV_BYTES >> 20}ll << 20)" in text
    assert "L2_KV_BYTES / ((long long)Nk * D * 4)" in text
    consumer_code = text.split("setmaxnreg_inc<CONSUMER_REGS>")[1].split("// finish:")[0]
    assert consumer_code.count("turn_begin(cw);") == 4
    assert consumer_code.count("turn_end(cw, ") == 4
    if number == 27:  # the K/V stage and parity from the block's running count, not the tile's
        assert "(kv + it) % KV_STAGES" in consumer_code and "it % KV_STAGES" not in consumer_code
    else:  # version 29: (st, ph) carried over the block's work tiles, one ring_next per tile
        code = "\n".join(line.split("//")[0] for line in text.splitlines())  # no comments
        assert "% KV_STAGES" not in code and "/ KV_STAGES" not in code
        assert consumer_code.count("ring_next(st, ph);") == 3  # S_0, the loop, the empty turns
        assert "int st = 0;" in consumer_code.split("for (int item")[0]  # once per block
        producer_code = text.split("setmaxnreg_dec<PRODUCER_REGS>")[1].split("return;")[0]
        assert producer_code.count("ring_next(st, ph);") == 1
        assert "int st = 0;" in producer_code.split("for (int item")[0]


def test_model_catches_persistent_mistakes():
    tiles = [(2, (2, 2)), (1, (1, 1)), (3, (2, 3))]

    def per_tile_last_turn(cw, tiles):  # version 23's rule: no hand-over at each tile's end
        ends = {sum(n + 1 for n, _ in tiles[: i + 1]) for i in range(len(tiles))}
        out, turn = [], 0
        for op in pp.block_consumer(cw, tiles):
            turn += op[0] == "sync"
            if not (cw == 1 and op == ("arrive", 0) and turn in ends):
                out.append(op)
        return out

    with pytest.raises(ScheduleError, match="deadlock"):
        pp.run_blocks(tiles, 3, program=per_tile_last_turn)

    def no_free_q(cw, tiles):
        return [op for op in pp.block_consumer(cw, tiles) if op[0] != "free_q"]

    with pytest.raises(ScheduleError, match="deadlock"):  # the next Q is never loaded
        pp.run_blocks(tiles, 3, program=no_free_q)

    def hand_over_at_exit(cw, tiles):
        ops = list(pp.block_consumer(cw, tiles))
        return ops + [("arrive", 0)] if cw == 1 else ops

    with pytest.raises(ScheduleError, match="pending"):
        pp.run_blocks(tiles, 3, program=hand_over_at_exit)


def test_bad_work_tiles_are_refused_before_any_step():
    with pytest.raises(ValueError, match=r"tiles must be a non-empty list"):
        pp.run_blocks([], 3)
    with pytest.raises(ValueError, match=r"tiles\[1\] must be \(n_tiles, \(n0, n1\)\)"):
        pp.run_blocks([(2, (2, 2)), 3], 3)
    with pytest.raises(ValueError, match=r"tiles\[0\] n_mine\[1\] must be in 1\.\.2, got 3"):
        pp.block_consumer(0, [(2, (2, 3))])
    with pytest.raises(ValueError, match=r"stages must be >= 1, got 0"):
        pp.run_blocks([(2, (2, 2))], 0)
    with pytest.raises(ValueError, match=r"item must be in 0\.\.5, got 6"):
        wt.work_tile(6, 2, 3, True)
    with pytest.raises(ValueError, match=r"grid must be in 1\.\.6, got 7"):
        wt.block_tiles(0, 7, 200, 200, 3, False)
    with pytest.raises(ValueError, match=r"G must be in 1\.\.3, got 4"):
        wt.work_tile(0, 2, 3, True, 4)
    with pytest.raises(ValueError, match=r"d must be >= 1, got 0"):
        wt.section_heads(100, 0, 3)
