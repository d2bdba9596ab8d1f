"""Every error path: the exception type, and a message that names the argument and the
shapes or dtypes involved. Also: NaN and inf in the inputs are not errors, they propagate."""

from __future__ import annotations

import numpy as np
import pytest
from reference import assert_close, attention_ref, no_warnings, softmax_ref

from flashref import (
    SoftmaxState,
    merge_states,
    naive_attention,
    naive_softmax,
    online_softmax,
    safe_softmax,
    streaming_weighted_sum,
    tiled_attention,
    tiled_attention_kv_outer,
)

ATTENTION = [naive_attention, tiled_attention, tiled_attention_kv_outer]
SOFTMAX = {
    "naive_softmax": naive_softmax,
    "safe_softmax": safe_softmax,
    "online_softmax": lambda x, axis=-1: online_softmax(x, 4, axis=axis),
}
by_name = pytest.mark.parametrize("fn", ATTENTION, ids=lambda f: f.__name__)


def expect(exc_type, call, *needles):
    """``call()`` raises ``exc_type`` whose message contains every one of ``needles``."""
    with pytest.raises(exc_type) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in message {message!r}"
    return message


def inputs(batch=(2, 3), Nq=4, Nk=5, d=8, dv=6, dtype=np.float64):
    return (
        np.zeros(batch + (Nq, d), dtype=dtype),
        np.zeros(batch + (Nk, d), dtype=dtype),
        np.zeros(batch + (Nk, dv), dtype=dtype),
    )


# ---- attention: shapes -----------------------------------------------------------------------


@by_name
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank_below_two(fn, which):
    q, k, v = inputs(batch=())
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][0]  # 1-D
    shape = str(args[which].shape)
    expect(ValueError, lambda: fn(**args), which, shape, "at least 2 dimensions")


@by_name
def test_different_ranks(fn):
    q, k, v = inputs()
    expect(ValueError, lambda: fn(q[0], k, v), "same rank", "(3, 4, 8)", "(2, 3, 5, 8)")


@by_name
@pytest.mark.parametrize("which", ["k", "v"])
def test_mismatched_leading_dims(fn, which):
    q, k, v = inputs()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][:, :2]  # H = 2 instead of 3
    expect(ValueError, lambda: fn(**args), "leading", "q (2, 3, 4, 8)", f"{which} (2, 2, 5, ")


@by_name
def test_mismatched_head_dim(fn):
    q, k, v = inputs()
    expect(ValueError, lambda: fn(q, k[..., :7], v), "k has shape (2, 3, 5, 7)", "head dim 8")


@by_name
def test_zero_head_dim(fn):
    q, k, v = inputs()
    expect(ValueError, lambda: fn(q[..., :0], k[..., :0], v), "q has shape (2, 3, 4, 0)", "d")


@by_name
def test_v_with_wrong_number_of_keys(fn):
    q, k, v = inputs()
    expect(ValueError, lambda: fn(q, k, v[..., :4, :]), "v has shape (2, 3, 4, 6)", "5 keys")


# ---- attention: mask, scale, blocks, dtypes -------------------------------------------------


@by_name
@pytest.mark.parametrize("shape", [(4, 4), (5, 4), (2, 4, 5), (2, 2, 4, 5), (1, 2, 3, 4, 5)])
def test_mask_that_does_not_broadcast(fn, shape):
    q, k, v = inputs()
    mask = np.ones(shape, dtype=bool)
    expect(ValueError, lambda: fn(q, k, v, mask=mask), f"mask has shape {shape}", "(2, 3, 4, 5)")


@by_name
@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.uint8])
def test_mask_not_bool(fn, dtype):
    q, k, v = inputs()
    mask = np.ones((4, 5), dtype=dtype)
    expect(TypeError, lambda: fn(q, k, v, mask=mask), "mask", np.dtype(dtype).name, "bool")


