"""Chapter 7's checkers: right answers pass, planted mistakes are named, placeholders said.

The right solutions are written as a reader would, from the chapter's rules (version 17's
test, version 14's lazy rescale, the L2 walk of FlashAttention-2's order); each planted
solution has a single mistake, which the checker must name on every case it names anything.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from exercise_report import assert_named, assert_not_implemented_line
from reference import no_warnings

from flashref import SoftmaxState
from flashref.exercises import _beyond_mistakes as bm
from flashref.exercises import check_l2_walk, check_lazy_update, check_warp_tiles


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    with no_warnings():
        yield


# --- Exercise 7.1 ----------------------------------------------------------------------------


def warp_tiles(test="last", every_key_tile=False, per_tile=False):
    def fn(N, Br, Bc, warps):
        rows = Br // warps
        skipped = total = 0
        for q0 in range(0, N, Br):
            for c0 in range(0, N if every_key_tile else min(N, q0 + Br), Bc):
                total += 1 if per_tile else warps
                for w in range(warps):
                    first = q0 + w * rows
                    row = {"last": first + rows - 1, "first": first, "block": q0 + Br - 1}[test]
                    skipped += c0 > row
        return skipped, total

    return fn


def test_the_warp_tiles_pass():
    result = check_warp_tiles(warp_tiles())
    assert result and result.cases_run == 4, str(result)


def test_version_17_skips_nothing_at_d_64():
    # Br = Bc = 128: a diagonal tile starts at the block's first row (the chapter's finding)
    assert bm.warp_tiles(4096, 128, 128, 4)[0] == 0 and bm.warp_tiles(4096, 128, 64, 4)[0] > 0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"test": "block"}, bm.PER_BLOCK),
        ({"test": "first"}, bm.FIRST_ROW),
        ({"every_key_tile": True}, bm.ALL_KEY_TILES),
        ({"per_tile": True}, bm.TILES_NOT_WARPS),
    ],
)
def test_each_warp_tile_mistake_is_named(kwargs, name):
    assert_named(check_warp_tiles(warp_tiles(**kwargs)), name)


# --- Exercise 7.2 ----------------------------------------------------------------------------


def lazy(mistake=None):
    """Version 14's rule written out, with one planted mistake by name."""

    def fn(state, s, v, tau):
        if mistake == "converted":
            tau = tau * math.log(2)
        mx = s.max(axis=-1)  # (R,)
        grow = {"absolute": mx > tau, "eager": mx > state.m}.get(mistake, mx - state.m > tau)
        m = np.where(grow, np.maximum(state.m, mx), state.m)  # (R,)
        with np.errstate(over="ignore", invalid="ignore"):
            back = np.exp(m - state.m) if mistake == "wrong_way" else np.exp(state.m - m)
            alpha = np.where(grow & (mistake != "none"), back, 1.0)  # (R,)
            P = np.exp(s - m[:, None])  # (R, Bc)
            l = state.l * alpha + P.sum(axis=-1)
            o = state.o * (1.0 if mistake == "l_only" else alpha[:, None]) + P @ v
        return SoftmaxState(m, l, o)

    return fn


def test_the_lazy_update_passes():
    result = check_lazy_update(lazy())
    assert result and result.cases_run == 7, str(result)


def test_the_eager_update_is_the_lazy_one_at_tau_0():
    # SoftmaxState.update rescales at every growth: the reference with tau = 0 is the same
    rng = np.random.default_rng(0)
    state = SoftmaxState.empty((3,), 2).update(rng.standard_normal((3, 4)), np.ones((4, 2)))
    s, v = rng.standard_normal((3, 4)) + 1, rng.standard_normal((4, 2))
    want, got = state.update(s, v), bm.lazy_update(state, s, v, 0.0)
    for a, b in ((want.m, got.m), (want.l, got.l), (want.o, got.o)):
        np.testing.assert_allclose(a, b, rtol=1e-14)


@pytest.mark.parametrize(
    "mistake, name",
    [
        ("eager", bm.EAGER),
        ("absolute", bm.ABSOLUTE),
        ("l_only", bm.NO_O_RESCALE),
        ("none", bm.NO_RESCALE),
        ("wrong_way", bm.WRONG_WAY),
        ("converted", bm.TAU_CONVERTED),
    ],
)
def test_each_lazy_mistake_is_named(mistake, name):
    assert_named(check_lazy_update(lazy(mistake)), name)


def test_a_float32_state_is_refused():
    def fn(state, s, v, tau):
        new = lazy()(state, s, v, tau)
        return SoftmaxState(*(x.astype(np.float32) for x in (new.m, new.l, new.o)))

    result = check_lazy_update(fn)
    assert not result and "expected dtype float64" in str(result)


# --- Exercise 7.3 ----------------------------------------------------------------------------


def l2_walk(floor=False, kv_reads=None, lse=4, o=True, heads_too=True):
    def fn(N, d, Br, heads):
        Tr = N // Br if floor else -(-N // Br)
        kv = 2 * N * d * 2 * (Tr if kv_reads is None else kv_reads)
        one = N * d * 2 + kv + (N * d * 2 if o else 0) + N * lse
        return one * heads if heads_too else one

    return fn


def test_the_l2_walk_passes():
    result = check_l2_walk(l2_walk())
    assert result and result.cases_run == 3, str(result)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"floor": True}, bm.FLOOR_TR),
        ({"kv_reads": 1}, bm.KV_ONCE),
        ({"lse": 0}, bm.NO_LSE),
        ({"lse": 2}, bm.LSE_FP16),
        ({"heads_too": False}, bm.ONE_HEAD),
        ({"o": False}, bm.NO_O),
    ],
)
def test_each_l2_walk_mistake_is_named(kwargs, name):
    assert_named(check_l2_walk(l2_walk(**kwargs)), name)


# --- placeholders ----------------------------------------------------------------------------

CHECKERS = [check_warp_tiles, check_lazy_update, check_l2_walk]


@pytest.mark.parametrize("checker", CHECKERS)
def test_not_implemented_is_one_line(checker):
    assert_not_implemented_line(checker)


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_nan_placeholder_is_not_implemented(checker):
    def nan(*args):
        if checker is check_lazy_update:
            state, s, v, tau = args
            return SoftmaxState(*(np.full_like(x, np.nan) for x in (state.m, state.l, state.o)))
        return (np.nan, np.nan) if checker is check_warp_tiles else math.nan

    result = checker(nan)
    assert str(result) == (
        f"{checker.__name__}: not implemented yet (all {result.cases_run} cases returned only NaN)"
    )
