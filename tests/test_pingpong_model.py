"""Version 23's ping-pong schedule, as flashref.gpu.pingpong models it on the CPU.

The model runs each consumer warpgroup's barrier operations as the kernel's consumer code
issues them, beside the producer's ring, for every tile count and causal split (also the
unequal splits that Br = Bc = 128 never produces on the GPU), and these tests check that
nothing waits forever, the turns alternate 0, 1, 0, 1, ... and every barrier ends balanced,
and that the model's operations are the kernel's.
"""

from __future__ import annotations

import re

import pytest

from flashref.gpu import pingpong as pp
from flashref.gpu.pingpong import ScheduleError, consumer, run, turns
from flashref.gpu.versions import VERSIONS

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
