"""Version 23's ping-pong schedule, modelled step by step on the CPU.

The two consumer warpgroups of flashref/kernels/v23_pingpong.cu take turns at the tensor cores
on two named barriers, beside the producer's ring of full/empty mbarriers. A wrong count of
turns hangs the kernel (or leaves an arrival pending at exit), and with Br = Bc = 128 the case
that the kernel's header reasons about, one warpgroup with fewer tiles than the other (causal),
never happens on the GPU. This model runs each warpgroup's sequence of barrier operations as
the kernel's consumer code issues them, for every tile count and split, and checks that
nothing waits forever, the turns alternate 0, 1, 0, 1, ... and every barrier ends balanced.
"""

from __future__ import annotations

import re

import pytest

from flashref.gpu.versions import VERSIONS


def consumer(cw: int, n_tiles: int, n_mine: int):
    """The operations of consumer warpgroup cw, in the kernel's order."""
    n_turns = n_tiles + 1

    def turn_end(turn):
        if cw == 0 or turn + 1 < n_turns:
            yield ("arrive", 1 - cw)

    if cw == 1:
        yield ("arrive", 0)
    yield ("wait_full", 0)
    yield ("sync", cw)
    yield from turn_end(0)
    for it in range(1, n_mine):
        yield ("wait_full", it)
        yield ("sync", cw)
        yield from turn_end(it)
        yield ("release", it - 1)
    yield ("sync", cw)
    yield from turn_end(n_mine)
    yield ("release", n_mine - 1)
    for it in range(n_mine, n_tiles):
        yield ("wait_full", it)
        yield ("sync", cw)
        yield from turn_end(it + 1)
        yield ("release", it)


def run(n_tiles: int, n_mine: tuple[int, int], stages: int, program=consumer) -> list[int]:
    """Runs both warpgroups and the producer until all finish; returns the order of turns."""
    progs = [iter(program(cw, n_tiles, n_mine[cw])) for cw in (0, 1)]
    pending = [next(p) for p in progs]
    count = [0, 0]  # warpgroups arrived at named barrier b in its current generation
    members: list[set] = [set(), set()]  # which ones
    gen = [0, 0]  # completed generations of barrier b
    waiting = [None, None]  # (barrier, generation) a warpgroup's bar.sync waits to complete
    released = [set(), set()]  # tiles each warpgroup has released
    filled = 0  # tiles the producer has loaded (it waits until tile - stages is released)
    turns: list[int] = []
    while any(op is not None for op in pending):
        moved = False
        while filled < n_tiles and all(filled - stages in r for r in released if filled >= stages):
            filled += 1
            moved = True
        for cw in (0, 1):
            op = pending[cw]
            if op is None:
                continue
            if waiting[cw] is not None:  # inside bar.sync
                b, g = waiting[cw]
                if gen[b] <= g:
                    continue
                waiting[cw] = None
                turns.append(cw)
            elif op[0] == "wait_full":
                if op[1] >= filled:
                    continue
            elif op[0] in ("arrive", "sync"):
                b = op[1]
                assert cw not in members[b], f"warpgroup {cw} arrived twice at barrier {b}"
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
            pending[cw] = next(progs[cw], None)
            moved = True
        assert moved, f"deadlock: n_tiles {n_tiles}, n_mine {n_mine}, waiting at {pending}"
    assert count == [0, 0], f"arrivals left pending at exit: {count}"
    assert filled == n_tiles and all(r == set(range(n_tiles)) for r in released)
    return turns


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 5])
def test_turns_alternate_and_end_balanced(n_tiles, stages):
    for n0 in range(1, n_tiles + 1):
        for n1 in range(n0, n_tiles + 1):  # warpgroup 1's rows come later: as many tiles or more
            turns = run(n_tiles, (n0, n1), stages)
            assert turns == [0, 1] * (n_tiles + 1), (n_tiles, n0, n1, turns)


def test_model_follows_the_kernel():
    """The model's turn count and its one skipped hand-over are the kernel's."""
    text = VERSIONS[23].path.read_text()
    assert "const int n_turns = n_tiles + 1;" in text
    assert re.search(r"if \(cw == 0 \|\| turn \+ 1 < n_turns\) named_bar_arrive", text)
    assert "if (cw == 1) named_bar_arrive(PINGPONG_BAR, NCONSUMERS);" in text
    consumer_code = text.split("setmaxnreg_inc<CONSUMER_REGS>")[1]
    # turn 0, the skewed loop, the last O += P V and the skipped tiles: four turns in the code
    assert consumer_code.count("turn_begin(cw);") == 4
    assert consumer_code.count("turn_end(cw, ") == 4


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

    with pytest.raises(AssertionError, match="deadlock|pending"):
        run(3, (2, 3), 2, program=short)


def test_model_catches_a_last_hand_over():
    """Warpgroup 1 handing on after its last turn would leave an arrival pending at exit."""

    def always_hand_over(cw, n_tiles, n_mine):
        ops = list(consumer(cw, n_tiles, n_mine))
        return ops + [("arrive", 0)] if cw == 1 else ops

    with pytest.raises(AssertionError, match="pending"):
        run(2, (2, 2), 2, program=always_hand_over)
