"""How close a GPU kernel must come to the float64 reference: FlashAttention's rule, once.

A kernel's relative error against float64 may be at most about twice the error of the naive
algorithm (matmul, softmax, matmul) run in the kernel's own precision on the same inputs, plus a
small floor for inputs where that naive error happens to be exactly zero, and never above an
absolute ceiling per dtype. ``tests/gpu/test_forward.py`` applies it to every version; chapter 7
prints it for bf16. The backward kernels have the same rule with their own ceilings (below).
``host_dtype`` names the NumPy dtype a kernel dtype is checked in (bfloat16 from ml_dtypes).
"""

from __future__ import annotations

import numpy as np

# Floors: where naive and kernel both happen to be (nearly) exact, e.g. Nk = 1, the 2x rule
# degenerates to 0; the floor is a few units of the output's rounding.
#  fp16 output: each element is rounded once to fp16 (relative 2^-11 ~ 4.9e-4); 1e-3 is two such.
#  bf16 output: 8 significand bits (relative 2^-8 ~ 3.9e-3 per rounding); 8e-3 is two such.
#  fp32 output: __expf's error grows with |x| (2 + 1.2|x| ulp); for the scores that carry the
#  weight, |x| <= ~10 gives <= 14 ulp ~ 1.7e-6 relative, so 2e-6.
FLOOR = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 2e-6}
# Ceilings: whatever the naive error, the kernel must stay under these. fp16: inputs to the
# second product (P) are rounded to fp16 (2^-11) and so is O: ~1e-3 typical; 4e-3 leaves room
# for long rows. bf16: the same reasoning with 2^-8 in place of 2^-11: 3.2e-2 (8 roundings).
# fp32: the fp32 arithmetic lands far under 1e-5.
CEILING = {"float16": 4e-3, "bfloat16": 3.2e-2, "float32": 1e-5}
# lse: float32 log(l) + m from fp32 scores; |lse| ~ log(Nk) + max score <= ~15, whose fp32 ulp
# is ~1e-6; scores are sums of d products (rounding ~ sqrt(d) ulp): 2e-5 (1 + |lse|) covers it.
LSE_TOL = 2e-5


def tolerance(dtype: str, naive_err: float) -> float:
    """The largest relative error a kernel of ``dtype`` may have, given the naive error."""
    return min(2 * naive_err + FLOOR[dtype], CEILING[dtype])


# ---- the backward pass (dQ, dK, dV): the same 2x-naive rule, its own ceilings ------------------
# The naive baseline is autograd's algorithm run in the kernel's precision (softmax, then
# dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D), dQ = dS K, dK = dS^T Q, each
# stored intermediate rounded to the dtype). Floors are those of the forward (each gradient is
# rounded once to the output dtype). Ceilings: a backward kernel rounds P and dS to the 16-bit
# dtype before three products, and dS = P * (dP - D) is a difference of close numbers, so its
# error is a few times the forward's: 1e-2 (fp16) and 8e-2 (bf16), 20 and 2.5 times each
# dtype's rounding unit (2^-11, 2^-8), leave room for long rows without letting a wrong
# kernel through.
BWD_CEILING = {"float16": 1e-2, "bfloat16": 8e-2}


def atomic_allowance(Tc: int) -> float:
    """Extra relative error of a float32 sum of ``Tc`` terms added in any order (dQ by atomics).

    Each addition rounds by at most 2^-24 of the running sum, so the sum's error is at most
    ``Tc * 2^-24`` of the sum of the terms' magnitudes; for terms of random sign that sum is
    about ``sqrt(Tc)`` times the result's size: ``Tc^1.5 * 2^-24`` relative to the result.
    """
    return Tc**1.5 * 2.0**-24


def backward_tolerance(dtype: str, naive_err: float, Tc_atomic: int = 0) -> float:
    """The largest relative error of one gradient of a backward kernel of ``dtype``, given the
    naive backward's error; ``Tc_atomic`` key tiles added into it by float32 atomics."""
    return min(2 * naive_err + FLOOR[dtype] + atomic_allowance(Tc_atomic), BWD_CEILING[dtype])


def host_dtype(name: str):
    """The NumPy dtype for a kernel dtype name; bfloat16 comes from ml_dtypes (as in CuPy)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
