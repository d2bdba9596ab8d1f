"""naive_attention_backward and tiled_attention_backward against finite differences of the
forward, the independent float64 gradients of reference.py, and each other."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    allowed_pairs,
    assert_close,
    assert_grads_close,
    attention_backward_naive_lowp,
    attention_backward_ref,
    no_warnings,
    softmax_ref,
)
from test_memory import peak_bytes

from flashref import (
    naive_attention,
    naive_attention_backward,
    tiled_attention,
    tiled_attention_backward,
)

# float64 tolerance, relative to the size of the terms each gradient entry sums (see
# attention_backward_ref): a gradient entry is a sum of at most Nk (or Nq) products, each
# built from dot products of length d or dv, all <= 130 below; the worst-case (linear)
# bound is a few hundred units of roundoff, ~5e-14. 1e-12 is above that and far below any
# real mistake (a missing scale, a transposed product, D from the wrong rows: all O(1)).
RTOL64 = 1e-12

BOTH = [naive_attention_backward, tiled_attention_backward]
rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def problem(rng, batch, Nq, Nk, d, dv, dtype=np.float64):
    """Random q, k, v and an upstream gradient do."""
    shapes = (batch + (Nq, d), batch + (Nk, d), batch + (Nk, dv), batch + (Nq, dv))
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


def backward(fn, q, k, v, do, block_q=None, block_k=None, **kw):
    """The forward (tiled, returning lse), then ``fn``; block sizes only go to the tiled one."""
    o, lse = tiled_attention(q, k, v, return_lse=True, **kw)
    if fn is tiled_attention_backward and block_q is not None:
        kw.update(block_q=block_q, block_k=block_k)
    return fn(q, k, v, o, lse, do, **kw)


# ---- finite differences of the forward --------------------------------------------------------


def finite_difference_grads(q, k, v, do, h=1e-5, **kw):
    """Central differences of ``L = sum(naive_attention(q, k, v) * do)``, one entry at a time."""
    grads = []
    for which in range(3):
        x = (q, k, v)[which]
        g = np.empty_like(x)
        for idx in np.ndindex(x.shape):
            losses = []
            for step in (h, -h):
                args = [a.copy() for a in (q, k, v)]
                args[which][idx] += step
                losses.append(math.fsum((naive_attention(*args, **kw) * do).ravel()))
            g[idx] = (losses[0] - losses[1]) / (2 * h)
        grads.append(g)
    return grads


FD_CASES = [  # (batch, Nq, Nk, d, dv, options)
    ((), 3, 4, 3, 2, {}),
    ((), 1, 1, 2, 2, {}),
    ((2,), 5, 3, 2, 3, dict(causal=True)),
    ((), 4, 6, 3, 2, dict(mask=np.array([[1, 1, 0, 1, 0, 1]] * 3 + [[0] * 6], dtype=bool))),
    ((), 3, 5, 2, 4, dict(scale=0.7, causal=True)),
]


@pytest.mark.parametrize("batch, Nq, Nk, d, dv, kw", FD_CASES)
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_matches_finite_differences_of_the_forward(fn, batch, Nq, Nk, d, dv, kw):
    # Central differences with h = 1e-5: truncation error ~h^2 = 1e-10 and rounding
    # ~eps * |L| / h = 1e-11 (L = O(1)), so 1e-7 (normwise) leaves a wide margin, while any
    # real mistake in a gradient is O(1). Row 3 of the masked case sees no key at all.
    q, k, v, do = problem(np.random.default_rng(Nq * 100 + Nk), batch, Nq, Nk, d, dv)
    fd = finite_difference_grads(q, k, v, do, **kw)
    grads = backward(fn, q, k, v, do, block_q=2, block_k=2, **kw)
    for name, g, g_fd in zip(("dq", "dk", "dv"), grads, fd, strict=True):
        assert_close(g, g_fd, 1e-7, name)


# ---- the independent float64 reference ------------------------------------------------------

SHAPES = [  # (batch, Nq, Nk, d, dv)
    ((), 1, 1, 1, 1),
    ((), 1, 7, 3, 5),
    ((2,), 13, 1, 8, 8),
    ((), 37, 53, 24, 40),
    ((2, 3), 19, 11, 5, 7),
    ((), 97, 61, 80, 48),
    ((1,), 130, 130, 64, 64),
]


@pytest.mark.parametrize("batch, Nq, Nk, d, dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_float64_matches_reference(fn, batch, Nq, Nk, d, dv, causal):
    q, k, v, do = problem(np.random.default_rng(Nq * 1000 + Nk), batch, Nq, Nk, d, dv)
    expected, sizes = attention_backward_ref(q, k, v, do, causal=causal)
    with no_warnings():
        grads = backward(fn, q, k, v, do, block_q=16, block_k=32, causal=causal)
    assert all(g.dtype == np.float64 for g in grads)
    assert_grads_close(grads, expected, sizes, RTOL64)


def low_precision_bound(err_naive, size, dtype, lse):
    """FlashAttention's rule: at most 2x the error of the same-precision naive backward, plus
    what recomputing P from a stored float32 lse costs (see the test below)."""
    eps, eps32 = np.finfo(dtype).eps, np.finfo(np.float32).eps
    return 2 * err_naive + (eps + 2 * (1 + np.abs(lse).max()) * eps32) * size


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch, Nq, Nk, d, dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_low_precision_error_at_most_twice_naive(fn, batch, Nq, Nk, d, dv, causal, dtype):
    # Errors against the float64 reference of the same (rounded) inputs, measured against
    # the size of the summed terms. The bound is 2x the error of the textbook backward
    # computed entirely in dtype (attention_backward_naive_lowp, which keeps its P), plus:
    # - one unit roundoff of dtype: the final rounding, and where an entry is the
    #   cancellation of larger terms the naive can be exact by luck;
    # - 2 (1 + max|lse|) units of float32 roundoff: P = exp(S - lse) is recomputed from
    #   a float32 lse whose absolute error (its rounding, eps |lse|, plus the log's) is a
    #   relative error of every P. FlashAttention-2 pays the same; with float16 inputs the
    #   float32 accumulation hides it, with float32 inputs it measured up to ~3x the naive's.
    q, k, v, do = problem(np.random.default_rng(Nq + 7 * Nk), batch, Nq, Nk, d, dv, dtype)
    o, lse = tiled_attention(q, k, v, causal=causal, return_lse=True)
    expected, sizes = attention_backward_ref(q, k, v, do, causal=causal)
    naive = attention_backward_naive_lowp(q, k, v, do, dtype, causal=causal)
    with no_warnings():
        kw = dict(block_q=16, block_k=32) if fn is tiled_attention_backward else {}
        grads = fn(q, k, v, o, lse, do, causal=causal, **kw)
    for name, g, g_naive, e, size in zip("qkv", grads, naive, expected, sizes, strict=True):
        assert g.dtype == dtype
        err, err_naive = (float(np.abs(x.astype(np.float64) - e).max()) for x in (g, g_naive))
        bound = low_precision_bound(err_naive, size.max(), dtype, lse)
        assert err <= bound, f"d{name} error {err:.2e} > {bound:.2e} (naive {err_naive:.2e})"


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_float16_accumulates_in_float32(fn):
    # Widening float16 to float32 is exact, so float16 inputs must give exactly the float32
    # computation on the same values, rounded once to float16 at the end.
    q, k, v, do = problem(np.random.default_rng(11), (2,), 45, 70, 16, 8, np.float16)
    o, lse = tiled_attention(q, k, v, return_lse=True)
    kw = dict(block_q=16, block_k=32) if fn is tiled_attention_backward else {}
    grads16 = fn(q, k, v, o, lse, do, **kw)
    wide = (a.astype(np.float32) for a in (q, k, v, o, lse, do))
    grads32 = fn(*wide, **kw)
    for g16, g32 in zip(grads16, grads32, strict=True):
        assert g16.dtype == np.float16 and g32.dtype == np.float32
        np.testing.assert_array_equal(g16, g32.astype(np.float16))


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_shape_1823_by_781_tiled_equals_naive(causal):
    # Neither N is a multiple of any block size; checked against the naive backward (the
    # row-by-row reference would take too long here), relative to the largest gradient.
    q, k, v, do = problem(np.random.default_rng(1823), (), 1823, 781, 64, 64)
    o, lse = naive_attention(q, k, v, causal=causal, return_lse=True)
    naive = naive_attention_backward(q, k, v, o, lse, do, causal=causal)
    for blocks in ((64, 64), (128, 32)):
        block_q, block_k = blocks
        tiled = tiled_attention_backward(
            q, k, v, o, lse, do, block_q=block_q, block_k=block_k, causal=causal
        )
        for name, a, b in zip(("dq", "dk", "dv"), tiled, naive, strict=True):
            assert_close(a, b, RTOL64, f"{name}, blocks {blocks}")


# ---- property tests (hypothesis) -------------------------------------------------------------


@st.composite
def problems(draw):
    """Random backward problems: batch rank 0..2, N from 1 (and 0 keys), d/dv not powers of
    two, optional causal, optional mask with some rows fully masked, random blocks."""
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="batch"))
    Nq = draw(st.integers(1, 30), label="Nq")
    Nk = draw(st.integers(0, 30), label="Nk")
    d = draw(st.integers(1, 24), label="d")
    dv = draw(st.integers(1, 24), label="dv")
    rng = draw(rngs)
    q, k, v, do = problem(rng, batch, Nq, Nk, d, dv)
    causal = draw(st.booleans(), label="causal")
    mask = None
    mask_kind = draw(st.sampled_from(["none", "keys", "rows", "full"]), label="mask")
    if mask_kind == "keys":  # (Nk,): the same keys hidden from every query
        mask = rng.random(Nk) < 0.7
    elif mask_kind in ("rows", "full"):
        shape = (Nq, Nk) if mask_kind == "rows" else batch + (Nq, Nk)
        mask = rng.random(shape) < draw(st.sampled_from([0.1, 0.5, 0.9]), label="density")
        fully_masked = rng.random(shape[:-1]) < 0.3  # these query rows see no key at all
        mask[fully_masked] = False
    block_q = draw(st.integers(1, 40), label="block_q")
    block_k = draw(st.integers(1, 40), label="block_k")
    return (q, k, v, do), dict(causal=causal, mask=mask), block_q, block_k


def forward_and_backward(fn, qkvdo, kw, block_q=None, block_k=None):
    q, k, v, do = qkvdo
    o, lse = naive_attention(q, k, v, return_lse=True, **kw)
    blocks = dict(block_q=block_q, block_k=block_k) if block_q is not None else {}
    return fn(q, k, v, o, lse, do, **blocks, **kw)


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_tiled_equals_naive_equals_reference(problem):
    qkvdo, kw, block_q, block_k = problem
    expected, sizes = attention_backward_ref(*qkvdo, **kw)
    with no_warnings():  # fully masked rows and Nk = 0 must not warn
        naive = forward_and_backward(naive_attention_backward, qkvdo, kw)
        tiled = forward_and_backward(tiled_attention_backward, qkvdo, kw, block_q, block_k)
    assert_grads_close(naive, expected, sizes, RTOL64, "naive")
    assert_grads_close(tiled, naive, sizes, RTOL64, "tiled vs naive")


@settings(max_examples=40, deadline=None)
@given(problem=problems(), other_blocks=st.tuples(st.integers(1, 64), st.integers(1, 64)))
def test_result_does_not_depend_on_block_sizes(problem, other_blocks):
    qkvdo, kw, block_q, block_k = problem
    _, sizes = attention_backward_ref(*qkvdo, **kw)
    a = forward_and_backward(tiled_attention_backward, qkvdo, kw, block_q, block_k)
    b = forward_and_backward(tiled_attention_backward, qkvdo, kw, *other_blocks)
    assert_grads_close(a, b, sizes, RTOL64, f"blocks {block_q, block_k} vs {other_blocks}")


@settings(max_examples=40, deadline=None)
@given(problem=problems(), rng=rngs)
def test_shifting_a_rows_scores_has_zero_gradient(problem, rng):
    # Give every query an extra feature t_i and every key an extra feature 1: each score of
    # row i gains scale * t_i, a constant shift of the row, which the softmax ignores. So
    # the gradient with respect to t_i, scale * rowsum(dS_i), must be zero to rounding;
    # with dS = P * dP (D forgotten) it would not be.
    (q, k, v, do), kw, block_q, block_k = problem
    q1 = np.concatenate([q, rng.standard_normal(q.shape[:-1] + (1,))], axis=-1)
    k1 = np.concatenate([k, np.ones(k.shape[:-1] + (1,))], axis=-1)
    _, (size_q, _, _) = attention_backward_ref(q1, k1, v, do, **kw)
    for fn, blocks in ((naive_attention_backward, ()), (tiled_attention_backward, (3, 5))):
        dq1 = forward_and_backward(fn, (q1, k1, v, do), kw, *blocks)[0]
        bound = RTOL64 * size_q.max(initial=0)
        assert np.abs(dq1[..., -1]).max(initial=0) <= bound, fn.__name__


@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_dv_is_p_transposed_times_do(problem):
    # dV = P^T dO with P the softmax of the masked scores, built here from scratch (rows
    # that see no key have P = 0).
    (q, k, v, do), kw, block_q, block_k = problem
    Nq, Nk = q.shape[-2], k.shape[-2]
    S = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # (..., Nq, Nk)
    allowed = allowed_pairs(Nq, Nk, kw["causal"], kw["mask"], q.shape[:-2])
    P = np.zeros_like(S)  # (..., Nq, Nk)
    for idx in np.ndindex(S.shape[:-1]):
        if allowed[idx].any():
            P[idx][allowed[idx]] = softmax_ref(S[idx][allowed[idx]])
    dv_expected = np.swapaxes(P, -1, -2) @ do  # (..., Nk, dv)
    size = np.swapaxes(P, -1, -2) @ np.abs(do)
    for fn, blocks in (
        (naive_attention_backward, ()),
        (tiled_attention_backward, (block_q, block_k)),
    ):
        dv = forward_and_backward(fn, (q, k, v, do), kw, *blocks)[2]
        assert_close(dv, dv_expected, math.inf, fn.__name__)  # shapes, NaN and inf positions
        assert np.abs(dv - dv_expected).max(initial=0) <= RTOL64 * size.max(initial=0)


# ---- fully masked rows, empty key and query sets ----------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_fully_masked_rows_contribute_nothing_without_nan_or_warning(fn, dtype):
    q, k, v, do = problem(np.random.default_rng(3), (2,), 9, 6, 4, 3, dtype)
    mask = np.ones((2, 9, 6), dtype=bool)
    mask[0, 2] = False
    mask[1, 5:] = False  # rows 5..8 of batch 1 see nothing
    mask[:, :, 4] = False  # and no query sees key 4
    with no_warnings():
        dq, dk, dv = backward(fn, q, k, v, do, block_q=4, block_k=4, mask=mask)
    assert not any(np.isnan(g).any() for g in (dq, dk, dv))
    hidden = ~mask.any(axis=-1)  # (2, 9)
    np.testing.assert_array_equal(dq[hidden], 0)
    np.testing.assert_array_equal(dk[:, 4], 0)
    np.testing.assert_array_equal(dv[:, 4], 0)
    # The hidden rows add nothing to dk, dv: the gradients equal those of the other rows.
    # Tolerance as in the dtype test below: accumulation-dtype arithmetic, o rounded to
    # dtype, and one final rounding of each gradient to dtype.
    expected, sizes = attention_backward_ref(q, k, v, do, mask=mask)
    acc_eps = np.finfo(np.float64 if dtype == np.float64 else np.float32).eps
    assert_grads_close((dq, dk, dv), expected, sizes, 16 * acc_eps + 2 * np.finfo(dtype).eps)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_no_keys_gives_zero_dq_and_empty_dk_dv(fn):
    q, k, v, do = problem(np.random.default_rng(4), (2, 3), 5, 0, 8, 6)
    with no_warnings():
        dq, dk, dv = backward(fn, q, k, v, do, block_q=2, block_k=2, causal=True)
    assert dq.shape == (2, 3, 5, 8) and dk.shape == (2, 3, 0, 8) and dv.shape == (2, 3, 0, 6)
    np.testing.assert_array_equal(dq, 0)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_no_queries_gives_zero_dk_dv(fn):
    q, k, v, do = problem(np.random.default_rng(6), (2,), 0, 5, 4, 3)
    with no_warnings():
        dq, dk, dv = backward(fn, q, k, v, do, block_q=2, block_k=2, causal=True)
    assert dq.shape == (2, 0, 4) and dk.shape == (2, 5, 4) and dv.shape == (2, 5, 3)
    np.testing.assert_array_equal(dk, 0)
    np.testing.assert_array_equal(dv, 0)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_causal_keys_after_the_last_query_get_zero_gradient(fn):
    # Nk > Nq with top-left causal: keys Nq.. are seen by no query (whole key tiles of them,
    # which the tiled version skips).
    q, k, v, do = problem(np.random.default_rng(13), (), 5, 17, 4, 3)
    dq, dk, dv = backward(fn, q, k, v, do, block_q=2, block_k=3, causal=True)
    np.testing.assert_array_equal(dk[5:], 0)
    np.testing.assert_array_equal(dv[5:], 0)
    expected, sizes = attention_backward_ref(q, k, v, do, causal=True)
    assert_grads_close((dq, dk, dv), expected, sizes, RTOL64)


# ---- dtypes, shapes, inputs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float16, np.float16, np.float16),
        (np.float32, np.float32, np.float32),
        (np.float64, np.float64, np.float64),
        (np.float16, np.float32, np.float16),
        (np.float32, np.float64, np.float32),
        (np.float16, np.float16, np.float64),
    ],
    ids=lambda ds: "-".join(np.dtype(t).name for t in ds),
)
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_gradients_have_the_shapes_and_dtypes_of_q_k_v(fn, dtypes):
    rng = np.random.default_rng(7)
    q, k, v, do = problem(rng, (2,), 5, 6, 4, 3)
    q, k, v = (a.astype(t) for a, t in zip((q, k, v), dtypes, strict=True))
    common = np.result_type(*dtypes)
    do = do.astype(common)
    grads = backward(fn, q, k, v, do, block_q=2, block_k=4)
    for g, x in zip(grads, (q, k, v), strict=True):
        assert g.shape == x.shape and g.dtype == x.dtype
    # Arithmetic in the accumulation dtype (sums of at most 6 terms from dot products of
    # length <= 4: well under 16 units of its roundoff), o rounded to the common dtype,
    # and each gradient rounded once to its own dtype.
    expected, sizes = attention_backward_ref(q, k, v, do)
    acc_eps = np.finfo(np.float64 if common == np.float64 else np.float32).eps
    tol = 16 * acc_eps + np.finfo(common).eps + max(np.finfo(t).eps for t in dtypes)
    assert_grads_close(grads, expected, sizes, tol)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_inputs_are_not_modified(fn):
    for dtype in (np.float32, np.float64):
        q, k, v, do = problem(np.random.default_rng(8), (2,), 7, 9, 4, 3, dtype)
        mask = np.ones((7, 9), dtype=bool)
        mask[3] = False  # one row with lse = -inf
        o, lse = tiled_attention(q, k, v, mask=mask, return_lse=True)
        args = (q, k, v, o, lse, do)
        copies = [a.copy() for a in args]
        kw = dict(block_q=3, block_k=4) if fn is tiled_attention_backward else {}
        fn(*args, causal=True, mask=mask, **kw)
        for a, b in zip(args, copies, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "mask_shape", [(6,), (5, 6), (1, 5, 6), (2, 1, 5, 6), (2, 3, 5, 6), (3, 1, 6), ()]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_mask_broadcasting_and_causal_combined(fn, mask_shape, causal):
    rng = np.random.default_rng(9)
    q, k, v, do = problem(rng, (2, 3), 5, 6, 4, 3)
    mask = np.asarray(rng.random(mask_shape) < 0.6)  # shape () gives a 0-d array
    full = np.array(np.broadcast_to(mask, (2, 3, 5, 6)))  # what the mask means, made explicit
    expected, sizes = attention_backward_ref(q, k, v, do, causal=causal, mask=full)
    with no_warnings():
        grads = backward(fn, q, k, v, do, block_q=2, block_k=4, causal=causal, mask=mask)
    assert_grads_close(grads, expected, sizes, RTOL64)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_explicit_scale(fn):
    q, k, v, do = problem(np.random.default_rng(10), (), 8, 11, 5, 3)
    for scale in (0.25, 3, np.float32(0.5), 1e-3, -0.5):
        expected, sizes = attention_backward_ref(q, k, v, do, scale=scale)
        grads = backward(fn, q, k, v, do, block_q=3, block_k=4, scale=scale)
        assert_grads_close(grads, expected, sizes, RTOL64, f"scale={scale}")
    with pytest.raises(ValueError, match="scale must be finite and nonzero"):  # as the forward
        backward(fn, q, k, v, do, block_q=3, block_k=4, scale=0.0)


# ---- NaN ------------------------------------------------------------------------------------


def test_the_gradient_comparison_fails_on_nan_and_inf():
    q, k, v, do = problem(np.random.default_rng(14), (), 4, 5, 3, 2)
    expected, sizes = attention_backward_ref(q, k, v, do)
    assert_grads_close(expected, expected, sizes, RTOL64)  # itself: passes
    for which in range(3):
        for bad in (np.nan, np.inf, -np.inf):
            actual = [g.copy() for g in expected]
            actual[which][1, 0] = bad
            with pytest.raises(AssertionError):
                assert_grads_close(actual, expected, sizes, RTOL64)
            with pytest.raises(AssertionError):  # nor is a NaN expected matched by a number
                assert_grads_close(expected, actual, sizes, RTOL64)


@pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)
def test_nan_in_do_poisons_its_query_row(fn):
    q, k, v, do = problem(np.random.default_rng(15), (), 6, 7, 4, 3)
    do[2, 1] = np.nan
    dq, dk, dv = backward(fn, q, k, v, do, block_q=2, block_k=3)
    assert np.isnan(dq[2]).all() and np.isfinite(np.delete(dq, 2, axis=0)).all()
    assert np.isnan(dk).all()  # every key saw query 2, and dS_2j = P_2j (dP_2j - D_2)
    assert np.isnan(dv[:, 1]).all() and np.isfinite(dv[:, [0, 2]]).all()  # dV = P^T dO


# ---- memory: no (Nq, Nk) array -------------------------------------------------------------------


def one_head_problem(N, d=64, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((N, d), dtype=np.float32) for _ in range(4))
    o, lse = tiled_attention(q, k, v, return_lse=True)
    return q, k, v, o, lse, do


def test_tiled_backward_peak_is_a_small_fraction_of_naive_at_2048():
    N = 2048
    args = one_head_problem(N)
    naive = peak_bytes(naive_attention_backward, *args)
    tiled = peak_bytes(tiled_attention_backward, *args)  # default blocks 64 x 64
    print(
        f"\nbackward, N={N}, d=64, float32, one head: peak naive {naive / 2**20:.1f} MiB, "
        f"tiled {tiled / 2**20:.2f} MiB, ratio {naive / tiled:.0f}x"
    )
    # tracemalloc must see the naive version's (N, N) float32 matrices (16 MiB each, S, P,
    # dP and dS), at least two of them alive at once, or this test could not tell the two
    # apart.
    assert naive >= 2 * N * N * 4
    assert tiled < naive / 20


def test_tiled_backward_peak_grows_with_n_not_n_squared():
    # Doubling N doubles what tiled must hold (dQ, dK, dV, D and lse, all (N, d) or (N,))
    # and leaves its tiles unchanged: about 2x, where the naive version's grows 4x.
    small, large = (
        peak_bytes(tiled_attention_backward, *one_head_problem(N)) for N in (1024, 2048)
    )
    print(f"\ntiled backward peak: N=1024 {small / 2**20:.2f} MiB, N=2048 {large / 2**20:.2f} MiB")
    assert large < 2.5 * small
