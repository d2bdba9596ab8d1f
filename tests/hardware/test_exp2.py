"""The software exp2 (``flashref.hardware.exp2``): exact in its integer part, as accurate as
its polynomial in the fraction, and the special values a softmax meets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashref.hardware.exp2 import FLUSH_BELOW, coefficients, exp2_poly, relative_error


def _chebyshev_bound(degree: int) -> float:
    """The interpolation error bound at the Chebyshev points of [0, 1], relative to 2^f >= 1:
    max|(2^f)^(n+1)| / (n+1)! * 2 (1/4)^(n+1), where (2^f)^(n+1) = (ln 2)^(n+1) 2^f is at most
    2 (ln 2)^(n+1)."""
    n = degree + 1
    return 2 * math.log(2) ** n / math.factorial(n) * 2 * 0.25**n


@pytest.mark.parametrize("degree", range(1, 7))
def test_the_error_is_the_polynomials_and_within_the_chebyshev_bound(degree):
    err = relative_error(degree)
    rounding = 8 * 2.0**-24  # Horner in float32 and the float32 coefficients
    assert err <= _chebyshev_bound(degree) + rounding, (degree, err)
    if degree > 1:
        assert err < relative_error(degree - 1)  # a degree more, a smaller error


def test_degree_3_is_below_the_rounding_of_p_to_16_bits():
    assert relative_error(3) < 2.0**-11  # fp16's half unit in [1, 2); bf16's is 2^-8
    assert relative_error(5) < 4 * 2.0**-24  # degree 5: float32's own rounding


def test_the_integer_part_is_exact():
    """2^(x - k) = 2^x / 2^k bit for bit: j goes into the exponent field, f is unchanged."""
    rng = np.random.default_rng(0)
    x = (-rng.integers(0, 20 * 4096, 1000) / 4096).astype(np.float32)  # x - k stays exact
    for k in (1, 7, 60):
        np.testing.assert_array_equal(exp2_poly(x - k), exp2_poly(x) / np.float32(2.0**k))


def test_the_special_values():
    x = np.array([0.0, -1.0, -125.0, -126.5, -np.inf, np.nan, 127.5, 200.0, np.inf], np.float32)
    got = exp2_poly(x, degree=5)
    assert abs(got[0] - 1) < 1e-6 and abs(got[1] - 0.5) < 1e-6
    assert got[2] == np.float32(2.0**-125) * got[0]  # p(0) times a power of two, exactly
    assert got[3] == 0 and got[4] == 0  # flushed below -126, as ex2.approx.ftz
    assert np.isnan(got[5])
    assert abs(got[6] / np.float32(2.0**127.5) - 1) < 1e-6
    assert np.isposinf(got[7]) and np.isposinf(got[8])
    assert got.dtype == np.float32 and FLUSH_BELOW == -126.0


def test_a_result_below_the_smallest_normal_is_flushed():
    """At x = -126 a p(0) just under 1 would give a subnormal: 0, as ftz gives it."""
    for degree in range(1, 7):
        got = exp2_poly(np.float32(-126.0), degree)
        want = np.float32(2.0**-126) if coefficients(degree)[0] >= 1 else np.float32(0.0)
        assert got == want * (coefficients(degree)[0] if want else 1), degree


def test_the_coefficients_are_those_of_2_to_the_f():
    c = coefficients(4).astype(np.float64)
    assert c.shape == (5,) and c.dtype == np.float64
    assert abs(c[0] - 1) < 1e-5 and abs(c[1] - math.log(2)) < 1e-2  # 2^f = 1 + f ln 2 + ...


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"degree": 0}, ValueError, r"degree must be in 1\.\.8, got 0"),
        ({"degree": 2.0}, TypeError, r"degree must be an int, got float"),
        ({"x": np.arange(3)}, TypeError, r"x has dtype int64"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    args = {"x": np.zeros(3, np.float32), "degree": 3} | kwargs
    with pytest.raises(error, match=match):
        exp2_poly(**args)
