"""The chapter 3 and 4 checkers accept correct solutions and name planted mistakes."""

from __future__ import annotations

import numpy as np
import pytest
from attention_solutions import (
    flat,
    in_float32,
    one_query_correct,
    one_query_loop,
    one_query_not_implemented,
    tiled_correct,
    tiled_loop,
)

from flashref.exercises import check_one_query_attention, check_tiled_attention
from flashref.exercises._cases import one_query_cases
from flashref.exercises.attention import (
    BOTTOM_RIGHT,
    CAUSAL_FIRST_ROW,
    DIVIDE_INSIDE,
    NO_CAUSAL,
    NO_RESCALE,
    NO_SCALE,
    NO_SHIFT,
    NOT_IMPLEMENTED,
    OFF_BY_ONE,
    PER_TILE,
    PRECISION,
    STALE_MAX,
    STRICT_CAUSAL,
    WRONG_WAY,
)

# ---------------------------------------------------------------------------
# One query: fn(q (d,), K (N, d), V (N, dv), tile_size) -> (dv,)


def test_one_query_accepts_correct_solution():
    result = check_one_query_attention(one_query_correct)
    assert result, str(result)
    assert result.cases_run >= 9
    assert "all" in str(result) and "passed" in str(result)


def test_one_query_accepts_the_plain_loop():
    assert check_one_query_attention(one_query_loop("correct"))


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_rescale", NO_RESCALE),
        ("wrong_way", WRONG_WAY),
        ("off_by_one", OFF_BY_ONE),
        ("average", PER_TILE),
        ("divide_inside", DIVIDE_INSIDE),
        ("no_shift", NO_SHIFT),
        ("stale_max", STALE_MAX),
        ("stale_max_literal", STALE_MAX),
        ("no_scale", NO_SCALE),
    ],
)
def test_one_query_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # the planted mistakes overflow, on purpose
        result = check_one_query_attention(one_query_loop(rule))
    report = flat(result)
    assert not result
    assert "likely mistake: " in report and name in report, report
    assert "expected" in report and "got" in report and "tile_size=" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    # NaN on every case (the stale maximum from -inf) is also what rescaling the wrong
    # way gives: both are named
    assert diagnosed and all(name in d for d in diagnosed), diagnosed


def test_one_query_not_implemented_and_exceptions():
    result = check_one_query_attention(one_query_not_implemented)
    assert not result and NOT_IMPLEMENTED in str(result)
    n = len(one_query_cases())
    assert result.cases_run == len(result.failures) == n  # every case is still tried
    assert str(result) == (
        f"check_one_query_attention: not implemented yet (all {n} cases raised NotImplementedError)"
    )

    def raises(q, K, V, tile_size):
        raise IndexError("tile out of range")

    report = str(check_one_query_attention(raises))
    assert "raised IndexError: tile out of range" in report

    report = str(check_one_query_attention(lambda q, K, V, t: np.zeros((1, V.shape[1]))))
    assert "expected shape (4,), got shape (1, 4)" in report


def test_one_query_rejects_non_callable():
    with pytest.raises(TypeError, match="fn must be a function"):
        check_one_query_attention(np.zeros(3))


# ---------------------------------------------------------------------------
# Tiled: fn(q (Nq, d), k (Nk, d), v (Nk, dv), block_q, block_k, causal) -> (Nq, dv)


def test_tiled_accepts_correct_solutions():
    result = check_tiled_attention(tiled_correct)
    assert result, str(result)
    assert result.cases_run >= 14
    assert check_tiled_attention(tiled_loop("correct"))


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_rescale", NO_RESCALE),
        ("wrong_way", WRONG_WAY),
        ("off_by_one", OFF_BY_ONE),
        ("bottom_right", BOTTOM_RIGHT),
        ("strict", STRICT_CAUSAL),
        ("average", PER_TILE),
        ("skip_diagonal", OFF_BY_ONE),
        ("divide_inside", DIVIDE_INSIDE),
        ("stale_max", STALE_MAX),
        ("no_scale", NO_SCALE),
        ("first_row", CAUSAL_FIRST_ROW),
        ("first_row_clipped", CAUSAL_FIRST_ROW),
        ("no_causal", NO_CAUSAL),
    ],
)
def test_tiled_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # several planted mistakes divide 0 by 0
        result = check_tiled_attention(tiled_loop(rule))
    report = flat(result)
    assert not result
    assert f"likely mistake: {name}" in report, report
    assert "block_q=" in report and "causal=" in report and "first wrong row" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert all(name in d for d in diagnosed), diagnosed


def test_tiled_not_implemented_and_exceptions():
    def stub(q, k, v, block_q, block_k, causal):
        raise NotImplementedError("write the tiled loop")

    result = check_tiled_attention(stub)
    assert not result and NOT_IMPLEMENTED in str(result)

    def only_causal(q, k, v, block_q, block_k, causal):
        if not causal:
            raise ValueError("causal only")
        return tiled_correct(q, k, v, block_q, block_k, causal)

    result = check_tiled_attention(only_causal)
    assert "raised ValueError: causal only" in str(result)
    assert all("causal=False" in f.case for f in result.failures)


def test_tiled_reports_nan_rows():
    def nan_last_row(q, k, v, block_q, block_k, causal):
        O = tiled_correct(q, k, v, block_q, block_k, causal)
        O[-1, 0] = np.nan
        return O

    result = check_tiled_attention(nan_last_row)
    assert not result
    assert "got nan" in str(result)
    # the first case is 64 x 64: the wrong element is row 63, column 0
    assert result.failures[0].problem.startswith("row 63 (the first wrong row), column 0: ")
    assert result.failures[0].diagnosis is None  # no known mistake puts one NaN there


# ---------------------------------------------------------------------------
# Float32 precision


@pytest.mark.parametrize("returns", [np.float32, np.float64])
def test_tiled_calls_a_float32_solution_a_precision_problem(returns):
    with np.errstate(all="ignore"):
        result = check_tiled_attention(in_float32(tiled_correct, returns))
    assert not result, str(result)
    # float32 passes the moderate cases; scores near 1000 lose 6e-5 to rounding
    assert all(f.case.startswith("large scores") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)
    assert "likely mistake: float32 precision" in str(result)


@pytest.mark.parametrize("returns", [np.float32, np.float64])
def test_one_query_calls_a_float32_solution_a_precision_problem(returns):
    """As the module says: float32 passes the moderate cases, not scores near 1000 (two keys
    tied for the maximum, their values opposite: float32's rounding of the scores moves the
    output past the tolerance)."""
    with np.errstate(all="ignore"):
        result = check_one_query_attention(in_float32(one_query_correct, returns))
    assert not result, str(result)
    assert all(f.case.startswith("large scores") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)


def test_a_float32_solution_with_a_real_mistake_is_told_the_mistake():
    with np.errstate(all="ignore"):
        result = check_tiled_attention(in_float32(tiled_loop("bottom_right")))
    assert f"likely mistake: {BOTTOM_RIGHT}" in flat(result)
    assert PRECISION not in str(result)
