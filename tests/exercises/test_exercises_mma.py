"""Chapter 5's fragment checker: the right map passes, every planted mistake is named.

The right solution is written the way a reader might, from the chapter's rule (g = lane / 4,
t = lane % 4), not through ``flashref.hardware.fragments``; each planted solution has a
single mistake, and the checker must fail it and name that mistake on every case it names
anything.
"""

from __future__ import annotations

import numpy as np
import pytest
from exercise_report import assert_named, assert_not_implemented_line, flat
from reference import no_warnings

import flashref.exercises
from flashref.exercises import _mma_mistakes as mm
from flashref.exercises import check_mma_fragment
from flashref.exercises._report import NOT_IMPLEMENTED


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    """A checker must not warn on its own, whatever it is given (as under python -W error)."""
    with no_warnings():
        yield


def fragment(
    swap_rc=False, row8=True, col8=True, swap_gt=False, a_order=True, c_order=True, paired=True
):
    """The A and C maps from the chapter's rule, with one planted mistake by argument."""

    def fn(operand, lane, reg, half):
        g, t = (lane % 4, lane // 4) if swap_gt else (lane // 4, lane % 4)
        if operand == "A":
            down, right, value = (reg % 2, reg // 2, half) if a_order else (reg // 2, reg % 2, half)
        else:  # C: one fp32 per register, two per row
            down, right, value = (reg // 2, 0, reg % 2) if c_order else (reg % 2, 0, reg // 2)
        row = g + (8 * down if row8 else 0)
        col = (2 * t + value if paired else t + 4 * value) + (8 * right if col8 else 0)
        return (col, row) if swap_rc else (row, col)

    return fn


def test_the_fragment_map_passes():
    result = check_mma_fragment(fragment())
    assert result, str(result)
    assert result.cases_run == 2


def test_the_isa_formulas_pass():
    def isa(operand, lane, reg, half):  # PTX ISA: groupID, threadID_in_group, element i
        groupID, tig = lane >> 2, lane % 4
        if operand == "C":
            i = reg
            return groupID + (8 if i >= 2 else 0), tig * 2 + (i & 1)
        i = 2 * reg + half
        row = groupID if (0 <= i < 2 or 4 <= i < 6) else groupID + 8
        return row, tig * 2 + (i & 1) + (8 if i >= 4 else 0)

    assert check_mma_fragment(isa)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"swap_rc": True}, mm.SWAPPED),
        ({"row8": False}, mm.NO_ROW_8),
        ({"swap_gt": True}, mm.G_T_SWAPPED),
        ({"paired": False}, mm.NOT_PAIRED),
    ],
)
def test_mistakes_in_both_operands_are_named_in_both(kwargs, name):
    result = check_mma_fragment(fragment(**kwargs))
    assert_named(result, name)
    assert len(result.failures) == 2


@pytest.mark.parametrize(
    "kwargs, name, case",
    [
        ({"col8": False}, mm.NO_COL_8, "A"),
        ({"a_order": False}, mm.A_REG_ORDER, "A"),
        ({"c_order": False}, mm.C_REG_ORDER, "C"),
    ],
)
def test_a_mistake_in_one_operand_fails_that_case_only(kwargs, name, case):
    result = check_mma_fragment(fragment(**kwargs))
    assert_named(result, name)
    assert [f.case[0] for f in result.failures] == [case]


def test_no_two_mistakes_give_the_same_map():
    for candidates, points in (
        (mm.a_candidates, [("A", L, r, h) for L in range(32) for r in range(4) for h in (0, 1)]),
        (mm.c_candidates, [("C", L, r, 0) for L in range(32) for r in range(4)]),
    ):
        maps = {}
        for p in points:
            for name, value in candidates(*p):
                maps.setdefault(name, []).append(value)
        as_tuples = [tuple(v) for v in maps.values()]
        assert len(set(as_tuples)) == len(as_tuples)


def test_an_answer_in_numpy_ints_passes_and_a_float_is_refused():
    right = fragment()
    assert check_mma_fragment(lambda *a: tuple(np.int64(x) for x in right(*a)))
    result = check_mma_fragment(lambda *a: (float(right(*a)[0]), right(*a)[1]))
    assert not result and "a pair of ints, got tuple" in flat(result)


def test_an_unknown_mistake_fails_without_a_name():
    right = fragment()
    result = check_mma_fragment(lambda op, lane, reg, half: right(op, (lane + 1) % 32, reg, half))
    assert not result and "likely mistake" not in flat(result)
    assert "fn('A', 0, 0, 0): expected (0, 0), got (0, 2)" in flat(result)


def test_the_checker_is_exported_and_keeps_the_rules():
    assert flashref.exercises.check_mma_fragment is check_mma_fragment
    assert "check_mma_fragment" in dir(flashref.exercises)
    assert_not_implemented_line(check_mma_fragment)

    def todo(*args):
        raise NotImplementedError

    assert NOT_IMPLEMENTED in str(check_mma_fragment(todo))
    assert "return` missing" in str(check_mma_fragment(lambda *args: None))
    broken = check_mma_fragment(lambda *args: 1 // 0)
    assert not broken and "raised ZeroDivisionError" in str(broken)
    with pytest.raises(TypeError, match="fn must be a function"):
        check_mma_fragment("not a function")