@by_name
@pytest.mark.parametrize("scale", ["0.5", 1j, True, [0.5]])
def test_scale_of_a_wrong_type(fn, scale):
    q, k, v = inputs()
    expect(TypeError, lambda: fn(q, k, v, scale=scale), "scale", type(scale).__name__)


@pytest.mark.parametrize(
    "fn", [tiled_attention, tiled_attention_kv_outer], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("name", ["block_q", "block_k"])
def test_block_sizes(fn, name):
    q, k, v = inputs()
    for bad in (0, -3):
        expect(ValueError, lambda bad=bad: fn(q, k, v, **{name: bad}), name, ">= 1", str(bad))
    for bad, type_name in ((2.0, "float"), ("64", "str"), (True, "bool"), (None, "NoneType")):
        expect(TypeError, lambda bad=bad: fn(q, k, v, **{name: bad}), name, "int", type_name)
    fn(q, k, v, **{name: np.int32(3)})  # a NumPy integer is an int


@by_name
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128, np.object_])
def test_non_float_arrays(fn, which, dtype):
    args = dict(zip("qkv", inputs(), strict=True))
    args[which] = args[which].astype(dtype)
    expect(TypeError, lambda: fn(**args), f"{which} has dtype {np.dtype(dtype)}", "float16")


def test_validation_happens_before_any_work():
    # A bad block size (or mask) on a problem whose naive scores would need 2**40 bytes must
    # be refused at once: nothing is computed (and nothing large allocated) first.
    q = np.broadcast_to(np.float32(0), (2**19, 8))  # a view: no memory behind it
    for bad in (dict(block_q=0), dict(mask=np.ones(3, dtype=np.int8))):
        with pytest.raises((ValueError, TypeError)):
            tiled_attention(q, q, q, **bad)
    with pytest.raises(TypeError):
        naive_attention(q, q, q, mask=np.ones(3, dtype=np.int8))


# ---- softmax --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64])
def test_softmax_non_float_input(name, dtype):
    x = np.ones((2, 3), dtype=dtype)
    expect(TypeError, lambda: SOFTMAX[name](x), f"x has dtype {np.dtype(dtype)}", "float")


@pytest.mark.parametrize("name", SOFTMAX)
def test_softmax_bad_axis(name):
    x = np.ones((2, 3))
    for axis in (2, -3):
        expect(
            ValueError, lambda axis=axis: SOFTMAX[name](x, axis=axis), f"axis {axis}", "x", "2 dim"
        )
    for axis, type_name in ((1.0, "float"), ("0", "str"), (None, "NoneType"), (True, "bool")):
        expect(TypeError, lambda axis=axis: SOFTMAX[name](x, axis=axis), "axis", "int", type_name)


def test_online_softmax_bad_block_size():
    x = np.ones((2, 3))
    expect(ValueError, lambda: online_softmax(x, 0), "block_size", ">= 1", "0")
    expect(TypeError, lambda: online_softmax(x, 2.5), "block_size", "int", "float")


# ---- streaming_weighted_sum -----------------------------------------------------------------


def test_streaming_weighted_sum_errors():
    s, v = np.zeros(4), np.ones(4)
    expect(ValueError, lambda: streaming_weighted_sum(s, v, 0), "tile_size", ">= 1")
    expect(TypeError, lambda: streaming_weighted_sum(s, v, 1.0), "tile_size", "int", "float")
    expect(TypeError, lambda: streaming_weighted_sum(s.astype(int), v, 1), "scores", "int64")
    expect(TypeError, lambda: streaming_weighted_sum(s, v.astype(int), 1), "values", "int64")
    expect(ValueError, lambda: streaming_weighted_sum(s, v[:3], 1), "scores (4,)", "values (3,)")
    expect(ValueError, lambda: streaming_weighted_sum(s[None], v[None], 1), "(1, 4)", "1-D")


# ---- SoftmaxState and merge_states ----------------------------------------------------------


