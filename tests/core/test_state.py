"""SoftmaxState, merge_states and streaming_weighted_sum."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import assert_close, no_warnings, weighted_sum_ref

from flashref import SoftmaxState, merge_states, streaming_weighted_sum

# float64 tolerance: a state's l and o are sums of at most ~100 terms, each rescaled by a
# handful of rounded factors exp(m_old - m_new); the normwise relative error is a few
# hundred units of roundoff (1.1e-16) at most. 1e-12 is far above that and far below any
# real mistake (a missed or inverted rescaling is off by a factor like e^(m_old - m_new)).
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def lse_ref(s):
    """log(sum(exp(s))) per row, in float64 with an exactly rounded sum."""
    s = np.asarray(s, dtype=np.float64)
    m = s.max(axis=-1)
    sums = [math.fsum(row) for row in np.exp(s - m[..., None]).reshape(-1, s.shape[-1])]
    return m + np.log(np.array(sums).reshape(m.shape))


def output_ref(s, v):
    """softmax(s) @ v per row in float64: the weighted average of the value rows."""
    w = np.exp(s - s.max(axis=-1, keepdims=True))  # (..., N)
    return (w @ v) / w.sum(axis=-1, keepdims=True)


def random_part(rng, rows, n, dv, offset=0.0):
    """Scores (rows, n) around ``offset`` and the values (n, dv) that the rows share."""
    s = offset + rng.uniform(-5, 5, size=(rows, n))  # (Br, n)
    v = rng.standard_normal((n, dv))  # (n, dv)
    return s, v


def assert_states_bitwise_equal(a: SoftmaxState, b: SoftmaxState):
    for name in ("m", "l", "o"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), f"{name} differs bitwise"


# ---- streaming_weighted_sum: the worked example -------------------------------------------


@pytest.mark.parametrize("tile_size", [1, 2, 3, 4, 5])
def test_seed_example_gives_30_without_overflow(tile_size):
    # Scores 1000 + log(i), values 10, 20, 30, 40: weights i/10, result 1 + 4 + 9 + 16 = 30.
    scores = 1000.0 + np.log(np.arange(1.0, 5.0))
    values = np.array([10.0, 20.0, 30.0, 40.0])
    with no_warnings():  # exp(1000) is never formed: no overflow warning
        result = streaming_weighted_sum(scores, values, tile_size)
    assert isinstance(result, float)
    # Scores carry rounding ~ulp(1000)/2 = 5.7e-14, so the weights and the result are
    # exact to ~1e-13 relative; 1e-12 keeps a margin.
    assert math.isclose(result, 30.0, rel_tol=1e-12), result
    assert f"{result:.6f}" == "30.000000"


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n=st.integers(1, 50), tile_size=st.integers(1, 60), offset=st.floats(-1e3, 1e3))
def test_streaming_weighted_sum_matches_reference(rng, n, tile_size, offset):
    scores = offset + rng.uniform(-20, 20, size=n)
    values = rng.standard_normal(n)
    with no_warnings():
        got = streaming_weighted_sum(scores, values, tile_size)
    expected = weighted_sum_ref(scores, values)
    # Normwise: the result is a convex combination of the values, so compare on their scale.
    assert abs(got - expected) <= RTOL64 * np.abs(values).max(), (got, expected)


def test_streaming_weighted_sum_accepts_float32_and_float16():
    scores = (10.0 + np.log(np.arange(1.0, 5.0))).astype(np.float16)
    values = np.array([10, 20, 30, 40], dtype=np.float32)
    # The inputs are rounded to float16/float32, then everything runs in float64: the result
    # matches the float64 reference of those rounded inputs to a few units of roundoff.
    got = streaming_weighted_sum(scores, values, 3)
    assert math.isclose(got, weighted_sum_ref(scores, values), rel_tol=1e-13)


# ---- SoftmaxState ---------------------------------------------------------------------------


def test_from_scores_holds_max_sum_and_unnormalised_output():
    rng = np.random.default_rng(0)
    s, v = random_part(rng, 3, 9, 4)
    state = SoftmaxState.from_scores(s, v)
    np.testing.assert_array_equal(state.m, s.max(axis=-1))
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    assert_close(state.l, w.sum(axis=-1), RTOL64, "l")
    assert_close(state.o, w @ v, RTOL64, "o")  # unnormalised: not divided by l
    assert_close(state.result(), output_ref(s, v), RTOL64, "result")
    assert_close(state.lse(), lse_ref(s), RTOL64, "lse")


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n=st.integers(1, 40), block=st.integers(1, 45), offset=st.floats(-1e3, 1e3))
def test_update_block_by_block_equals_one_block(rng, n, block, offset):
    s, v = random_part(rng, 4, n, 3, offset)
    state = SoftmaxState.empty((4,), dv=3)
    with no_warnings():
        for start in range(0, n, block):
            state = state.update(s[:, start : start + block], v[start : start + block])
    assert_close(state.result(), output_ref(s, v), RTOL64, "result")
    assert_close(state.lse(), lse_ref(s), RTOL64, "lse")
    assert_close(state.m, s.max(axis=-1), 0.0, "m")  # the maximum is exact


def test_softmax_only_state_tracks_no_output():
    s = np.array([[0.0, 1.0, 2.0]])
    state = SoftmaxState.from_scores(s)
    assert state.o is None
    assert_close(state.lse(), lse_ref(s), RTOL64, "lse")


def test_empty_and_fully_masked_states_give_zeros_and_minus_inf():
    with no_warnings():
        empty = SoftmaxState.empty((2,), dv=3)
        masked = SoftmaxState.from_scores(np.full((2, 5), -np.inf), np.ones((5, 3)))
        for state in (empty, masked):
            np.testing.assert_array_equal(state.result(), np.zeros((2, 3)))
            np.testing.assert_array_equal(state.lse(), np.full(2, -np.inf))
            assert not np.isnan(state.l).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_keeps_its_dtype(dtype):
    s = np.array([[0.5, -1.0]], dtype=dtype)
    v = np.ones((2, 2), dtype=dtype)
    state = SoftmaxState.from_scores(s, v)
    for arr in (state.m, state.l, state.o, state.lse(), state.result()):
        assert arr.dtype == dtype


# ---- merge_states ---------------------------------------------------------------------------

# The parts of a row may sit at very different offsets, so that merging must rescale one
# side by a tiny factor; one part may be empty (m = -inf) or fully masked.
offsets = st.sampled_from([0.0, 30.0, -30.0, 700.0, -np.inf])


def make_state(rng, n, offset, dv=3, rows=4):
    if offset == -np.inf or n == 0:  # nothing seen, or every score masked
        return SoftmaxState.from_scores(np.full((rows, n), -np.inf), np.ones((n, dv)))
    s, v = random_part(rng, rows, n, dv, offset)
    return SoftmaxState.from_scores(s, v)


@settings(max_examples=200, deadline=None)
@given(rng=rngs, n1=st.integers(0, 20), n2=st.integers(0, 20), o1=offsets, o2=offsets)
def test_merge_is_exactly_commutative(rng, n1, n2, o1, o2):
    # m = max(a.m, b.m) and l = a.l * alpha_a + b.l * alpha_b: every floating-point operation
    # involved is commutative, so swapping the arguments must give the same bits.
    a, b = make_state(rng, n1, o1), make_state(rng, n2, o2)
    with no_warnings():
        assert_states_bitwise_equal(merge_states(a, b), merge_states(b, a))


@settings(max_examples=200, deadline=None)
@given(
    rng=rngs,
    sizes=st.tuples(st.integers(0, 15), st.integers(0, 15), st.integers(0, 15)),
    offs=st.tuples(offsets, offsets, offsets),
)
def test_merge_is_associative_up_to_rounding(rng, sizes, offs):
    a, b, c = (make_state(rng, n, off) for n, off in zip(sizes, offs, strict=True))
    with no_warnings():
        left = merge_states(merge_states(a, b), c)
        right = merge_states(a, merge_states(b, c))
    # Rounding: each grouping applies two rescalings (exp of a difference) and two
    # multiply-adds per row, a few units of roundoff apart: far below RTOL64.
    np.testing.assert_array_equal(left.m, right.m)  # max is exact in any order
    assert_close(left.l, right.l, RTOL64, "l")
    assert_close(left.result(), right.result(), RTOL64, "result")
    assert_close(left.lse(), right.lse(), RTOL64, "lse")


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n1=st.integers(1, 20), n2=st.integers(1, 20), o1=offsets, o2=offsets)
def test_merge_of_parts_equals_the_whole(rng, n1, n2, o1, o2):
    o1 = 0.0 if o1 == -np.inf else o1
    o2 = 0.0 if o2 == -np.inf else o2
    s1, v1 = random_part(rng, 4, n1, 3, o1)
    s2, v2 = random_part(rng, 4, n2, 3, o2)
    with no_warnings():
        merged = merge_states(SoftmaxState.from_scores(s1, v1), SoftmaxState.from_scores(s2, v2))
    s, v = np.concatenate([s1, s2], axis=-1), np.concatenate([v1, v2], axis=-2)
    assert_close(merged.result(), output_ref(s, v), RTOL64, "result")
    assert_close(merged.lse(), lse_ref(s), RTOL64, "lse")


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n1=st.integers(1, 20), n2=st.integers(1, 20), c=st.floats(-1e3, 1e3))
def test_merge_is_invariant_to_shifting_all_scores(rng, n1, n2, c):
    s1, v1 = random_part(rng, 4, n1, 3)
    s2, v2 = random_part(rng, 4, n2, 3)

    def merged(shift):
        a = SoftmaxState.from_scores(s1 + shift, v1)
        b = SoftmaxState.from_scores(s2 + shift, v2)
        return merge_states(a, b)

    base, shifted = merged(0.0), merged(c)
    # s + c is rounded (|s + c| <= 1005: error <= 1.1e-13), which moves each weight by that
    # relative amount: the outputs agree to ~2e-13.
    assert_close(shifted.result(), base.result(), RTOL64, "result")
    assert_close(shifted.l, base.l, RTOL64, "l")
    # lse moves by exactly c (up to the same rounding, on the scale of |c| + |lse|).
    diff = shifted.lse() - (base.lse() + c)
    assert np.abs(diff).max() <= RTOL64 * (abs(c) + np.abs(base.lse()).max())


def test_merge_with_an_empty_state_is_the_identity_bitwise():
    rng = np.random.default_rng(5)
    a = make_state(rng, 6, 30.0)
    empty = SoftmaxState.empty((4,), dv=3)
    with no_warnings():  # exp(-inf - m) = 0 exactly and exp(m - m) = 1 exactly
        assert_states_bitwise_equal(merge_states(a, empty), a)
        assert_states_bitwise_equal(merge_states(empty, empty), empty)


# ---- what a state accepts: checked once, at construction and per call, without copies -----


def test_construction_checks_the_fields():
    m, l, o = np.zeros(3), np.ones(3), np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"l has shape \(1,\) but m has \(3,\)"):
        SoftmaxState(m, np.ones(1))  # no silent broadcast of l over the rows
    for bad in (np.zeros((2, 2)), np.zeros(3), np.zeros((3, 2, 1)), np.float64(0)):
        with pytest.raises(
            ValueError, match=r"o has shape .*; expected m's shape \(3,\) \+ \(dv,\)"
        ):
            SoftmaxState(m, l, bad)
    for name, args in (
        ("m", (m.astype(int), l)),
        ("l", (m, l > 0)),
        ("o", (m, l, o.astype(complex))),
    ):
        with pytest.raises(TypeError, match=f"{name} has dtype .*; expected float16"):
            SoftmaxState(*args)


def test_construction_keeps_float_arrays_and_converts_array_likes():
    m, l, o = np.zeros(3), np.ones(3, dtype=np.float32), np.zeros((3, 2))
    state = SoftmaxState(m, l, o)
    assert state.m is m and state.l is l and state.o is o  # no copy in the inner loop
    listed = SoftmaxState([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], o.tolist())
    assert_states_bitwise_equal(listed, SoftmaxState(m, l.astype(np.float64), o))
    scalar = SoftmaxState(-np.inf, 0.0)  # one row, no row axes
    assert scalar.m.shape == () and scalar.lse() == -np.inf


def test_update_and_from_scores_convert_lists_like_every_other_function():
    s, v = random_part(np.random.default_rng(7), 3, 6, 2)
    expected = SoftmaxState.empty((3,), dv=2).update(s, v)
    assert_states_bitwise_equal(
        SoftmaxState.empty((3,), dv=2).update(s.tolist(), v.tolist()), expected
    )
    assert_states_bitwise_equal(SoftmaxState.from_scores(s.tolist(), v.tolist()), expected)
    with pytest.raises(TypeError, match="s has dtype int64"):
        SoftmaxState.empty((3,)).update(np.zeros((3, 4), dtype=np.int64))
    with pytest.raises(TypeError, match="v has dtype bool"):
        SoftmaxState.empty((3,), dv=2).update(s, v > 0)
    for call in (lambda: SoftmaxState.empty(()).update(1.0), lambda: SoftmaxState.from_scores(1.0)):
        with pytest.raises(ValueError, match=r"s has shape \(\); expected \(\) \+ \(Bc,\)"):
            call()


def test_empty_checks_its_arguments():
    with pytest.raises(ValueError, match="dv must be >= 0, got -1"):
        SoftmaxState.empty((3,), dv=-1)
    with pytest.raises(TypeError, match="dv must be an int, got float"):
        SoftmaxState.empty((3,), dv=2.0)
    with pytest.raises(TypeError, match="dtype is int64; expected float16"):
        SoftmaxState.empty((3,), dtype=np.int64)
    assert SoftmaxState.empty((3,), dv=np.int64(0)).o.shape == (3, 0)


@pytest.mark.parametrize("bad", ["x", None, (np.zeros(3), np.ones(3)), np.zeros(3)], ids=repr)
def test_merge_takes_only_states(bad):
    a = SoftmaxState.empty((3,))
    with pytest.raises(TypeError, match=f"b must be a SoftmaxState, got {type(bad).__name__}"):
        merge_states(a, bad)
    with pytest.raises(TypeError, match=f"a must be a SoftmaxState, got {type(bad).__name__}"):
        merge_states(bad, a)


@pytest.mark.parametrize("dv_b", [1, 5, 0])
def test_merge_refuses_outputs_of_different_widths(dv_b):
    # width 1 would broadcast silently into width 2; width 5 would be NumPy's broadcast error
    a, b = SoftmaxState.empty((3,), dv=2), SoftmaxState.empty((3,), dv=dv_b)
    expected = rf"different widths dv: a.o \(3, 2\), b.o \(3, {dv_b}\)"
    with pytest.raises(ValueError, match=expected):
        merge_states(a, b)
    with pytest.raises(ValueError, match=rf"a.o \(3, {dv_b}\), b.o \(3, 2\)"):
        merge_states(b, a)
