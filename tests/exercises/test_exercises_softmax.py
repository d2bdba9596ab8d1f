"""The chapter 1 and 2 softmax checkers accept correct solutions and name planted mistakes."""

from __future__ import annotations

import numpy as np
import pytest
from softmax_solutions import (
    flat,
    online_softmax_float32,
    online_softmax_per_row,
    safe_softmax_via_lse,
    streamed,
)

import flashref
from flashref.exercises import check_online_softmax, check_safe_softmax
from flashref.exercises import softmax as ex
from flashref.exercises import state as st


def test_streamed_is_right_when_no_mistake_is_planted():
    assert check_online_softmax(streamed())


# --- safe softmax --------------------------------------------------------------------------


def test_safe_softmax_accepts_correct_solutions():
    assert check_safe_softmax(safe_softmax_via_lse)
    assert check_safe_softmax(flashref.safe_softmax)


def test_safe_softmax_names_the_overflow_of_the_textbook_formula():
    result = check_safe_softmax(flashref.naive_softmax)
    text = flat(result)
    assert not result
    assert ex.NO_MAX in text
    assert "scores near 1000" in text and "expected" in text and "got nan" in text
    assert "warned: " in text and "overflow encountered in exp" in text


def test_safe_softmax_names_global_max_and_wrong_axis():
    def global_max(x):
        e = np.exp(x - x.max())
        return e / e.sum(axis=-1, keepdims=True)

    def wrong_axis(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)

    assert ex.GLOBAL_MAX in flat(check_safe_softmax(global_max))
    assert ex.WRONG_AXIS in flat(check_safe_softmax(wrong_axis))


# --- online softmax ------------------------------------------------------------------------


def test_online_softmax_accepts_correct_solutions():
    result = check_online_softmax(online_softmax_per_row)
    assert result, str(result)
    assert result.cases_run == 13
    assert check_online_softmax(flashref.online_softmax)