def test_state_update_shape_errors():
    state = SoftmaxState.empty((3,), dv=2)  # 3 rows, output width 2
    s = np.zeros((3, 5))
    expect(ValueError, lambda: state.update(s), "v must be given")
    expect(ValueError, lambda: SoftmaxState.empty((3,)).update(s, np.zeros((5, 2))), "v must")
    expect(ValueError, lambda: state.update(np.zeros((4, 5)), np.zeros((5, 2))), "s", "(4, 5)")
    # values per row (3, 5, 2) instead of one block (5, 2) shared by the rows: refused, not
    # silently broadcast into an output of the wrong shape.
    expect(ValueError, lambda: state.update(s, np.zeros((3, 5, 2))), "v has shape (3, 5, 2)")
    expect(ValueError, lambda: state.update(s, np.zeros((5, 3))), "v has shape (5, 3)", "(5, 2)")


def test_merge_and_result_errors():
    a = SoftmaxState.empty((3,), dv=2)
    expect(ValueError, lambda: merge_states(a, SoftmaxState.empty((3,))), "output o")
    expect(ValueError, lambda: merge_states(a, SoftmaxState.empty((4,), dv=2)), "(3,)", "(4,)")
    expect(ValueError, lambda: SoftmaxState.empty((3,)).result(), "no output o")


# ---- NaN and inf are not errors: they propagate --------------------------------------------


def test_the_comparison_used_by_every_oracle_test_fails_on_nan():
    expected = np.array([[1.0, 2.0], [3.0, 4.0]])
    for bad in (np.nan, np.inf, -np.inf):
        actual = expected.copy()
        actual[1, 0] = bad
        with pytest.raises(AssertionError):
            assert_close(actual, expected, 1e-12)
    with pytest.raises(AssertionError):  # and a NaN expected is not matched by a number
        assert_close(expected, np.where(expected == 4.0, np.nan, expected), 1e-12)
    assert_close(expected * (1 + 1e-13), expected, 1e-12)  # while rounding passes


@by_name
def test_nan_in_a_query_poisons_only_its_row(fn):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((6, 4), (7, 4), (7, 3)))
    q[2, 1] = np.nan
    O, lse = fn(q, k, v, return_lse=True)
    assert np.isnan(O[2]).all() and np.isnan(lse[2])
    O_ref, lse_ref = attention_ref(q, k, v)
    assert_close(O, O_ref, 1e-12, "O")  # identical NaN positions, other rows correct
    assert_close(lse, lse_ref, 1e-12, "lse")


@by_name
def test_nan_in_a_key_reaches_exactly_the_queries_that_see_it(fn):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((9, 4), (9, 4), (9, 3)))
    k[5, 0] = np.nan  # with causal, queries 0..4 never see key 5
    O, lse = fn(q, k, v, return_lse=True, causal=True)
    assert np.isnan(O[5:]).all() and np.isfinite(O[:5]).all()
    assert_close(O, attention_ref(q, k, v, causal=True)[0], 1e-12, "O")


@by_name
def test_nan_and_inf_in_values_propagate(fn):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((5, 4), (6, 4), (6, 3)))
    v[3, 0] = np.nan
    v[1, 2] = np.inf
    O = fn(q, k, v)
    assert np.isnan(O[:, 0]).all() and np.isposinf(O[:, 2]).all() and np.isfinite(O[:, 1]).all()
    assert_close(O, attention_ref(q, k, v)[0], 1e-12, "O")


@pytest.mark.parametrize("name", SOFTMAX)
def test_softmax_nan_propagates_and_minus_inf_is_a_zero_weight(name):
    x = np.array([[0.5, np.nan, 1.0], [0.0, -np.inf, 2.0]])
    out = SOFTMAX[name](x)
    assert np.isnan(out[0]).all()
    with no_warnings():
        out = SOFTMAX[name](x[1:])
    assert out[0, 1] == 0.0
    assert_close(out[:, [0, 2]], softmax_ref(x[1:, [0, 2]]), 1e-12, "finite entries")
