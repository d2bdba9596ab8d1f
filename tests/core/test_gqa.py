"""Grouped-query (and multi-query) attention in every NumPy function, forward and backward.

q (..., Hq, Nq, d) with k, v (..., Hkv, Nk, d) and Hq = G * Hkv: query head h reads K/V head
h // G. Checked against the float64 reference with the K/V heads expanded one by one
(reference.py), against the same function given np.repeat-ed K/V (hypothesis), for the
errors of every shape that is not a multiple, and for memory: no (..., Hq, Nk, d) copy of
K or V is ever made.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_close,
    assert_grads_close,
    attention_backward_gqa_ref,
    attention_gqa_ref,
    attention_naive_lowp,
    expand_kv_heads_ref,
    no_warnings,
    rel_error,
)
from test_memory import peak_bytes

from flashref import (
    naive_attention,
    naive_attention_backward,
    ring_attention,
    split_kv_attention,
    tiled_attention,
    tiled_attention_backward,
    tiled_attention_kv_outer,
)

# float64 tolerance, as in test_attention.py and test_backward.py: sums of at most ~100
# terms from dot products of length <= 24 here, a worst case of ~1e-14; packing the group's
# heads into one tile changes only the order of BLAS's sums. 1e-12 is far below any real
# mistake (a query head reading the wrong K/V head is off by O(1)).
RTOL64 = 1e-12


def split_kv_3(q, k, v, **kw):
    """split_kv_attention with the keys in three chunks (some empty when Nk < 3)."""
    return split_kv_attention(q, k, v, num_splits=3, **kw)


FORWARD = [naive_attention, tiled_attention, tiled_attention_kv_outer, split_kv_3]
BACKWARD = [naive_attention_backward, tiled_attention_backward]
rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def gqa_inputs(rng, batch, Hq, Hkv, Nq, Nk, d, dv, dtype=np.float64):
    """q (*batch, Hq, Nq, d), k (*batch, Hkv, Nk, d), v (*batch, Hkv, Nk, dv), do like O."""
    shapes = [(Hq, Nq, d), (Hkv, Nk, d), (Hkv, Nk, dv), (Hq, Nq, dv)]
    return tuple(rng.standard_normal(batch + s).astype(dtype) for s in shapes)


def forward(fn, q, k, v, **kw):
    """(O, lse) of any forward function; small tiles for the tiled ones."""
    if fn in (tiled_attention, tiled_attention_kv_outer):
        kw = dict(block_q=3, block_k=4) | kw
    return fn(q, k, v, return_lse=True, **kw)


def backward(fn, q, k, v, do, **kw):
    o, lse = tiled_attention(q, k, v, return_lse=True, **kw)
    if fn is tiled_attention_backward:
        kw = dict(block_q=3, block_k=4) | kw
    return fn(q, k, v, o, lse, do, **kw)


def full_mask(rng, batch, Hq, Nq, Nk):
    """A mask for every query head, some rows fully masked: each head must read its own."""
    mask = rng.random(batch + (Hq, Nq, Nk)) < 0.6
    mask[..., 0, :] = False  # query 0 of every head sees nothing
    return mask


# ---- against the float64 reference ---------------------------------------------------------

SHAPES = [  # (batch, Hq, Hkv, Nq, Nk, d, dv)
    ((), 2, 1, 1, 1, 1, 1),
    ((), 4, 2, 5, 7, 3, 5),
    ((2,), 6, 1, 1, 33, 8, 8),  # multi-query decoding: one query, one K/V head
    ((2, 3), 8, 4, 13, 11, 5, 7),
    ((1,), 6, 3, 9, 9, 4, 4),
    ((), 3, 3, 6, 4, 2, 3),  # G = 1: ordinary multi-head attention
]
OPTIONS = [dict(), dict(causal=True), dict(mask="full"), dict(mask="full", causal=True, scale=-0.6)]


def options(kw, rng, batch, Hq, Nq, Nk):
    if kw.get("mask") == "full":
        kw = kw | dict(mask=full_mask(rng, batch, Hq, Nq, Nk))
    return kw


@pytest.mark.parametrize("kw", OPTIONS, ids=str)
@pytest.mark.parametrize("batch, Hq, Hkv, Nq, Nk, d, dv", SHAPES)
@pytest.mark.parametrize("fn", FORWARD, ids=lambda f: f.__name__)
def test_forward_matches_reference(fn, batch, Hq, Hkv, Nq, Nk, d, dv, kw):
    rng = np.random.default_rng(Hq * 100 + Nk)
    q, k, v, _ = gqa_inputs(rng, batch, Hq, Hkv, Nq, Nk, d, dv)
    kw = options(kw, rng, batch, Hq, Nq, Nk)
    O_ref, lse_ref = attention_gqa_ref(q, k, v, **kw)
    with no_warnings():
        O, lse = forward(fn, q, k, v, **kw)
    assert O.shape == batch + (Hq, Nq, dv) and lse.shape == batch + (Hq, Nq)
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


@pytest.mark.parametrize("kw", OPTIONS, ids=str)
@pytest.mark.parametrize("batch, Hq, Hkv, Nq, Nk, d, dv", SHAPES)
@pytest.mark.parametrize("fn", BACKWARD, ids=lambda f: f.__name__)
def test_backward_matches_reference(fn, batch, Hq, Hkv, Nq, Nk, d, dv, kw):
    # dk and dv of a shared K/V head are the sums over its query heads (the reference
    # computes them per query head on expanded K/V and adds them up, head by head).
    rng = np.random.default_rng(Hq * 100 + Nk)
    q, k, v, do = gqa_inputs(rng, batch, Hq, Hkv, Nq, Nk, d, dv)
    kw = options(kw, rng, batch, Hq, Nq, Nk)
    expected, sizes = attention_backward_gqa_ref(q, k, v, do, **kw)
    with no_warnings():
        grads = backward(fn, q, k, v, do, **kw)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert_grads_close(grads, expected, sizes, RTOL64)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_matches_reference(layout, causal):
    q, k, v, _ = gqa_inputs(np.random.default_rng(5), (2,), 6, 2, 12, 12, 4, 3)
    O_ref, lse_ref = attention_gqa_ref(q, k, v, causal=causal)
    O, lse = ring_attention(q, k, v, world_size=3, layout=layout, causal=causal, return_lse=True)
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("fn", FORWARD, ids=lambda f: f.__name__)
def test_low_precision_error_at_most_twice_naive(fn, dtype):
    # The rule of test_attention.py: within 2x the error of the same-precision textbook
    # formula (here on explicitly repeated K/V), plus one unit roundoff.
    q, k, v, _ = gqa_inputs(np.random.default_rng(8), (2,), 8, 2, 19, 70, 16, 16, dtype)
    O_ref, _ = attention_gqa_ref(q, k, v, causal=True)
    k8, v8 = np.repeat(k, 4, axis=-3), np.repeat(v, 4, axis=-3)
    O_low, _ = attention_naive_lowp(q, k8, v8, dtype, causal=True)
    O = forward(fn, q, k, v, causal=True)[0]
    assert O.dtype == dtype
    assert rel_error(O, O_ref) <= 2 * rel_error(O_low, O_ref) + np.finfo(dtype).eps


def test_query_head_h_reads_kv_head_h_over_g():
    # With the values of K/V head j all equal to j + 1, every output of query head h is
    # h // G + 1 (to rounding), whatever the softmax weights: the mapping itself.
    rng = np.random.default_rng(3)
    Hq, Hkv, G = 12, 3, 4
    q, k, _, _ = gqa_inputs(rng, (), Hq, Hkv, 4, 9, 5, 2)
    v = np.broadcast_to(np.arange(1.0, Hkv + 1)[:, None, None], (Hkv, 9, 2))
    expected = np.broadcast_to((np.arange(Hq) // G + 1.0)[:, None, None], (Hq, 4, 2))
    for fn in FORWARD:
        assert_close(forward(fn, q, k, v)[0], expected, RTOL64, fn.__name__)


# ---- GQA equals repeating the K/V heads ----------------------------------------------------


@st.composite
def gqa_problems(draw):
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2), label="batch"))
    Hkv = draw(st.integers(1, 3), label="Hkv")
    G = draw(st.integers(1, 4), label="G")
    Nq = draw(st.integers(1, 12), label="Nq")
    Nk = draw(st.integers(0, 12), label="Nk")
    d, dv = draw(st.integers(1, 6), label="d"), draw(st.integers(1, 6), label="dv")
    rng = draw(rngs)
    q, k, v, do = gqa_inputs(rng, batch, G * Hkv, Hkv, Nq, Nk, d, dv)
    kw = dict(causal=draw(st.booleans(), label="causal"))
    mask_kind = draw(st.sampled_from(["none", "rows", "heads"]), label="mask")
    if mask_kind == "rows":
        kw["mask"] = rng.random((Nq, Nk)) < 0.6
    elif mask_kind == "heads":
        kw["mask"] = full_mask(rng, batch, G * Hkv, Nq, Nk)
    return q, k, v, do, G, kw


def repeated(k, G):
    return np.repeat(k, G, axis=-3)  # (..., Hq, Nk, d): what GQA must not need


@settings(max_examples=60, deadline=None)
@given(problem=gqa_problems())
def test_forward_equals_repeated_kv(problem):
    q, k, v, _, G, kw = problem
    for fn in FORWARD:
        O, lse = forward(fn, q, k, v, **kw)
        O_rep, lse_rep = forward(fn, q, repeated(k, G), repeated(v, G), **kw)
        assert_close(O, O_rep, RTOL64, f"{fn.__name__} O")
        assert_close(lse, lse_rep, RTOL64, f"{fn.__name__} lse")


@settings(max_examples=60, deadline=None)
@given(problem=gqa_problems())
def test_backward_equals_repeated_kv_summed_over_each_group(problem):
    # Errors measured against the size of the terms each gradient entry sums (as in
    # test_backward.py): a row that sees one key has dq = 0 up to rounding, and two
    # roundings of zero are not relatively close.
    q, k, v, do, G, kw = problem
    _, sizes = attention_backward_gqa_ref(q, k, v, do, **kw)
    for fn in BACKWARD:
        grads = backward(fn, q, k, v, do, **kw)
        dq_rep, dk_rep, dv_rep = backward(fn, q, repeated(k, G), repeated(v, G), do, **kw)
        summed = [  # (..., Hq, Nk, w) as (..., Hkv, G, Nk, w), summed over the group
            g.reshape(x.shape[:-2] + (G,) + x.shape[-2:]).sum(axis=-3)
            for g, x in ((dk_rep, k), (dv_rep, v))
        ]
        assert_grads_close(grads, [dq_rep, *summed], sizes, RTOL64, fn.__name__)


@settings(max_examples=40, deadline=None)
@given(
    rng=rngs,
    Hkv=st.integers(1, 3),
    G=st.integers(1, 4),
    world_size=st.integers(1, 4),
    per_device=st.integers(1, 3),
    layout=st.sampled_from(["contiguous", "zigzag"]),
    causal=st.booleans(),
)
def test_ring_equals_repeated_kv(rng, Hkv, G, world_size, per_device, layout, causal):
    N = world_size * per_device * (2 if layout == "zigzag" else 1)
    q, k, v, _ = gqa_inputs(rng, (2,), G * Hkv, Hkv, N, N, 4, 3)
    kw = dict(world_size=world_size, layout=layout, causal=causal, block_q=2, block_k=3)
    O, lse = ring_attention(q, k, v, return_lse=True, **kw)
    O_rep, lse_rep = ring_attention(q, repeated(k, G), repeated(v, G), return_lse=True, **kw)
    assert_close(O, O_rep, RTOL64, "O")
    assert_close(lse, lse_rep, RTOL64, "lse")


def test_reference_expansion_is_np_repeat():
    # The reference's head-by-head expansion and np.repeat agree (the mapping h -> h // G).
    k = np.random.default_rng(0).standard_normal((2, 3, 5, 4))
    np.testing.assert_array_equal(expand_kv_heads_ref(k, 12), np.repeat(k, 4, axis=-3))


# ---- shapes that are not grouped-query attention -------------------------------------------


def expect(exc_type, call, *needles):
    with pytest.raises(exc_type) as info:
        call()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


def huge(*shape):
    """A float32 array of any shape with no memory behind it: work on it would not finish."""
    return np.broadcast_to(np.float32(0), shape)


N = 2**16  # any work on arrays this long (scores of N x N) would need gigabytes
BAD_SHAPES = [  # (q, k, v shapes, needles)
    ((12, N, 8), (5, N, 8), (5, N, 8), ("q has 12 heads but k has 5", "a multiple of the K/V")),
    ((2, 4, N, 8), (2, 8, N, 8), (2, 8, N, 8), ("q has 4 heads but k has 8",)),
    ((0, N, 8), (2, N, 8), (2, N, 8), ("q has 0 heads but k has 2",)),
    ((4, N, 8), (0, N, 8), (0, N, 8), ("q has 4 heads but k has 0",)),
    ((6, N, 8), (3, N, 8), (2, N, 8), ("k and v", f"k (3, {N}, 8), v (2, {N}, 8)")),
    ((2, 6, N, 8), (3, 3, N, 8), (3, 3, N, 8), ("before the head axis (-3)", f"q (2, 6, {N}, 8)")),
    ((4, N, 8), (N, 8), (N, 8), ("same rank", "2-D array (N, d) has no head axis")),
]


@pytest.mark.parametrize("q_shape, k_shape, v_shape, needles", BAD_SHAPES)
@pytest.mark.parametrize("fn", FORWARD + BACKWARD + [ring_attention], ids=lambda f: f.__name__)
def test_shapes_that_do_not_group_are_refused_before_any_work(
    fn, q_shape, k_shape, v_shape, needles
):
    q, k, v = huge(*q_shape), huge(*k_shape), huge(*v_shape)
    if fn in BACKWARD:
        call = lambda: fn(q, k, v, q, q[..., 0], q)  # noqa: E731 (o, lse, do shaped from q)
    elif fn is ring_attention:
        call = lambda: fn(q, k, v, world_size=1)  # noqa: E731
    else:
        call = lambda: fn(q, k, v)  # noqa: E731
    with no_warnings():
        expect(ValueError, call, *needles)


# ---- no copy of K or V per query head -------------------------------------------------------


def test_no_kv_copy_per_query_head():
    # Multi-query decoding: 8 query heads, one K/V head of 16384 keys (4 MiB of float32).
    # A copy of K or V for each query head would be 8x that; every function's peak extra
    # memory stays below 4 K's (the backward must write dk and dv, 2 K's, no more).
    rng = np.random.default_rng(0)
    Hq, Nk, d = 8, 16384, 64
    q = rng.standard_normal((Hq, 1, d), dtype=np.float32)
    k, v = (rng.standard_normal((1, Nk, d), dtype=np.float32) for _ in range(2))
    o, lse = naive_attention(q, k, v, return_lse=True)
    do = rng.standard_normal(o.shape, dtype=np.float32)
    bound = 4 * k.nbytes
    # tracemalloc sees such a copy: the bound would catch np.repeat.
    assert peak_bytes(np.repeat, k, Hq, axis=-3) >= 2 * bound
    calls = {
        "naive_attention": lambda: naive_attention(q, k, v),
        "tiled_attention": lambda: tiled_attention(q, k, v, block_k=1024),
        "tiled_attention_kv_outer": lambda: tiled_attention_kv_outer(q, k, v, block_k=1024),
        "split_kv_attention": lambda: split_kv_attention(q, k, v, num_splits=16),
        "naive_attention_backward": lambda: naive_attention_backward(q, k, v, o, lse, do),
        "tiled_attention_backward": lambda: tiled_attention_backward(
            q, k, v, o, lse, do, block_k=1024
        ),
    }
    for name, call in calls.items():
        peak = peak_bytes(call)
        print(f"{name}: peak {peak / 2**20:.2f} MiB; K is {k.nbytes / 2**20:.0f} MiB")
        assert peak < bound, f"{name}: peak {peak} bytes >= {bound}"
