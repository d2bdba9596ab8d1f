"""The argument contract shared by every public NumPy function (test_gpu_nogpu.py checks
that flashref.gpu gives the same answers).

Boolean flags must be bools; ``scale`` follows one rule (``_checks.check_scale``);
float arrays in either byte order are accepted, other things that are not plain
float arrays are refused with the argument's name. Each error comes before any work.
"""

from __future__ import annotations

import fractions

import numpy as np
import pytest
from reference import assert_close, attention_ref, causal_refusal, no_warnings, softmax_ref

from flashref import (
    SoftmaxState,
    naive_attention,
    naive_softmax,
    online_softmax,
    safe_softmax,
    streaming_weighted_sum,
    tiled_attention,
    tiled_attention_kv_outer,
)
from flashref._checks import check_flag, check_scale

ATTENTION = [naive_attention, tiled_attention, tiled_attention_kv_outer]
by_name = pytest.mark.parametrize("fn", ATTENTION, ids=lambda f: f.__name__)

# float16, float32 and float64 stored in the byte order that is not this machine's
SWAPPED = [np.dtype(t).newbyteorder("S") for t in (np.float16, np.float32, np.float64)]


def qkv(dtype=np.float64, Nq=5, Nk=7, d=4, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((Nq, d), (Nk, d), (Nk, dv)))


def raises(exc_type, call, *needles):
    """``call()`` raises exactly ``exc_type`` (no subclass) with every needle in its message."""
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, type(info.value)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    return str(info.value)


# ---- boolean flags ---------------------------------------------------------------------------

NOT_BOOLS = ["False", "no", None, 0, 1, 1.0, np.int64(1), [True]]


@by_name
@pytest.mark.parametrize("flag", ["causal", "return_lse"])
@pytest.mark.parametrize("bad", NOT_BOOLS, ids=repr)
def test_a_flag_that_is_not_a_bool_is_refused(fn, flag, bad):
    q, k, v = qkv()
    if flag == "causal":  # the causal spellings: bools, "top_left", "bottom_right"
        error, expected = causal_refusal(bad)
    else:
        error, expected = TypeError, f"{flag} must be a bool, got {type(bad).__name__}"
    raises(error, lambda: fn(q, k, v, **{flag: bad}), expected)


@by_name
def test_every_causal_spelling_is_taken_where_it_is_the_computed_mask(fn):
    """``True`` and ``"top_left"`` are one mask; ``"bottom_right"`` is that mask where
    ``Nq == Nk`` and is refused, naming the function and the ones that align it, elsewhere."""
    q, k, v = qkv(Nq=7, Nk=7)
    want = fn(q, k, v, causal=True)
    for spelling in ("top_left", "bottom_right", np.True_):
        np.testing.assert_array_equal(fn(q, k, v, causal=spelling), want)
    q5, k7, v7 = qkv(Nq=5, Nk=7)
    np.testing.assert_array_equal(fn(q5, k7, v7, causal="top_left"), fn(q5, k7, v7, causal=True))
    raises(
        ValueError,
        lambda: fn(q5, k7, v7, causal="bottom_right"),
        "causal='bottom_right'",
        "(here Nq = 5, Nk = 7)",
        f"the mask of {fn.__name__} is top-left",
        "paged_attention",
    )
    raises(
        ValueError,
        lambda: fn(q5, k7, v7, causal="bottom-right"),
        "causal must be False, True, 'top_left' or 'bottom_right', got 'bottom-r",
    )


@by_name
def test_numpy_bools_are_bools(fn):
    q, k, v = qkv()
    O, lse = fn(q, k, v, causal=True, return_lse=True)
    O_np, lse_np = fn(q, k, v, causal=np.True_, return_lse=np.True_)
    assert O.tobytes() == O_np.tobytes() and lse.tobytes() == lse_np.tobytes()
    out = fn(q, k, v, causal=np.False_, return_lse=np.False_)
    assert isinstance(out, np.ndarray) and out.tobytes() == fn(q, k, v).tobytes()


def test_check_flag_returns_a_python_bool():
    assert check_flag(np.True_, "causal") is True and check_flag(False, "causal") is False


# ---- scale -----------------------------------------------------------------------------------

NOT_FINITE_OR_ZERO = [np.inf, -np.inf, np.nan, 0, 0.0, -0.0, np.float32(0), np.float64(np.nan)]