@pytest.mark.parametrize(
    ("mistake", "fn", "not_named"),
    [
        (ex.NO_RESCALE, streamed(rescale="none"), ex.WRONG_WAY),
        (ex.WRONG_WAY, streamed(rescale="wrong"), ex.NO_RESCALE),
        (ex.OFF_BY_ONE, streamed(bounds="long"), ex.NO_RESCALE),
        (ex.OFF_BY_ONE, streamed(bounds="drop_tail"), ex.NO_RESCALE),
        (ex.NO_MAX, streamed(shift=False), ex.NO_RESCALE),
        (ex.STALE_MAX, streamed(stale="guarded"), ex.NO_RESCALE),
        (ex.STALE_MAX, streamed(stale="literal"), ex.NO_RESCALE),
    ],
)
def test_online_softmax_names_each_planted_mistake(mistake, fn, not_named):
    result = check_online_softmax(fn)
    text = flat(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert not_named not in text
    assert "block_size=" in text and "expected" in text


def test_the_names_the_brief_promises_are_spelled_out():
    assert ex.NO_RESCALE == "no rescaling of the running sum when the maximum grows"
    assert ex.WRONG_WAY == (
        "rescaling the wrong way (exp(m_new - m_old) instead of exp(m_old - m_new))"
    )
    assert ex.OFF_BY_ONE == "off-by-one tile bounds (a score skipped or counted twice)"
    assert ex.NO_MAX == "not subtracting the maximum (overflow)"
    assert st.MERGE_ONE == "forgot to rescale one of the two states"
    assert st.MERGE_OTHER == "used the other state's maximum"
    assert st.MERGE_ADD == "added maxima"


def test_online_softmax_names_a_missing_guard_for_masked_blocks():
    def unguarded(x, B):
        m = np.full(x.shape[:-1], -np.inf)
        l = np.zeros(x.shape[:-1])
        with np.errstate(all="ignore"):
            for s in range(0, x.shape[-1], B):
                m_new = np.maximum(m, x[..., s : s + B].max(axis=-1))
                l = l * np.exp(m - m_new) + np.exp(x[..., s : s + B] - m_new[..., None]).sum(-1)
                m = m_new
            return np.exp(x - m[..., None]) / l[..., None]

    result = check_online_softmax(unguarded)
    assert result.cases_run == 13 and len(result.failures) == 1
    assert "a whole first block of -inf" in flat(result)
    assert ex.NO_GUARD in flat(result)


def test_online_softmax_reports_exceptions_and_not_implemented():
    def todo(x, block_size):
        raise NotImplementedError

    def broken(x, block_size):
        raise ValueError("shapes do not match")

    assert "not implemented yet" in str(check_online_softmax(todo))
    assert not check_online_softmax(todo)
    result = check_online_softmax(broken)
    assert len(result.failures) == result.cases_run == 13
    assert "raised ValueError: shapes do not match" in str(result)


def test_online_softmax_fails_nan_wrong_shape_and_wrong_type():
    nan = check_online_softmax(lambda x, B: np.full(x.shape, np.nan))
    assert len(nan.failures) == 13 and "got nan" in str(nan)
    assert "expected shape (37,), got shape (1, 37)" in str(
        check_online_softmax(lambda x, B: online_softmax_per_row(np.atleast_2d(x), B))
    )
    assert "the function returned None" in str(check_online_softmax(lambda x, B: None))
    f32 = check_online_softmax(lambda x, B: online_softmax_per_row(x, B).astype(np.float32))
    assert "expected dtype float64 (the input's), got float32" in str(f32)


def test_online_softmax_does_not_pass_an_input_the_reader_can_spoil():
    def overwrites(x, B):
        out = online_softmax_per_row(x, B)
        x[...] = 0.0  # the checker must not compare against a modified input
        return out

    assert check_online_softmax(overwrites)


# --- chapter 1's checker: underflow is underflow, and there are no blocks -----------------------


def test_safe_softmax_tells_overflow_from_underflow():
    failures = {
        f.case.split(":")[0]: f for f in check_safe_softmax(flashref.naive_softmax).failures
    }
    assert failures["scores near -1000"].diagnosis == ex.NO_MAX_UNDERFLOW
    assert "underflow" in ex.NO_MAX_UNDERFLOW and "overflow" not in ex.NO_MAX_UNDERFLOW
    assert failures["scores near 1000, rising"].diagnosis == ex.NO_MAX
    assert failures["one row near 1000, one near -1000"].diagnosis == ex.NO_MAX_BOTH
    assert failures["scores spanning -1000 to 1000 in one row"].diagnosis == ex.NO_MAX


def test_online_softmax_names_underflow_too():
    failures = {
        f.case.split(":")[0]: f for f in check_online_softmax(streamed(shift=False)).failures
    }
    assert failures["scores near -1000"].diagnosis == ex.NO_MAX_UNDERFLOW


def test_safe_softmax_cases_speak_of_no_blocks():
    result = check_safe_softmax(lambda x: None)  # every case fails: every label is listed
    assert len(result.failures) == result.cases_run == 11
    labels = [f.case for f in result.failures]
    assert not [label for label in labels if "block" in label], labels
    assert "scores near 1000, rising: the maximum at the end of the row: x (3, 20)" in labels


# --- float32 precision ----------------------------------------------------------------------


def test_online_softmax_calls_a_float32_solution_a_precision_problem():
    result = check_online_softmax(online_softmax_float32)
    assert not result and len(result.failures) >= 10
    assert all(f.diagnosis == ex.PRECISION for f in result.failures), str(result)
    assert "likely mistake: float32 precision" in str(result)


def test_online_softmax_says_keep_float64_for_a_float32_answer():
    result = check_online_softmax(lambda x, B: online_softmax_float32(x, B).astype(np.float32))
    assert "expected dtype float64 (the input's), got float32" in str(result)


def test_precision_is_not_claimed_for_a_real_mistake():
    result = check_online_softmax(streamed(rescale="none"))
    assert ex.PRECISION not in str(result)
    # 1e-3 relative is beyond float32 rounding on every case (at most 4 * 2**-24 * 2020 = 5e-4)
    result = check_online_softmax(lambda x, B: online_softmax_per_row(x, B) * (1 + 1e-3))
    assert not result and len(result.failures) == 13 and ex.PRECISION not in str(result)
