"""The chapter 2 state checkers (streaming weighted sum, merge) name planted mistakes."""

from __future__ import annotations

import numpy as np
import pytest
from reference import no_warnings
from softmax_solutions import (
    A,
    B,
    flat,
    merge,
    merge_with_where,
    own,
    unit,
    weighted,
    weighted_sum_float32,
    weighted_sum_in_floats,
)

import flashref
from flashref import SoftmaxState
from flashref.exercises import check_merge_states, check_streaming_weighted_sum
from flashref.exercises import softmax as ex
from flashref.exercises import state as st

# --- streaming weighted sum ----------------------------------------------------------------


def test_streaming_weighted_sum_accepts_correct_solutions():
    result = check_streaming_weighted_sum(weighted_sum_in_floats)
    assert result, str(result)
    assert check_streaming_weighted_sum(flashref.streaming_weighted_sum)
    assert check_streaming_weighted_sum(weighted())


@pytest.mark.parametrize(
    ("mistake", "fn"),
    [
        (ex.NO_RESCALE, weighted(rescale_l="none", rescale_o="none")),
        (ex.NO_RESCALE, weighted(rescale_l="none")),
        (st.NO_RESCALE_O, weighted(rescale_o="none")),
        (ex.WRONG_WAY, weighted(rescale_l="wrong", rescale_o="wrong")),
        (ex.OFF_BY_ONE, weighted(bounds="short")),
        (ex.OFF_BY_ONE, weighted(bounds="drop_tail")),
        (ex.NO_MAX, weighted(shift=False)),
        (st.TILE_AVERAGE, weighted(average=True)),
        (st.STALE_MAX, weighted(stale=True)),
    ],
)
def test_streaming_weighted_sum_names_each_planted_mistake(mistake, fn):
    result = check_streaming_weighted_sum(fn)
    text = flat(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert "tile_size=" in text and "expected" in text


def test_streaming_weighted_sum_reports_the_worked_example_by_name():
    result = check_streaming_weighted_sum(weighted(rescale_l="none", rescale_o="none"))
    assert (
        "the worked example (1000 + log i; values 10, 20, 30, 40): scores (4,), tile_size=1"
        in str(result)
    )
    assert "expected 30, got" in str(result)


# --- merging states ------------------------------------------------------------------------


@pytest.mark.parametrize("with_o", [False, True])
def test_merge_accepts_correct_solutions(with_o):
    result = check_merge_states(merge_with_where, with_o=with_o)
    assert result, str(result)
    assert check_merge_states(flashref.merge_states, with_o=with_o)
    assert check_merge_states(merge(own(A), own(B)), with_o=with_o)


@pytest.mark.parametrize("with_o", [False, True])
@pytest.mark.parametrize(
    ("mistake", "fn"),
    [
        (st.MERGE_ONE, merge(own(A), unit)),
        (st.MERGE_ONE, merge(unit, own(B))),
        (st.MERGE_OTHER, merge(own(B), own(A))),
        (st.MERGE_ADD, merge(own(A), own(B), m_rule="sum")),
        (st.MERGE_NONE, merge(unit, unit)),
    ],
)
def test_merge_names_each_planted_mistake(mistake, fn, with_o):
    result = check_merge_states(fn, with_o=with_o)
    text = flat(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert "rows (" in text and "expected" in text


def test_merge_names_a_missing_guard_for_two_empty_states():
    def unguarded(a, b):
        m = np.maximum(a.m, b.m)
        with np.errstate(invalid="ignore"):
            return SoftmaxState(m, a.l * np.exp(a.m - m) + b.l * np.exp(b.m - m))

    result = check_merge_states(unguarded)
    assert len(result.failures) == 1
    assert "both states empty in row 0" in flat(result) and st.MERGE_NO_GUARD in flat(result)


def test_merge_reports_a_tuple_instead_of_a_state():
    result = check_merge_states(lambda a, b: (a.m, a.l))
    assert "expected a SoftmaxState (with .m and .l), got tuple" in str(result)


def test_streaming_weighted_sum_calls_float32_arithmetic_a_precision_problem():
    result = check_streaming_weighted_sum(weighted_sum_float32)
    assert not result
    assert all(f.diagnosis == st.PRECISION for f in result.failures), str(result)


def test_merge_calls_float32_arithmetic_a_precision_problem():
    def merge_float32(a, b):
        f32 = [SoftmaxState(s.m.astype(np.float32), s.l.astype(np.float32)) for s in (a, b)]
        merged = flashref.merge_states(*f32)
        return SoftmaxState(merged.m.astype(np.float64), merged.l.astype(np.float64))

    result = check_merge_states(merge_float32)
    assert not result
    assert all(f.diagnosis == st.PRECISION for f in result.failures), str(result)


# --- merge: 0 instead of -inf for an empty row --------------------------------------------------


def test_merge_storing_the_shift_as_m_is_named_without_a_warning_of_its_own():
    def shift_as_m(a, b):
        merged = flashref.merge_states(a, b)
        return SoftmaxState(np.where(np.isneginf(merged.m), 0.0, merged.m), merged.l)

    with no_warnings():  # python -W error: the checker must not warn
        result = check_merge_states(shift_as_m)
    assert len(result.failures) == 1
    failure = result.failures[0]
    assert failure.case.startswith("both states empty in row 0")
    assert failure.problem == "m, row 0: expected -inf, got 0"
    assert failure.diagnosis == st.MERGE_SHIFT_AS_M
