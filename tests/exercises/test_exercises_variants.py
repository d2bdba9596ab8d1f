"""The checkers of the chapter on attention variants: right answers pass, planted mistakes are
named, placeholders said.

Each right solution is written as a reader would, from the chapter's rules (a tile is skipped
when its last key is before its first row's window, masked when a pair in it may not attend;
the sink's dS is ``-P_sink D``; the cap's derivative is ``1 - tanh^2``); each planted solution
has a single mistake, which the checker must name on every case it names anything.
"""

from __future__ import annotations

import numpy as np
import pytest
from exercise_report import assert_named, assert_not_implemented_line
from reference import no_warnings

from flashref.exercises import _variants_mistakes as vm
from flashref.exercises import check_sink_grad, check_softcap_grad, check_window_tiles


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    with no_warnings():
        yield


# --- the tiles of a sliding window ------------------------------------------------------------


def window_tiles(width=0, skip=True, edge_row="first", diagonal_only=False):
    """Pairs (i, j) with i - left <= j <= i, tile by tile, from the pairs themselves."""

    def fn(N, Br, Bc, left):
        left += width
        visited = masked = 0
        for r0 in range(0, N, Br):
            i = np.arange(r0, min(r0 + Br, N))[:, None]
            for c0 in range(0, N, Bc):
                j = np.arange(c0, min(c0 + Bc, N))
                causal = j <= i
                allowed = causal & (j >= i - left)
                reach = i[0 if edge_row == "first" else -1, 0] - left
                if not causal.any() or (skip and j[-1] < reach):
                    continue
                visited += 1
                masked += not (causal.all() if diagonal_only else allowed.all())
        return visited, masked

    return fn


def test_the_window_tiles_pass():
    result = check_window_tiles(window_tiles())
    assert result and result.cases_run == 3, str(result)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"width": -1}, vm.OFF_BY_ONE),
        ({"width": 1}, vm.OFF_BY_ONE),
        ({"skip": False}, vm.NO_WINDOW_SKIP),
        ({"edge_row": "last"}, vm.LAST_ROW_EDGE),
        ({"diagonal_only": True}, vm.CAUSAL_MASK_ONLY),
    ],
)
def test_each_window_mistake_is_named(kwargs, name):
    assert_named(check_window_tiles(window_tiles(**kwargs)), name)


# --- the gradient of a sink -------------------------------------------------------------------


def sink_grad(mistake=None):
    def fn(lse, D, sink):
        P_sink = np.exp(sink - lse) if mistake != "no lse" else np.exp(sink) + 0 * lse  # (B, N)
        dS = P_sink * (0 - (1.0 if mistake == "no D" else D))  # the sink's dP is 0
        total = dS.mean() if mistake == "mean" else dS.sum()
        return float(-total if mistake == "sign" else total)

    return fn


def test_the_sink_gradient_passes():
    result = check_sink_grad(sink_grad())
    assert result and result.cases_run == 4, str(result)


@pytest.mark.parametrize(
    "mistake, name",
    [("sign", vm.SINK_SIGN), ("no D", vm.SINK_NO_D), ("mean", vm.SINK_MEAN)],
)
def test_each_sink_mistake_is_named(mistake, name):
    assert_named(check_sink_grad(sink_grad(mistake)), name)


def test_exp_of_the_sink_alone_is_named_where_it_stays_finite():
    with np.errstate(over="ignore", invalid="ignore"):
        result = check_sink_grad(sink_grad("no lse"))
    assert not result
    diagnosed = {f.diagnosis for f in result.failures if f.diagnosis}
    assert diagnosed == {vm.SINK_NO_LSE}, str(result)


# --- the derivative of a softcap --------------------------------------------------------------


def softcap_grad(mistake=None):
    def fn(dS, S, c):
        capped = c * np.tanh(S / c)
        t = capped / c if mistake != "at capped" else np.tanh(capped / c)
        d = {"unsquared": 1 - t, "over c": (1 - t * t) / c, "no chain": 1.0}
        return dS * d.get(mistake, 1 - t * t)

    return fn


def test_the_softcap_gradient_passes():
    result = check_softcap_grad(softcap_grad())
    assert result and result.cases_run == 3, str(result)


@pytest.mark.parametrize(
    "mistake, name",
    [
        ("unsquared", vm.UNSQUARED),
        ("over c", vm.OVER_C),
        ("at capped", vm.AT_CAPPED),
        ("no chain", vm.NO_CHAIN),
    ],
)
def test_each_softcap_mistake_is_named(mistake, name):
    assert_named(check_softcap_grad(softcap_grad(mistake)), name)


@pytest.mark.parametrize("checker", [check_window_tiles, check_sink_grad, check_softcap_grad])
def test_a_placeholder_reads_as_not_implemented(checker):
    assert_not_implemented_line(checker)


def test_the_answers_are_checked_before_any_arithmetic():
    text = str(check_sink_grad(lambda lse, D, sink: np.zeros(3)))
    assert "expected a single float, got an array of shape (3,)" in text
    text = str(check_softcap_grad(lambda dS, S, c: dS[:, :1]))
    assert "expected shape" in text
    with pytest.raises(TypeError, match="fn must be a function"):
        check_window_tiles(3)