@by_name
@pytest.mark.parametrize("bad", NOT_FINITE_OR_ZERO, ids=repr)
def test_scale_must_be_finite_and_nonzero(fn, bad):
    q, k, v = qkv()
    with no_warnings():  # refused up front, not a NumPy warning and NaN
        raises(ValueError, lambda: fn(q, k, v, scale=bad), "scale must be finite and nonzero")


@by_name
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_scale_must_be_representable_in_the_accumulation_dtype(fn, dtype):
    q, k, v = qkv(dtype)
    with no_warnings():
        for bad in (1e300, -1e39, 1e-50):  # inf or 0 once rounded to float32
            raises(ValueError, lambda bad=bad: fn(q, k, v, scale=bad), "scale", "float32")


@by_name
def test_a_scale_beyond_float32_is_fine_in_float64(fn):
    q, k, v = qkv(np.float64)
    q = q * 1e-40  # scale * q is ordinary: only the scale itself is beyond float32's range
    with no_warnings():
        O, lse = fn(q, k, v, scale=1e39, return_lse=True)
    O_ref, lse_ref = attention_ref(q, k, v, scale=1e39)
    assert_close(O, O_ref, 1e-12, "O")
    assert_close(lse, lse_ref, 1e-12, "lse")


@by_name
@pytest.mark.parametrize(
    "huge", [10**400, -(10**400), fractions.Fraction(10**400, 3), np.longdouble("1e4000")]
)
def test_a_scale_too_large_for_any_float_names_scale(fn, huge):
    q, k, v = qkv()
    if isinstance(huge, np.longdouble) and np.isinf(huge):  # longdouble is float64 here
        pytest.skip("this machine's longdouble is float64")
    raises(ValueError, lambda: fn(q, k, v, scale=huge), "scale", "too large", "float64")


@by_name
@pytest.mark.parametrize("scale", [-0.5, 3, np.float16(0.25), fractions.Fraction(1, 3)])
def test_scales_that_are_allowed(fn, scale):
    q, k, v = qkv()
    assert_close(fn(q, k, v, scale=scale), attention_ref(q, k, v, scale=scale)[0], 1e-12, "O")


def test_check_scale_defaults_and_returns_a_float():
    assert check_scale(None, 64, np.float32) == 0.125
    assert type(check_scale(np.float32(0.5), 8, np.float32)) is float


# ---- float arrays: byte order, conversion, masked arrays ------------------------------------


@by_name
@pytest.mark.parametrize("swapped", SWAPPED, ids=str)
def test_attention_takes_either_byte_order(fn, swapped):
    q, k, v = qkv(swapped.newbyteorder("="))
    native = fn(q, k, v, causal=True, return_lse=True)
    for which in range(3):
        args = [q, k, v]
        args[which] = args[which].astype(swapped)
        assert not args[which].dtype.isnative  # really the other byte order
        got = fn(*args, causal=True, return_lse=True)
        for x, y in zip(got, native, strict=True):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("swapped", SWAPPED, ids=str)
