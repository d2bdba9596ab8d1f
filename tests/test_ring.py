"""SoftmaxState.from_output (a finished attention result as a mergeable state) and check_flag."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import assert_close, attention_ref, no_warnings

from flashref import SoftmaxState, merge_states, naive_attention
from flashref._checks import check_flag

# float64 tolerance, as in test_attention.py: outputs are weighted averages of at most 30
# value rows, plus one merge (a rescaling by a rounded exp and a multiply-add); 1e-12 is
# far above that rounding and far below any real mistake.
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def qkv(rng, batch, N, d, dv, dtype=np.float64):
    q = rng.standard_normal(batch + (N, d)).astype(dtype)
    k = rng.standard_normal(batch + (N, d)).astype(dtype)
    v = rng.standard_normal(batch + (N, dv)).astype(dtype)
    return q, k, v


# ---- SoftmaxState.from_output ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(rng=rngs, Nk=st.integers(2, 30), split=st.integers(1, 29), causal=st.booleans())
def test_merging_two_finished_results_is_attention_over_all_keys(rng, Nk, split, causal):
    split = min(split, Nk - 1)  # two non-empty halves of the keys
    q, k, v = qkv(rng, (2,), Nk, 6, 4)
    mask = np.tril(np.ones((Nk, Nk), dtype=bool)) if causal else None  # (Nq, Nk)
    halves = []
    for cols in (slice(0, split), slice(split, Nk)):
        half_mask = None if mask is None else mask[:, cols]
        O, lse = naive_attention(
            q, k[..., cols, :], v[..., cols, :], mask=half_mask, return_lse=True
        )
        halves.append(SoftmaxState.from_output(O, lse))  # causal: some rows see no key here
    with no_warnings():
        merged = merge_states(*halves)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    assert_close(merged.result(), O_ref, RTOL64, "O")
    assert_close(merged.lse(), lse_ref, RTOL64, "lse")


def test_from_output_gives_back_what_it_was_given():
    rng = np.random.default_rng(2)
    O, lse = naive_attention(*qkv(rng, (3,), 5, 4, 2), return_lse=True)
    state = SoftmaxState.from_output(O, lse)
    np.testing.assert_array_equal(state.m, lse)
    np.testing.assert_array_equal(state.l, np.ones(lse.shape))
    assert state.result().tobytes() == O.tobytes()  # o / 1
    assert state.lse().tobytes() == lse.tobytes()  # lse + log(1)


def test_from_output_rows_that_saw_nothing_are_the_empty_state():
    O = np.array([[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]])
    lse = np.array([0.5, -np.inf, -np.inf])
    with no_warnings():
        state = SoftmaxState.from_output(O, lse)
    np.testing.assert_array_equal(state.m, [0.5, -np.inf, -np.inf])
    np.testing.assert_array_equal(state.l, [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(state.o, [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])


def test_from_output_keeps_the_common_dtype():
    O = np.zeros((4, 3), dtype=np.float16)
    lse = np.zeros(4, dtype=np.float32)
    state = SoftmaxState.from_output(O, lse)
    assert state.m.dtype == state.l.dtype == state.o.dtype == np.float32


def expect(exc_type, call, *needles):
    with pytest.raises(exc_type) as info:
        call()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


def test_check_flag():
    assert check_flag(np.bool_(True), "causal") is True  # NumPy bools are accepted
    assert check_flag(False, "causal") is False
    expect(TypeError, lambda: check_flag("True", "causal"), "causal must be a bool, got str")
    expect(TypeError, lambda: check_flag(1, "return_lse"), "return_lse must be a bool, got int")


def test_from_output_errors():
    expect(
        ValueError,
        lambda: SoftmaxState.from_output(np.zeros((4, 3)), np.zeros(3)),
        "o has shape (4, 3) and lse (3,)",
    )
    expect(ValueError, lambda: SoftmaxState.from_output(np.zeros(()), np.zeros(())), "o (..., dv)")
    expect(
        TypeError,
        lambda: SoftmaxState.from_output(np.zeros((4, 3), dtype=int), np.zeros(4)),
        "o has dtype int64",
    )
