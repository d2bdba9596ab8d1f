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
``flashref.gpu.models.hopper`` and the kernels' rules; a wrong answer is checked against the
mistakes of ``_hopper_mistakes``, and the two barrier checkers and ``check_wait_group`` also
say what the wrong wait would do on the GPU (hang, read a buffer early, read accumulators in
flight, or wait for nothing). ``tests/exercises/test_exercises_hopper.py`` plants each mistake.
"""

from __future__ import annotations

import textwrap
from functools import partial

from ..gpu.models import hopper as hp
from . import _hopper_mistakes as hm
from ._answer import RETURNED_NONE, type_name
from ._report import WIDTH, CheckResult
from ._run import Case, check_callable, checker, run
from .ring import _name

__all__ = [
    "check_wgmma_accumulator",
    "check_swizzle_offset",
    "check_ring_parity",
    "check_producer_wait",
    "check_wait_group",
]


def _is_int(x) -> bool:
    return hasattr(x, "__index__") and not isinstance(x, bool)


def _one(got, size: int, what: str):
    """An int (size 1) or a tuple/list of ``size`` ints, as a tuple; or None and a problem."""
    if got is None:
        return None, RETURNED_NONE
    if size == 1:
        if _is_int(got):
            return int(got), None
        return None, f"expected an int ({what}), got {type_name(got)} {got!r}"
    if not isinstance(got, tuple | list) or len(got) != size or not all(map(_is_int, got)):
        return None, f"expected {what}, a pair of ints, got {type_name(got)} {got!r}"
    return tuple(int(x) for x in got), None


def _table(fn, points):
    """The reader's answer at every point (each a tuple of arguments), in order."""
    return [(p, fn(*p)) for p in points]


def _accept(size: int, what: str, call: str):
    def accept(got):
        out = []
        for p, answer in got:
            value, problem = _one(answer, size, what)
            if problem:
                return None, f"{call}{p}: {problem}"
            out.append(value)
        return tuple(out), None

    return accept


def _case(label, points, expected, size, what, call, candidates, effect=None) -> Case:
    """One case: the reader's function at every point against ``expected`` (one answer each)."""
    expected = tuple(expected)

    def describe(value):
        bad = [i for i, (e, g) in enumerate(zip(expected, value, strict=True)) if e != g]
        i = bad[0]
        text = f"{call}{points[i]}: expected {expected[i]}, got {value[i]}"
        text += f" ({len(bad)} of {len(points)} wrong)" if len(bad) > 1 else ""
        if effect is not None:  # what the wrong wait does, wrapped as the report's lines
            text += "\n" + textwrap.fill(effect(points[i], value[i]), WIDTH,
                                         initial_indent="  ", subsequent_indent="  ")  # fmt: skip
        return text

    return Case(
        label,
        (points,),  # run calls _table(fn, points)
        expected,
        accept=_accept(size, what, call),
        distance=lambda value: 0.0 if value == expected else float("inf"),
        describe=describe,
        within_float32=lambda value: False,  # integers: no rounding to blame
        wrong=(points, candidates),
    )


def _mistakes(case, value) -> list[str]:
    """The mistakes that give exactly the reader's answer, at every point of the case."""
    points, candidates = case.wrong
    found = None
    for p, got in zip(points, value, strict=True):
        here = [name for name, c in candidates(*p) if c == got]
        found = here if found is None else [name for name in found if name in here]
        if not found:
            return []
    return list(dict.fromkeys(found))


def _check(exercise, fn, signature, cases) -> CheckResult:
    check_callable(fn, signature)
    built = [_case(*case) for case in cases]
    return run(exercise, partial(_table, fn), built, partial(_name, matches=_mistakes))


# --- the wgmma accumulator ---------------------------------------------------------------------


@checker
def check_wgmma_accumulator(fn) -> CheckResult:
    """Check ``fn(thread, reg, n) -> (row, col)``: the element of a wgmma m64nNk16
    accumulator D (64 x n) that register ``reg`` of ``thread`` holds."""
    cases = []
    for n in (64, 128):
        points = [(T, i, n) for T in range(hp.WARPGROUP) for i in range(n // 2)]
        expected = [hp.wgmma_c(*p) for p in points]
        cases.append((f"m64n{n}k16: 128 threads x {n // 2} registers", points, expected, 2,
                      "(row, col)", "fn", hm.wgmma_c_candidates, None))  # fmt: skip
    return _check("check_wgmma_accumulator", fn, "fn(thread, reg, n) -> (row, col)", cases)


# --- the 128-byte swizzle ----------------------------------------------------------------------


@checker
def check_swizzle_offset(fn) -> CheckResult:
    """Check ``fn(r, c) -> bytes``: the offset of element (r, c) of a 64-column 16-bit tile in
    the 128-byte swizzle, from the tile's (1024-byte aligned) start."""
    cases = []
    for rows in (range(0, 8), range(8, 16), range(16, 64)):
        points = [(r, c) for r in rows for c in range(hp.TILE_COLS)]
        expected = [int(hp.swizzle_offset(r, c)) for r, c in points]
        cases.append((f"rows {rows.start}-{rows.stop - 1}, columns 0-63", points, expected, 1,
                      "a byte offset", "fn", hm.swizzle_candidates, None))  # fmt: skip
    return _check("check_swizzle_offset", fn, "fn(r, c) -> byte offset", cases)


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
        cases.append((f"{S} buffers, tiles 0-{4 * S}", points, expected, 2, "(buffer, parity)",
                      "fn", hm.ring_candidates, None))  # fmt: skip
    return _check("check_ring_parity", fn, "fn(t, stages) -> (buffer, parity)", cases)


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
        cases.append((f"{S} stages, tiles 0-{4 * S}", points, expected, 2, "(stage, parity)",
                      "fn", hm.producer_candidates, _producer_effect))  # fmt: skip
    return _check("check_producer_wait", fn, "fn(t, stages) -> (stage, parity)", cases)


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

        cases.append((f"groups {' '.join(groups)}, reading {needed}", [point], expected, 1,
                      "N", "fn", candidates, _wait_effect))  # fmt: skip
    return _check("check_wait_group", fn, "fn(groups, needed) -> N", cases)
