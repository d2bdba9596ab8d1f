"""Checkers for chapters 11 and 12: Hopper's layouts and its asynchronous pipeline, on a CPU.

``check_wgmma_accumulator(fn)`` runs ``fn(thread, reg, n)`` for every thread (0..127) and
register (0..n/2 - 1) of a ``wgmma.mma_async.m64nNk16`` accumulator, n = 64 and 128, and
wants the ``(row, col)`` of D that the register holds.

``check_swizzle_offset(fn)`` runs ``fn(r, c)`` for every element of a tile of 16-bit
elements with 64 columns (rows of 128 bytes) and wants its byte offset from the tile's
start in the 128-byte swizzle.

``check_ring_parity(fn)`` runs ``fn(t, stages)`` for the tiles of a ring of ``stages``
buffers, each guarded by one "full" mbarrier, and wants ``(buffer, parity)``: the buffer
tile ``t`` lands in and the parity the consumers wait for before reading it.

``check_producer_wait(fn)`` runs ``fn(t, stages)`` and wants ``(stage, parity)``: the stage
the producer fills with tile ``t`` and the parity it waits for on that stage's "empty"
mbarrier first (a wait that returns at once where the stage is filled for the first time).

``check_wait_group(fn)`` runs ``fn(groups, needed)`` with the names of the ``wgmma`` commit
groups a warpgroup has issued, oldest first, and wants the largest ``N`` for which
``wgmma.wait_group N`` guarantees that group ``needed`` has completed.

The answers are integers and are compared exactly with the models of
``flashref.hardware.hopper`` and the kernels' rules; a wrong answer is checked against the
mistakes of ``_hopper_mistakes``, and the two barrier checkers and ``check_wait_group`` also
say what the wrong wait would do on the GPU (hang, read a buffer early, read accumulators in
flight, or wait for nothing). ``tests/exercises/test_exercises_hopper.py`` plants each mistake.
"""

from __future__ import annotations

from ..hardware import hopper as hp
from . import _hopper_mistakes as hm
from ._exact import check_exercise
from ._report import CheckResult
from ._run import checker

__all__ = [
    "check_wgmma_accumulator",
    "check_swizzle_offset",
    "check_ring_parity",
    "check_producer_wait",
    "check_wait_group",
]


# --- the wgmma accumulator ---------------------------------------------------------------------


@checker
def check_wgmma_accumulator(fn) -> CheckResult:
    """Check ``fn(thread, reg, n) -> (row, col)``: the element of a wgmma m64nNk16
    accumulator D (64 x n) that register ``reg`` of ``thread`` holds."""
    cases = []
    for n in (64, 128):
        points = [(T, i, n) for T in range(hp.WARPGROUP) for i in range(n // 2)]
        expected = [hp.wgmma_c(*p) for p in points]
        cases.append(
            (
                f"m64n{n}k16: 128 threads x {n // 2} registers",
                points,
                expected,
                2,
                "(row, col)",
                "fn",
                hm.wgmma_c_candidates,
                None,
            )
        )
    return check_exercise("check_wgmma_accumulator", fn, "fn(thread, reg, n) -> (row, col)", cases)


# --- the 128-byte swizzle ----------------------------------------------------------------------


@checker
def check_swizzle_offset(fn) -> CheckResult:
    """Check ``fn(r, c) -> bytes``: the offset of element (r, c) of a 64-column 16-bit tile in
    the 128-byte swizzle, from the tile's (1024-byte aligned) start."""
    cases = []
    for rows in (range(0, 8), range(8, 16), range(16, 64)):
        points = [(r, c) for r in rows for c in range(hp.TILE_COLS)]
        expected = [int(hp.swizzle_offset(r, c)) for r, c in points]
        cases.append(
            (
                f"rows {rows.start}-{rows.stop - 1}, columns 0-63",
                points,
                expected,
                1,
                "a byte offset",
                "fn",
                hm.swizzle_candidates,
                None,
            )
        )
    return check_exercise("check_swizzle_offset", fn, "fn(r, c) -> byte offset", cases)


# --- the ring's barriers -----------------------------------------------------------------------

STAGES = (2, 3, 4)


def _ring_points(stages: int) -> list[tuple[int, int]]:
    return [(t, stages) for t in range(4 * stages + 1)]


@checker
def check_ring_parity(fn) -> CheckResult:
    """Check ``fn(t, stages) -> (buffer, parity)``: where tile t lands in a ring of ``stages``
    buffers, and the parity the consumers wait for on that buffer's "full" barrier."""
    cases = []
    for S in STAGES:
        points = _ring_points(S)
        expected = [(t % S, (t // S) % 2) for t, _ in points]
        cases.append(
            (
                f"{S} buffers, tiles 0-{4 * S}",
                points,
                expected,
                2,
                "(buffer, parity)",
                "fn",
                hm.ring_candidates,
                None,
            )
        )
    return check_exercise("check_ring_parity", fn, "fn(t, stages) -> (buffer, parity)", cases)


def _producer_effect(point, value) -> str:
    t, S = point
    stage, parity = value
    if stage != t % S:
        return f"tile {t} is stage {t % S}'s, not stage {stage}'s"
    return hm.producer_effect(t, S, parity) or "the wait is right; the stage is not"


@checker
def check_producer_wait(fn) -> CheckResult:
    """Check ``fn(t, stages) -> (stage, parity)``: the stage the producer fills with tile t,
    and the parity it waits for on that stage's "empty" barrier before the copy."""
    cases = []
    for S in STAGES:
        points = _ring_points(S)
        expected = [(t % S, (t // S + 1) % 2) for t, _ in points]
        cases.append(
            (
                f"{S} stages, tiles 0-{4 * S}",
                points,
                expected,
                2,
                "(stage, parity)",
                "fn",
                hm.producer_candidates,
                _producer_effect,
            )
        )
    return check_exercise("check_producer_wait", fn, "fn(t, stages) -> (stage, parity)", cases)


# --- wgmma.wait_group<N> -----------------------------------------------------------------------

# (commit groups in order, oldest first; the group whose accumulators are read next)
GROUPS = [
    (("S_j", "PV_j-1"), "S_j"),  # version 21's loop: the softmax reads S_j
    (("S_j", "PV_j-1"), "PV_j-1"),  # ... then O, after its rescale
    (("S_j",), "S_j"),  # tile 0: S_0 alone
    (("PV_j-2", "S_j", "PV_j-1"), "S_j"),
    (("S_0", "S_1", "S_2", "S_3"), "S_0"),
    (("S_0", "S_1", "S_2", "S_3"), "S_2"),
]


def _wait_effect(point, value) -> str:
    groups, needed = point
    return hm.wait_effect(list(groups), needed, value)


@checker
def check_wait_group(fn) -> CheckResult:
    """Check ``fn(groups, needed) -> N``: the largest N for which wgmma.wait_group N
    guarantees that commit group ``needed`` has completed (``groups`` oldest first)."""
    cases = []
    for groups, needed in GROUPS:
        point = (list(groups), needed)
        expected = [len(groups) - 1 - groups.index(needed)]

        def candidates(groups, needed):
            return hm.wait_candidates(list(groups), needed)

        cases.append(
            (
                f"groups {' '.join(groups)}, reading {needed}",
                [point],
                expected,
                1,
                "N",
                "fn",
                candidates,
                _wait_effect,
            )
        )
    return check_exercise("check_wait_group", fn, "fn(groups, needed) -> N", cases)
