"""Chapter 6's checkers: right answers pass, planted mistakes are named, placeholders said.

The right solutions are written as a reader would, from the chapter's loops and formulas;
each planted solution has a single mistake, and the checker must fail it and name that
mistake on every case it names anything.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from exercise_report import assert_named, assert_not_implemented_line
from reference import no_warnings

from flashref import io_model as io
from flashref.exercises import _traffic_mistakes as tm
from flashref.exercises import check_crossing_memory, check_l2_fit, check_q_outer_traffic


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    with no_warnings():
        yield


# --- Exercise 6.1 ----------------------------------------------------------------------------


def crossing(itemsize=2, step=2, unit=1, other=False, last=False):
    """The chapter's search, one fp16 element at a time, with one planted mistake."""

    def fn(N, d, order):
        if other:
            order = "q_outer" if order == "kv_outer" else "kv_outer"
        standard = io.standard_traffic(N, N, d, itemsize=itemsize).total_bytes
        M = 4 * d * itemsize
        while io.flash_traffic(N, N, d, M, order=order, itemsize=itemsize).total_bytes >= standard:
            M += step
        return (M - step if last else M) // unit

    return fn


def test_the_crossing_search_passes():
    result = check_crossing_memory(crossing())
    assert result and result.cases_run == 2, str(result)


@pytest.mark.parametrize(
    "fn, name",
    [
        (crossing(unit=2), tm.ELEMENTS),
        (lambda N, d, order: 6 * d * d, tm.ESTIMATE),
        (crossing(last=True), tm.LAST_NOT_FEWER),
        (crossing(other=True), tm.ORDER_SWAPPED),
        (crossing(itemsize=4, step=4), tm.FLOAT32),
    ],
    ids=["elements", "estimate", "last_not_fewer", "order_swapped", "float32"],
)
def test_each_crossing_mistake_is_named(fn, name):
    assert_named(check_crossing_memory(fn), name)


def test_the_crossing_is_where_the_bytes_cross():
    # the reference is the first M that moves fewer bytes: one element less does not
    for N, d in ((4096, 64), (1000, 32)):
        for order in ("kv_outer", "q_outer"):
            M = tm.first_fewer(N, d, order)
            standard = io.standard_traffic(N, N, d).total_bytes
            assert io.flash_traffic(N, N, d, M, order=order).total_bytes < standard
            assert io.flash_traffic(N, N, d, M - 2, order=order).total_bytes >= standard


# --- Exercise 6.2 ----------------------------------------------------------------------------


def q_outer(kv_outer=False, kv_once=False, lse_bytes=4, floor=False, tiles="all", apart=1):
    """Bytes and key tiles from the loop's shape, with one planted mistake."""

    def fn(Nq, Nk, d, Br, Bc):
        div = (lambda a, b: a // b) if floor else (lambda a, b: -(-a // b))
        Tr, Tc = div(Nq, Br), div(Nk, Bc)
        kv = (1 if kv_once else -(-Nq // Br)) * 2 * Nk * d * 2
        nbytes = Nq * d * 2 + kv + Nq * d * 2 + Nq * lse_bytes
        if kv_outer:
            nbytes = io.walk_kv_outer(Nq, Nk, d, Br=Br, Bc=Bc).total_bytes
        return nbytes, apart * (Tr * Tc if tiles == "all" else Tc)

    return fn


def test_the_q_outer_count_passes():
    result = check_q_outer_traffic(q_outer())
    assert result and result.cases_run == 4, str(result)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kv_outer": True}, tm.KV_OUTER_BYTES),
        ({"kv_once": True}, tm.KV_ONCE),
        ({"lse_bytes": 2}, tm.LSE_FP16),
        ({"lse_bytes": 0}, tm.NO_LSE),
        ({"tiles": "one"}, tm.ONE_QUERY_TILE),
        ({"floor": True}, tm.FLOOR_TILES),
        ({"apart": 2}, tm.K_AND_V_APART),
    ],
)
def test_each_q_outer_mistake_is_named(kwargs, name):
    assert_named(check_q_outer_traffic(q_outer(**kwargs)), name)


def test_bc_leaves_the_bytes_alone():
    # the exercise's point, in the reference itself
    sizes = {io.walk_q_outer(2048, 2048, 64, Br=128, Bc=Bc).total_bytes for Bc in (16, 64, 256)}
    assert len(sizes) == 1


# --- Exercise 6.3 ----------------------------------------------------------------------------


def l2_fit(per_element=2, arrays=2, heads_too=True, plus=0):
    def fn(d, l2_bytes, heads):
        share = l2_bytes // heads if heads_too else l2_bytes
        return share // (arrays * d * per_element) + plus

    return fn


def test_the_l2_fit_passes():
    result = check_l2_fit(l2_fit())
    assert result and result.cases_run == 2, str(result)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"arrays": 1}, tm.K_ONLY),
        ({"per_element": 4}, tm.FOUR_BYTES),
        ({"heads_too": False}, tm.ONE_HEAD),
        ({"plus": 1}, tm.FIRST_OVER),
    ],
)
def test_each_l2_fit_mistake_is_named(kwargs, name):
    assert_named(check_l2_fit(l2_fit(**kwargs)), name)


# --- placeholders and unknown mistakes -------------------------------------------------------

CHECKERS = [check_crossing_memory, check_q_outer_traffic, check_l2_fit]


@pytest.mark.parametrize("checker", CHECKERS)
def test_not_implemented_is_one_line(checker):
    assert_not_implemented_line(checker)


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_nan_placeholder_is_not_implemented(checker):
    pair = checker is check_q_outer_traffic
    result = checker(lambda *args: (math.nan, np.nan) if pair else np.nan)
    assert str(result) == (
        f"{checker.__name__}: not implemented yet (all {result.cases_run} cases returned only NaN)"
    )


def test_an_unknown_wrong_answer_fails_without_a_name():
    result = check_l2_fit(lambda d, l2_bytes, heads: 1000)
    assert not result and "likely mistake" not in str(result)
    assert "expected" in str(result) and "got 1000" in str(result)