def test_softmax_and_state_take_either_byte_order(swapped):
    x = np.random.default_rng(1).standard_normal((3, 9)).astype(swapped.newbyteorder("="))
    xs = x.astype(swapped)
    for fn in (naive_softmax, safe_softmax, lambda a: online_softmax(a, 4)):
        a, b = fn(x), fn(xs)
        assert a.dtype == b.dtype == x.dtype and a.tobytes() == b.tobytes()
    v = x[0, :, None] * np.ones(2, dtype=x.dtype)  # (9, 2)
    a = SoftmaxState.from_scores(x, v)
    b = SoftmaxState.from_scores(xs, v.astype(swapped))
    for name in ("m", "l", "o"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    c = SoftmaxState(a.m.astype(swapped), a.l.astype(swapped), a.o.astype(swapped))
    assert c.m.dtype.isnative and c.result().tobytes() == a.result().tobytes()
    s, w = x[0].astype(np.float64), x[1].astype(np.float64)
    got = streaming_weighted_sum(s.astype(">f8"), w.astype("<f8"), 4)
    assert got == streaming_weighted_sum(s, w, 4)


@pytest.mark.parametrize("dtype", [">i4", "<i8", ">c8", "<c16", np.longdouble])
def test_other_dtypes_are_still_refused(dtype):
    if np.dtype(dtype) == np.float64:
        pytest.skip("this machine's longdouble is float64")
    x = np.ones((2, 3), dtype=dtype)
    raises(TypeError, lambda: safe_softmax(x), f"x has dtype {np.dtype(dtype)}", "float16")
    raises(TypeError, lambda: tiled_attention(x, x, x), "q has dtype", "float16")


def test_array_likes_are_converted():
    q, k, v = qkv()
    expected = tiled_attention(q, k, v, block_q=2, block_k=3)
    got = tiled_attention(q.tolist(), k.tolist(), v.tolist(), block_q=2, block_k=3)
    assert got.tobytes() == expected.tobytes()
    assert_close(safe_softmax([1.0, 2.0, 3.0]), softmax_ref([1.0, 2.0, 3.0]), 1e-15, "list")


class Refuses:
    """Stands for an array type NumPy cannot convert (a tensor that requires grad, say)."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad.")


def test_what_numpy_cannot_convert_is_refused_by_name():
    q, k, v = qkv()
    raises(TypeError, lambda: naive_attention(q, Refuses(), v), "k cannot be converted", "grad")
    ragged = [[1.0, 2.0], [3.0]]
    raises(ValueError, lambda: safe_softmax(ragged), "x cannot be converted")
    raises(ValueError, lambda: streaming_weighted_sum(ragged, [1.0], 1), "scores cannot be")
    mask = [[True] * 7] * 4 + [[True]]
    raises(ValueError, lambda: tiled_attention(q, k, v, mask=mask), "mask cannot be converted")


def test_masked_arrays_are_refused_not_unmasked():
    # np.asarray would drop the mask and compute on whatever lies under it.
    q, k, v = qkv()
    mq = np.ma.masked_array(q, mask=np.ones_like(q, dtype=bool))
    raises(TypeError, lambda: tiled_attention(mq, k, v), "q is a numpy.ma.MaskedArray")
    raises(TypeError, lambda: online_softmax(mq, 2), "x is a numpy.ma.MaskedArray")
    mmask = np.ma.masked_array(np.ones((5, 7), dtype=bool), mask=True)
    raises(TypeError, lambda: naive_attention(q, k, v, mask=mmask), "mask is a numpy.ma")
    raises(TypeError, lambda: SoftmaxState(np.ma.zeros(3), np.zeros(3)), "m is a numpy.ma")


# ---- before any work -------------------------------------------------------------------------


def test_flags_and_scale_are_checked_before_any_work():
    # Scores for this q would need 2**40 bytes: a bad argument must be refused at once.
    q = np.broadcast_to(np.float32(0), (2**19, 8))  # a view: no memory behind it
    for fn in ATTENTION:
        for bad in (dict(causal="yes"), dict(return_lse=None), dict(scale=1e300)):
            with no_warnings():
                with pytest.raises((TypeError, ValueError)):
                    fn(q, q, q, **bad)


def test_sdpa_options_take_numpy_scalars_as_flashref_does():
    """flashref.torch.attention's SDPA options (checked without torch): a NumPy bool is a
    bool and a NumPy float a float, as everywhere in flashref; the rest is named."""
    from flashref._checks import check_sdpa_call

    q, k = np.zeros((1, 4, 8, 16)), np.zeros((1, 2, 8, 16))
    check_sdpa_call(q, k, None, np.float32(0.0), np.False_, np.True_)  # accepted
    check_sdpa_call(q, q, None, 0, True, False)
    for kw, error, match in [
        ({"dropout_p": "0"}, TypeError, "dropout_p must be a float, got str"),
        ({"dropout_p": True}, TypeError, "dropout_p must be a float, got bool"),
        ({"dropout_p": np.float64(0.1)}, NotImplementedError, "dropout_p=0.1 is not supported"),
        ({"enable_gqa": 1}, TypeError, "enable_gqa must be a bool, got int"),
        ({"is_causal": "True"}, TypeError, "is_causal must be a bool, got str"),
        ({"enable_gqa": np.False_}, ValueError, "query has 4 heads and key 2"),
    ]:
        args = {"dropout_p": 0.0, "is_causal": False, "enable_gqa": True} | kw
        with pytest.raises(error, match=match):
            check_sdpa_call(q, k, None, args["dropout_p"], args["is_causal"], args["enable_gqa"])
