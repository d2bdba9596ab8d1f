"""naive_softmax, safe_softmax and online_softmax against the float64 reference."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import assert_close, no_warnings, rel_error, softmax_lowp, softmax_ref

from flashref import naive_softmax, online_softmax, safe_softmax

# float64 tolerance: every entry of the result is exp(x - m) / l with l a sum of at most
# ~100 terms; exp, the sum and the division each cost a few units of roundoff (1.1e-16),
# and online_softmax adds one rounded rescaling factor per block, so the normwise relative
# error stays below ~1e-14. 1e-12 leaves a wide margin without hiding a real bug (a wrong
# rescaling is off by O(1)).
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def random_scores(rng, shape, spread=10.0):
    return rng.uniform(-spread, spread, size=shape)


@pytest.mark.parametrize("shape, axis", [((1,), -1), ((7,), 0), ((3, 50), -1), ((4, 5, 6), 1)])
def test_safe_and_online_match_reference_float64(shape, axis):
    x = random_scores(np.random.default_rng(0), shape)
    expected = softmax_ref(x, axis=axis)
    assert_close(safe_softmax(x, axis=axis), expected, RTOL64, "safe_softmax")
    for block_size in (1, 3, 64):
        assert_close(online_softmax(x, block_size, axis=axis), expected, RTOL64, "online")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_error_at_most_twice_naive(dtype):
    # CONVENTIONS: the error against the float64 reference may be at most ~2x that of a
    # same-precision naive computation; one unit roundoff eps is added because the naive
    # result can be exact by luck, while our result is rounded once more to the input dtype.
    x = random_scores(np.random.default_rng(1), (6, 77)).astype(dtype)
    expected = softmax_ref(x)  # float64, from the already-rounded inputs
    naive_err = rel_error(softmax_lowp(x, dtype), expected)
    bound = 2 * naive_err + np.finfo(dtype).eps
    for name, out in (("safe", safe_softmax(x)), ("online", online_softmax(x, 16))):
        assert out.dtype == dtype
        assert rel_error(out, expected) <= bound, (name, rel_error(out, expected), naive_err)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_output_dtype_is_input_dtype(dtype):
    x = np.linspace(-3, 3, 12).reshape(3, 4).astype(dtype)
    assert naive_softmax(x).dtype == dtype
    assert safe_softmax(x).dtype == dtype
    assert online_softmax(x, 3).dtype == dtype


def test_naive_matches_reference_when_exp_fits():
    x = random_scores(np.random.default_rng(2), (5, 33))
    assert_close(naive_softmax(x), softmax_ref(x), RTOL64, "naive_softmax")


@pytest.mark.parametrize(
    "dtype, big",
    [(np.float64, 1000.0), (np.float32, 100.0), (np.float16, 12.0)],
    ids=["float64-1000", "float32-100", "float16-12"],
)
def test_naive_softmax_overflows_and_warns(dtype, big):
    # exp overflows above ~709.8 (float64), ~88.7 (float32), ~11.1 (float16). The library
    # must not hide this: NumPy's RuntimeWarnings come through and the result is NaN.
    x = (big + np.log(np.arange(1.0, 5.0))).astype(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = naive_softmax(x)
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert any("overflow encountered in exp" in m for m in messages), messages
    assert any("invalid value encountered in divide" in m for m in messages), messages  # inf/inf
    assert out.dtype == dtype
    assert np.isnan(out).all()
    with no_warnings():  # the same scores, safely: the seed example's weights 1/10 .. 4/10
        safe = safe_softmax(x)
    # exp, the sum, the division and the final rounding to dtype each cost at most about
    # one unit roundoff of dtype: 4 eps.
    assert_close(safe, softmax_ref(x), 4 * np.finfo(dtype).eps, "safe_softmax")


def test_safe_and_online_do_not_warn_on_large_scores():
    x = 1000.0 + random_scores(np.random.default_rng(3), (4, 40))
    with no_warnings():
        assert_close(safe_softmax(x), softmax_ref(x), RTOL64, "safe")
        assert_close(online_softmax(x, 7), softmax_ref(x), RTOL64, "online")


@settings(max_examples=200, deadline=None)
@given(
    rng=rngs,
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
)
def test_online_equals_safe_for_any_block_size(rng, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    block_size = data.draw(st.integers(1, shape[axis] + 2), label="block_size")
    x = random_scores(rng, shape, spread=50.0)
    with no_warnings():
        online = online_softmax(x, block_size, axis=axis)
        safe = safe_softmax(x, axis=axis)
    assert_close(online, safe, RTOL64, "online vs safe")
    assert_close(online, softmax_ref(x, axis=axis), RTOL64, "online vs reference")


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n=st.integers(1, 60), b1=st.integers(1, 64), b2=st.integers(1, 64))
def test_online_softmax_is_tile_size_invariant(rng, n, b1, b2):
    x = random_scores(rng, (3, n))
    assert_close(online_softmax(x, b1), online_softmax(x, b2), RTOL64, f"blocks {b1} vs {b2}")


@settings(max_examples=100, deadline=None)
@given(rng=rngs, n=st.integers(1, 40), c=st.floats(-1000, 1000), block_size=st.integers(1, 8))
def test_softmax_is_invariant_to_shifting_a_row(rng, n, c, block_size):
    # x + c is rounded to float64: each score moves by at most ulp(1010)/2 ~ 1.1e-13, so each
    # exp(x) changes by that relative amount: the result agrees to ~2e-13 < RTOL64.
    x = random_scores(rng, (2, n))
    shift = np.array([[c], [-c]])  # a different constant for each row
    assert_close(safe_softmax(x + shift), safe_softmax(x), RTOL64, "safe")
    assert_close(
        online_softmax(x + shift, block_size), online_softmax(x, block_size), RTOL64, "online"
    )


def test_online_softmax_of_an_empty_axis_is_empty():
    x = np.zeros((3, 0))
    assert online_softmax(x, 4).shape == (3, 0)
    assert safe_softmax(x).shape == (3, 0)


def test_seed_example_weights():
    # Scores 1000 + log(i), i = 1..4: softmax weights are i / 10 exactly in real arithmetic.
    x = 1000.0 + np.log(np.arange(1.0, 5.0))
    expected = np.arange(1.0, 5.0) / 10
    for out in (safe_softmax(x), online_softmax(x, 1), online_softmax(x, 2)):
        # 1000 + log(i) is rounded to ulp(1000)/2 = 5.7e-14, so weights agree to ~1e-13.
        assert_close(out, expected, 1e-12, "seed weights")
    assert math.isclose(sum(safe_softmax(x)), 1.0, rel_tol=1e-15)


# ---- rows that are not ordinary numbers ------------------------------------------------------

SOFTMAX = {
    "naive": naive_softmax,
    "safe": safe_softmax,
    "online": lambda x, axis=-1: online_softmax(x, 3, axis=axis),
}


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0])
def test_a_row_of_only_minus_inf_gives_zeros_without_a_warning(name, dtype, axis):
    # The attention functions' rule for a fully masked query, and SoftmaxState's for an
    # empty row (m = -inf, l = 0, result 0). The other rows must not notice.
    x = random_scores(np.random.default_rng(4), (4, 7), spread=2.0).astype(dtype)
    x[2] = -np.inf
    fn = SOFTMAX[name]
    with no_warnings():  # along axis 0 the same numbers are columns: x.T (7, 4)
        out = fn(x, axis=-1) if axis == -1 else fn(x.T, axis=0).T
    assert out.dtype == dtype
    assert (out[2] == 0).all() and not np.signbit(out[2]).any()
    others = [0, 1, 3]
    with no_warnings():  # the other rows: exactly what they give on their own
        alone = fn(x[others])
    assert out[others].tobytes() == alone.tobytes()


def test_only_minus_inf_rows_warn_nowhere_under_w_error():
    code = (
        "import numpy as np, flashref as f\n"
        "x = np.full((2, 5), -np.inf); x[1] = 0.0\n"
        "for out in (f.naive_softmax(x), f.safe_softmax(x), f.online_softmax(x, 2)):\n"
        "    assert (out[0] == 0).all() and (out[1] == 0.2).all(), out\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_naive_softmax_still_fails_on_a_row_that_underflows():
    # Only a row of -inf is defined as zeros: a finite row whose exp underflows to 0 is
    # still 0/0 = NaN with NumPy's warning, as chapter 1 shows.
    x = np.array([[-1000.0, -999.0, -998.0], [-np.inf, -np.inf, -np.inf]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = naive_softmax(x)
    assert np.isnan(out[0]).all() and (out[1] == 0).all()
    assert [str(w.message) for w in caught] == ["invalid value encountered in divide"]


@pytest.mark.parametrize("name", SOFTMAX)
def test_a_nan_makes_its_row_nan(name):
    x = np.array([[0.5, np.nan, 1.0], [-np.inf, np.nan, -np.inf], [0.0, 1.0, 2.0]])
    with no_warnings():
        out = SOFTMAX[name](x)
    assert np.isnan(out[:2]).all()
    assert_close(out[2], softmax_ref(x[2]), RTOL64, "the ordinary row")


@pytest.mark.parametrize("name", SOFTMAX)
def test_a_plus_inf_gives_what_the_module_docstring_says(name):
    # safe and online: inf - inf is NaN, so the whole row; naive: inf / inf at the +inf
    # entries, finite / inf = 0 elsewhere. NumPy warns about the invalid operation.
    x = np.array([[1.0, np.inf, -np.inf, 2.0], [0.0, 1.0, 2.0, 3.0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = SOFTMAX[name](x)
    assert caught and all("invalid value" in str(w.message) for w in caught)
    if name == "naive":
        np.testing.assert_array_equal(out[0], [0.0, np.nan, 0.0, 0.0])
    else:
        assert np.isnan(out[0]).all()
    assert_close(out[1], softmax_ref(x[1]), RTOL64, "the ordinary row")
