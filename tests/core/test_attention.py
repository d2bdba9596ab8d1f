"""naive_attention, tiled_attention and tiled_attention_kv_outer against the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_close,
    attention_naive_lowp,
    attention_ref,
    no_warnings,
    rel_error,
)

from flashref import naive_attention, tiled_attention, tiled_attention_kv_outer

# float64 tolerance: each output is a weighted average of at most 781 value rows (the
# largest Nk below), with scores from dot products of length d <= 80; the worst-case
# (linear) error bound is about (Nk + d) units of roundoff, ~1e-13, and the tiled versions
# add one rounded rescaling per key tile. 1e-12 is above that and far below any real
# mistake (a missed rescaling, a wrong mask, an off-by-one tile bound are all off by O(1)).
RTOL64 = 1e-12

ALL = [naive_attention, tiled_attention, tiled_attention_kv_outer]
TILED = [tiled_attention, tiled_attention_kv_outer]
rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def qkv(rng, batch, Nq, Nk, d, dv, dtype=np.float64):
    q = rng.standard_normal(batch + (Nq, d)).astype(dtype)
    k = rng.standard_normal(batch + (Nk, d)).astype(dtype)
    v = rng.standard_normal(batch + (Nk, dv)).astype(dtype)
    return q, k, v


def call(fn, q, k, v, block_q=None, block_k=None, **kw):
    """Call any of the three; block sizes only go to the tiled ones."""
    if fn is not naive_attention and block_q is not None:
        kw.update(block_q=block_q, block_k=block_k)
    return fn(q, k, v, return_lse=True, **kw)


# ---- oracle tests on fixed irregular shapes -------------------------------------------------

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
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_float64_matches_reference(fn, batch, Nq, Nk, d, dv, causal):
    q, k, v = qkv(np.random.default_rng(Nq * 1000 + Nk), batch, Nq, Nk, d, dv)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    with no_warnings():
        O, lse = call(fn, q, k, v, block_q=16, block_k=32, causal=causal)
    assert O.dtype == np.float64 and lse.dtype == np.float64
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch, Nq, Nk, d, dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_low_precision_error_at_most_twice_naive(fn, batch, Nq, Nk, d, dv, causal, dtype):
    # FlashAttention's rule (CONVENTIONS.md): error against the float64 reference at most
    # ~2x that of a same-precision naive implementation on the same (already rounded)
    # inputs. Plus one unit roundoff of the dtype: for tiny problems (Nk = 1, or causal row
    # 0) the naive result can be exact by luck, while ours is still rounded once at the end.
    q, k, v = qkv(np.random.default_rng(Nq + 7 * Nk), batch, Nq, Nk, d, dv, dtype)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    O_low, lse_low = attention_naive_lowp(q, k, v, dtype, causal=causal)
    eps = np.finfo(dtype).eps
    with no_warnings():
        O, lse = call(fn, q, k, v, block_q=16, block_k=32, causal=causal)
    assert O.dtype == dtype
    assert lse.dtype == np.float32  # float16 and float32 both accumulate in float32
    err, err_low = rel_error(O, O_ref), rel_error(O_low, O_ref)
    assert err <= 2 * err_low + eps, f"O error {err:.2e} vs naive {dtype.__name__} {err_low:.2e}"
    err, err_low = rel_error(lse, lse_ref), rel_error(lse_low, lse_ref)
    assert err <= 2 * err_low + np.finfo(np.float32).eps, f"lse error {err:.2e} vs {err_low:.2e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", TILED, ids=lambda f: f.__name__)
def test_ragged_shape_1823_by_781(fn, causal):
    # Neither N is a multiple of any block size (the shape of Triton's tutorial test).
    q, k, v = qkv(np.random.default_rng(1823), (), 1823, 781, 64, 64)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    for blocks in ((64, 64), (128, 32)):
        O, lse = call(fn, q, k, v, *blocks, causal=causal)
        assert_close(O, O_ref, RTOL64, f"float64 O, blocks {blocks}")
        assert_close(lse, lse_ref, RTOL64, f"float64 lse, blocks {blocks}")
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    O_ref, _ = attention_ref(q32, k32, v32, causal=causal)  # reference of the rounded inputs
    O_low, _ = attention_naive_lowp(q32, k32, v32, np.float32, causal=causal)
    O = fn(q32, k32, v32, causal=causal)
    bound = 2 * rel_error(O_low, O_ref) + np.finfo(np.float32).eps  # as in the test above
    assert rel_error(O, O_ref) <= bound


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_float16_accumulates_in_float32(fn):
    # With float32 accumulation only the final rounding to float16 remains, so the result
    # beats a computation done entirely in float16 (scores rounded to float16 lose ~3
    # digits before exp); lse is returned in float32 and is ~1000x more accurate.
    q, k, v = qkv(np.random.default_rng(11), (), 64, 1024, 64, 64, np.float16)
    O_ref, lse_ref = attention_ref(q, k, v)
    O_low, lse_low = attention_naive_lowp(q, k, v, np.float16)
    O, lse = call(fn, q, k, v, block_q=64, block_k=64)
    err, err_low = rel_error(O, O_ref), rel_error(O_low, O_ref)
    print(f"{fn.__name__}: float16 O error {err:.2e}, pure-float16 naive {err_low:.2e}")
    assert err < 0.5 * err_low
    assert rel_error(lse, lse_ref) < 1e-2 * rel_error(lse_low, lse_ref)
    assert err <= np.finfo(np.float16).eps  # only the final rounding: at most 1 unit roundoff


# ---- property tests (hypothesis) -------------------------------------------------------------


@st.composite
def problems(draw):
    """Random attention problems: batch rank 0..2, N from 1 (and 0 keys), d/dv not powers
    of two, optional causal, optional mask with some rows fully masked, random blocks."""
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="batch"))
    Nq = draw(st.integers(1, 40), label="Nq")
    Nk = draw(st.integers(0, 40), label="Nk")
    d = draw(st.integers(1, 40), label="d")
    dv = draw(st.integers(1, 40), label="dv")
    rng = draw(rngs)
    q, k, v = qkv(rng, batch, Nq, Nk, d, dv)
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
    block_q = draw(st.integers(1, 48), label="block_q")
    block_k = draw(st.integers(1, 48), label="block_k")
    return q, k, v, dict(causal=causal, mask=mask), block_q, block_k


@settings(max_examples=200, deadline=None)
@given(problem=problems())
def test_tiled_equals_naive_equals_reference(problem):
    q, k, v, kw, block_q, block_k = problem
    O_ref, lse_ref = attention_ref(q, k, v, **kw)
    with no_warnings():  # fully masked rows and Nk = 0 must not warn
        O_naive, lse_naive = naive_attention(q, k, v, return_lse=True, **kw)
        for fn in TILED:
            O, lse = fn(q, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kw)
            assert_close(O, O_naive, RTOL64, f"{fn.__name__} O vs naive")
            assert_close(lse, lse_naive, RTOL64, f"{fn.__name__} lse vs naive")
    assert_close(O_naive, O_ref, RTOL64, "naive O vs reference")
    assert_close(lse_naive, lse_ref, RTOL64, "naive lse vs reference")


@settings(max_examples=100, deadline=None)
@given(problem=problems(), other_blocks=st.tuples(st.integers(1, 64), st.integers(1, 64)))
def test_result_does_not_depend_on_block_sizes(problem, other_blocks):
    q, k, v, kw, block_q, block_k = problem
    for fn in TILED:
        a = fn(q, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kw)
        b = fn(q, k, v, block_q=other_blocks[0], block_k=other_blocks[1], return_lse=True, **kw)
        assert_close(a[0], b[0], RTOL64, f"{fn.__name__} O, blocks {block_q, block_k}")
        assert_close(a[1], b[1], RTOL64, f"{fn.__name__} lse")


# ---- fully masked rows and empty key sets --------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_fully_masked_rows_give_zeros_and_minus_inf_lse_without_warning(fn, dtype):
    q, k, v = qkv(np.random.default_rng(3), (2,), 9, 6, 4, 3, dtype)
    mask = np.ones((2, 9, 6), dtype=bool)
    mask[0, 2] = False
    mask[1, 5:] = False  # rows 5..8 of batch 1 see nothing
    with no_warnings():
        O, lse = call(fn, q, k, v, block_q=4, block_k=4, mask=mask)
    assert not np.isnan(O).any() and not np.isnan(lse).any()
    hidden = ~mask.any(axis=-1)  # (2, 9)
    np.testing.assert_array_equal(O[hidden], 0)
    assert np.isneginf(lse[hidden]).all() and np.isfinite(lse[~hidden]).all()
    O_ref, _ = attention_ref(q, k, v, mask=mask)
    # The other rows are right: float32 (or float64) accumulation, then one rounding to dtype.
    assert rel_error(O, O_ref) <= 2 * np.finfo(dtype).eps + RTOL64


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_no_keys_gives_zeros_and_minus_inf(fn):
    q, k, v = qkv(np.random.default_rng(4), (2, 3), 5, 0, 8, 6)
    with no_warnings():
        O, lse = call(fn, q, k, v, block_q=2, block_k=2)
        O_masked, lse_masked = call(
            fn,
            q,
            *qkv(np.random.default_rng(5), (2, 3), 5, 4, 8, 6)[1:],
            block_q=2,
            block_k=2,
            mask=np.zeros(4, dtype=bool),
        )
    for out, l in ((O, lse), (O_masked, lse_masked)):
        assert out.shape == (2, 3, 5, 6) and l.shape == (2, 3, 5)
        np.testing.assert_array_equal(out, 0)
        assert np.isneginf(l).all()


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_no_queries_gives_empty_output(fn):
    q, k, v = qkv(np.random.default_rng(6), (2,), 0, 5, 4, 3)
    O, lse = call(fn, q, k, v, block_q=2, block_k=2, causal=True)
    assert O.shape == (2, 0, 3) and lse.shape == (2, 0)


# ---- dtypes ---------------------------------------------------------------------------------


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
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_output_dtype_is_the_common_dtype(fn, dtypes):
    rng = np.random.default_rng(7)
    q, k, v = (a.astype(t) for a, t in zip(qkv(rng, (), 5, 6, 4, 3), dtypes, strict=True))
    O, lse = call(fn, q, k, v, block_q=2, block_k=4)
    common = np.result_type(*dtypes)
    assert O.dtype == common
    assert lse.dtype == (np.float64 if common == np.float64 else np.float32)
    O_ref, _ = attention_ref(q, k, v)
    assert rel_error(O, O_ref) <= 4 * np.finfo(common).eps  # computed in >= float32


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_inputs_are_not_modified(fn):
    for dtype in (np.float32, np.float64):
        q, k, v = qkv(np.random.default_rng(8), (2,), 7, 9, 4, 3, dtype)
        copies = [a.copy() for a in (q, k, v)]
        call(fn, q, k, v, block_q=3, block_k=4, causal=True)
        for a, b in zip((q, k, v), copies, strict=True):
            np.testing.assert_array_equal(a, b)


# ---- causal alignment, masks, scale --------------------------------------------------------


@pytest.mark.parametrize("Nq, Nk", [(5, 9), (9, 5), (7, 7), (1, 4), (4, 1)])
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_causal_is_aligned_top_left(fn, Nq, Nk):
    # Top-left (PyTorch SDPA is_causal=True): query i attends to keys 0..i, whatever Nq and
    # Nk are. Checked row by row against unmasked attention over exactly those keys.
    q, k, v = qkv(np.random.default_rng(Nq * 10 + Nk), (), Nq, Nk, 6, 4)
    O, lse = call(fn, q, k, v, block_q=2, block_k=3, causal=True)
    for i in range(Nq):
        visible = slice(0, min(i + 1, Nk))
        O_i, lse_i = attention_ref(q[i : i + 1], k[visible], v[visible])
        assert_close(O[i : i + 1], O_i, RTOL64, f"row {i}")
        assert_close(lse[i : i + 1], lse_i, RTOL64, f"lse row {i}")
    # Row 0 sees key 0 only: its output is exactly v[0] (bottom-right alignment, as in
    # FlashAttention 2.1+, would give row 0 keys 0..Nk-Nq when Nq < Nk).
    np.testing.assert_allclose(O[0], v[0], rtol=RTOL64)
    if Nq < Nk:
        bottom_right, _ = attention_ref(q[:1], k[: Nk - Nq + 1], v[: Nk - Nq + 1])
        assert rel_error(O[:1], bottom_right) > 1e-3


@pytest.mark.parametrize(
    "mask_shape", [(6,), (5, 6), (1, 5, 6), (2, 1, 5, 6), (2, 3, 5, 6), (3, 1, 6), ()]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_mask_broadcasting_and_causal_combined(fn, mask_shape, causal):
    rng = np.random.default_rng(9)
    q, k, v = qkv(rng, (2, 3), 5, 6, 4, 3)  # q (B=2, H=3, Nq=5, d=4)
    mask = np.asarray(rng.random(mask_shape) < 0.6)  # shape () gives a 0-d array
    full = np.broadcast_to(mask, (2, 3, 5, 6))  # what the mask means, made explicit
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal, mask=np.array(full))
    with no_warnings():
        O, lse = call(fn, q, k, v, block_q=2, block_k=4, causal=causal, mask=mask)
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_explicit_scale(fn):
    q, k, v = qkv(np.random.default_rng(10), (), 8, 11, 5, 3)
    for scale in (0.25, 3, np.float32(0.5), 1e-3, -0.7):  # negative: allowed, as in SDPA
        O_ref, lse_ref = attention_ref(q, k, v, scale=scale)
        O, lse = call(fn, q, k, v, block_q=3, block_k=4, scale=scale)
        assert_close(O, O_ref, RTOL64, f"scale={scale}")
        assert_close(lse, lse_ref, RTOL64, f"lse scale={scale}")
    # scale=0 (uniform weights whatever q is) is refused: see test_errors.py


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_return_lse_false_returns_only_the_output(fn):
    q, k, v = qkv(np.random.default_rng(12), (), 4, 4, 2, 2)
    out = fn(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == (4, 2)
    np.testing.assert_array_equal(out, fn(q, k, v, return_lse=True)[0])
