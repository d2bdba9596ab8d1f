"""exp2 on the FMA units: the software exponential FlashAttention-4 computes in place of the
special-function unit's ``ex2`` for part of each tile.

The softmax of a tile needs ``2^x`` for every score (``x = (s - m) log2 e <= 0``). On a GPU
``ex2.approx`` runs on the SFU (MUFU), a narrow pipe beside the FMA units; when every
exponential queues there, the tile's softmax waits for it. A polynomial on the FMA units
takes part of the load:

    2^x = 2^j * 2^f,    j = floor(x) (an integer),    f = x - j in [0, 1)

``2^f`` is a polynomial ``p(f)`` of low degree in Horner form (``degree`` multiply-adds), and
``2^j`` costs no arithmetic at all: ``p(f)`` lies in ``[1, 2)``, so its float32 exponent field
holds 127, and adding ``j`` to that field (an integer add of ``j << 23`` to its bits) makes it
``2^j p(f)`` (for ``p(f)`` a hair under 1 or over 2, the field is 126 or 128, and the add is
still right). A result below ``2^-126`` would be subnormal; it is flushed to zero, as
``ex2.approx.ftz`` flushes it (a weight below ``2^-126`` changes no softmax in float32).

``coefficients(degree)`` interpolates ``2^f`` at the Chebyshev points of ``[0, 1]`` (a
near-minimax polynomial, from ``numpy.polynomial``); ``exp2_poly`` evaluates it as a kernel
would, in float32; ``relative_error`` measures it against float64. The error is that of
``p`` on ``[0, 1)`` (the integer add is exact), about 1e-4 at degree 3 and 1e-7 at degree 5:
degree 3 is already below the rounding of ``P`` to bf16 (``2^-9``) or fp16 (``2^-11``)
that the kernels apply before ``P V``. NumPy rounds a multiply and an add separately where
the GPU's FMA rounds once; the difference is a float32 rounding, far below these errors.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import Chebyshev, Polynomial

from .._checks import as_float_array, check_block

__all__ = ["coefficients", "exp2_poly", "relative_error", "FLUSH_BELOW"]

FLUSH_BELOW = -126.0  # 2^x for x below this is subnormal in float32: flushed to 0 (ftz)
MAX_DEGREE = 8


def _degree(degree) -> int:
    return check_block(degree, "degree", minimum=1, maximum=MAX_DEGREE)


def coefficients(degree: int = 3) -> np.ndarray:
    """The float32 coefficients ``c_0 .. c_degree`` (lowest first) of ``p(f) ~ 2^f`` on
    ``[0, 1]``: the polynomial through ``2^f`` at the ``degree + 1`` Chebyshev points of the
    interval, within a small factor of the minimax polynomial's error."""
    fit = Chebyshev.interpolate(np.exp2, _degree(degree), domain=[0.0, 1.0])
    return fit.convert(kind=Polynomial).coef.astype(np.float32)


def exp2_poly(x, degree: int = 3) -> np.ndarray:
    """``2^x`` in float32 without an exponential: range reduction, ``p(f)`` in Horner form,
    and the integer part added to the exponent's bits (see the module).

    ``x`` is any float array (float32 arithmetic, as in a kernel); results below ``2^-126``
    (``-inf``, ``x < -126``) give 0, ``x >= 128`` gives inf, NaN stays NaN.

    Returns:
        A float32 array of ``x``'s shape.
    """
    c = coefficients(degree)
    x = np.asarray(as_float_array(x, "x"), dtype=np.float32)
    with np.errstate(invalid="ignore"):
        top = np.nextafter(np.float32(128.0), np.float32(0.0))  # the largest float32 < 128
        safe = np.clip(np.nan_to_num(x, nan=0.0), FLUSH_BELOW, top)  # (...) no inf, NaN
        j = np.floor(safe)  # the integer part, float32
        f = safe - j  # the fraction in [0, 1), exact in float32
        p = np.full_like(f, c[-1])
        for coef in c[-2::-1]:  # Horner: degree multiply-adds
            p = p * f + coef
        bits = p.view(np.int32) + (j.astype(np.int32) << 23)  # 2^j * p(f): the exponent field
        out = bits.view(np.float32)
        tiny = (x < FLUSH_BELOW) | (bits < 1 << 23)  # below 2^-126 (p(f) may be just under 1)
        out = np.where(tiny, np.float32(0.0), out)  # flushed, as ftz (and -inf)
        huge = (x >= 128.0) | (bits >= 0x7F800000)  # past float32's largest: inf
        out = np.where(huge, np.float32(np.inf), out)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def relative_error(degree: int = 3, points: int = 1 << 16) -> float:
    """The largest ``|exp2_poly(x) / 2^x - 1|`` over ``points`` fractions spread over ``[0, 1)``
    (every ``x`` has one of them: the integer part adds no error), against float64."""
    points = check_block(points, "points", minimum=2)
    f = (np.arange(points, dtype=np.float64) / points).astype(np.float32)
    x = f - 20  # a fraction below 0, where the softmax's arguments lie
    got = exp2_poly(x, degree).astype(np.float64)
    return float(np.abs(got / np.exp2(x.astype(np.float64)) - 1).max())
