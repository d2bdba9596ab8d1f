"""PagedKVCache and paged_attention: paged equals contiguous, bottom-right causal alignment,
only the pages in use are read, the pool running out, and every error path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_close,
    attention_gqa_ref,
    attention_naive_lowp,
    bottom_right_pairs,
    no_warnings,
    rel_error,
)
from test_memory import peak_bytes

import flashref.kvcache
from flashref import CacheFullError, PagedKVCache, naive_attention, paged_attention
from flashref.kvcache import PageTable

# float64 tolerance, as in test_attention.py: each output is a weighted average of at most
# ~60 value rows with scores from dot products of length <= 8, and every page is one more
# rescaled tile (a few roundoffs each), a worst case of ~1e-14. 1e-12 is far below any
# real mistake (a page read in the wrong order is harmless, but a stale slot, a page of
# another sequence, or a mask off by one position are all O(1)).
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def fill(cache, rng, lengths, chunk=3, dtype=None):
    """New sequences of the given lengths, appended round-robin in chunks of up to ``chunk``
    tokens (so their pages interleave in the pool); returns the ids and each sequence's
    contiguous K, V as appended."""
    dtype = dtype or cache.dtype
    Hkv, d, dv = cache.num_kv_heads, cache.head_dim, cache.head_dim_v
    seqs = [cache.new_sequence() for _ in lengths]
    kept = {s: ([], []) for s in seqs}
    done = dict.fromkeys(seqs, 0)
    while any(done[s] < L for s, L in zip(seqs, lengths, strict=True)):
        for s, L in zip(seqs, lengths, strict=True):
            n = min(int(rng.integers(1, chunk + 1)), L - done[s])
            if n <= 0:
                continue
            k_new = rng.standard_normal((Hkv, n, d)).astype(dtype)
            v_new = rng.standard_normal((Hkv, n, dv)).astype(dtype)
            cache.append(s, k_new, v_new)
            kept[s][0].append(k_new)
            kept[s][1].append(v_new)
            done[s] += n
    contiguous = [
        (
            np.concatenate(kept[s][0], axis=1) if kept[s][0] else np.zeros((Hkv, 0, d), dtype),
            np.concatenate(kept[s][1], axis=1) if kept[s][1] else np.zeros((Hkv, 0, dv), dtype),
        )
        for s in seqs
    ]
    return seqs, contiguous


def reference(q, contiguous, causal):
    """float64 (O, lse) per sequence, each against its own contiguous K/V."""
    outs = []
    for b, (K, V) in enumerate(contiguous):
        Nq, L = q.shape[2], K.shape[1]
        mask = bottom_right_pairs(Nq, L) if causal else None
        outs.append(attention_gqa_ref(q[b], K, V, mask=mask))
    return np.stack([o for o, _ in outs]), np.stack([lse for _, lse in outs])


# ---- the cache itself -----------------------------------------------------------------------


def test_append_fills_pages_through_the_block_table_and_gather_reads_them_back():
    rng = np.random.default_rng(0)
    cache = PagedKVCache(num_pages=12, page_size=4, num_kv_heads=2, head_dim=3, head_dim_v=5)
    seqs, contiguous = fill(cache, rng, [9, 0, 1, 8], chunk=3)
    assert [cache.lengths[s] for s in seqs] == [9, 0, 1, 8]
    assert [len(cache.block_tables[s]) for s in seqs] == [3, 0, 1, 2]  # ceil(L / 4) pages
    pages = [p for s in seqs for p in cache.block_tables[s]]
    assert len(set(pages)) == len(pages) == 6 and cache.num_free_pages == 12 - 6
    assert cache.block_tables[seqs[0]] != [0, 1, 2]  # round-robin appends interleave pages
    for s, (K, V) in zip(seqs, contiguous, strict=True):
        K_got, V_got = cache.gather(s)
        np.testing.assert_array_equal(K_got, K)
        np.testing.assert_array_equal(V_got, V)
        for t in range(cache.lengths[s]):  # token t: slot t % ps of page block_table[t // ps]
            page = cache.block_tables[s][t // 4]
            np.testing.assert_array_equal(cache.k_pages[page, :, t % 4], K[:, t])
    table, lengths = cache.block_table(seqs)
    assert table.shape == (4, 3) and lengths.tolist() == [9, 0, 1, 8]
    assert table[1].tolist() == [-1, -1, -1] and table[2, 1:].tolist() == [-1, -1]
    assert table[0].tolist() == cache.block_tables[seqs[0]]


def test_free_returns_pages_to_the_pool_and_they_are_reused():
    rng = np.random.default_rng(1)
    cache = PagedKVCache(num_pages=4, page_size=2, num_kv_heads=1, head_dim=2)
    (a, b), _ = fill(cache, rng, [4, 4], chunk=2)
    assert cache.num_free_pages == 0
    freed = list(cache.block_tables[a])
    cache.free(a)
    assert cache.num_free_pages == 2 and a not in cache.lengths
    (c,), [(K, V)] = fill(cache, rng, [3])
    assert cache.block_tables[c] == freed  # handed out again, in the order they came back
    np.testing.assert_array_equal(cache.gather(c)[0], K)
    with pytest.raises(ValueError, match=f"seq {a} is not a sequence of this cache"):
        cache.append(a, K, V)


def test_a_full_pool_refuses_and_writes_nothing():
    rng = np.random.default_rng(2)
    cache = PagedKVCache(num_pages=3, page_size=4, num_kv_heads=2, head_dim=3)
    (s, t), _ = fill(cache, rng, [5, 3])  # pages: 2 + 1, the pool is full
    before = (cache.k_pages.copy(), cache.v_pages.copy(), dict(cache.lengths))
    tables = {x: list(p) for x, p in cache.block_tables.items()}
    k1 = np.ones((2, 1, 3), np.float32)
    cache.append(t, k1, k1)  # slot 3 of t's page is free: no new page needed
    with pytest.raises(CacheFullError) as info:
        cache.append(s, np.ones((2, 4, 3), np.float32), np.ones((2, 4, 3), np.float32))
    message = str(info.value)
    for needle in (
        "cache is full",
        f"sequence {s} (5 tokens)",
        "1 more pages of 4 tokens",
        "for 4 new ones",
        "0 of 3 are free",
    ):
        assert needle in message, (needle, message)
    assert isinstance(info.value, RuntimeError)
    assert cache.lengths == before[2] | {t: 4} and cache.block_tables == tables
    pages = cache.block_tables[s]
    np.testing.assert_array_equal(cache.k_pages[pages], before[0][pages])  # s's pages as they were
    np.testing.assert_array_equal(cache.v_pages[pages], before[1][pages])
    cache.append(s, np.ones((2, 3, 3), np.float32), np.ones((2, 3, 3), np.float32))  # fits
    assert cache.lengths[s] == 8


# ---- paged equals contiguous ----------------------------------------------------------------


@st.composite
def paged_problems(draw):
    """A cache with random page size, heads and dtype-free float64 data; sequences of random
    lengths (0 and 1 included) appended in random chunks, with throwaway sequences freed in
    between so that block tables are out of order; Nq new queries per sequence."""
    rng = draw(rngs)
    page_size = draw(st.integers(1, 6), label="page_size")
    Hkv, G = draw(st.integers(1, 2), label="Hkv"), draw(st.integers(1, 3), label="G")
    d, dv = draw(st.integers(1, 5), label="d"), draw(st.integers(1, 5), label="dv")
    lengths = draw(st.lists(st.integers(0, 25), min_size=1, max_size=4), label="lengths")
    throwaway = draw(st.lists(st.integers(1, 12), max_size=3), label="freed")
    pages = sum(-(-L // page_size) for L in lengths + throwaway)
    cache = PagedKVCache(pages + 2, page_size, Hkv, d, dv, dtype=np.float64)
    scratch, _ = fill(cache, rng, throwaway, chunk=4)
    for s in scratch[::2]:  # free some: their pages return to the back of the pool
        cache.free(s)
    seqs, contiguous = fill(cache, rng, lengths, chunk=draw(st.integers(1, 7), label="chunk"))
    Nq = draw(st.integers(1, 4), label="Nq")
    q = rng.standard_normal((len(seqs), G * Hkv, Nq, d))
    causal = draw(st.sampled_from(["bottom_right", False]), label="causal")
    return cache, seqs, contiguous, q, causal


@settings(max_examples=150, deadline=None)
@given(problem=paged_problems())
def test_paged_equals_contiguous(problem):
    cache, seqs, contiguous, q, causal = problem
    with no_warnings():  # sequences of length 0 (and L < Nq) must not warn
        O, lse = paged_attention(q, cache, seqs, causal=causal, return_lse=True)
    O_ref, lse_ref = reference(q, contiguous, causal)
    assert_close(O, O_ref, RTOL64, "O vs float64 reference")
    assert_close(lse, lse_ref, RTOL64, "lse vs float64 reference")
    for b, (K, V) in enumerate(contiguous):  # and the library's own contiguous attention
        mask = bottom_right_pairs(q.shape[2], K.shape[1]) if causal else None
        O_b, lse_b = naive_attention(q[b], K, V, mask=mask, return_lse=True)
        assert_close(O[b], O_b, RTOL64, f"O of sequence {b} vs naive_attention")
        assert_close(lse[b], lse_b, RTOL64, f"lse of sequence {b} vs naive_attention")


@settings(max_examples=40, deadline=None)
@given(problem=paged_problems())
def test_grouped_heads_equal_a_cache_of_repeated_heads(problem):
    # GQA equals repeating the K/V heads, for the paged cache too: the same tokens in a cache
    # with Hq K/V heads (each K/V head repeated G times) give the same result.
    cache, seqs, contiguous, q, causal = problem
    G = q.shape[1] // cache.num_kv_heads
    wide = PagedKVCache(
        cache.num_pages,
        cache.page_size,
        q.shape[1],
        cache.head_dim,
        cache.head_dim_v,
        dtype=np.float64,
    )
    wide_seqs = [wide.new_sequence() for _ in seqs]
    for s, (K, V) in zip(wide_seqs, contiguous, strict=True):
        wide.append(s, np.repeat(K, G, axis=0), np.repeat(V, G, axis=0))
    O, lse = paged_attention(q, cache, seqs, causal=causal, return_lse=True)
    O_rep, lse_rep = paged_attention(q, wide, wide_seqs, causal=causal, return_lse=True)
    assert_close(O, O_rep, RTOL64, "O")
    assert_close(lse, lse_rep, RTOL64, "lse")


def test_only_the_pages_in_use_are_read():
    # NaN everywhere the sequences' tokens are not: free pages, the unfilled slots of the
    # last pages, and the pages of a sequence outside the batch. One NaN read would spread.
    rng = np.random.default_rng(3)
    cache = PagedKVCache(num_pages=10, page_size=4, num_kv_heads=2, head_dim=4, dtype=np.float64)
    cache.k_pages[:] = np.nan
    cache.v_pages[:] = np.nan
    seqs, contiguous = fill(cache, rng, [7, 1, 10, 0], chunk=3)  # last pages partly filled
    (other,), _ = fill(cache, rng, [6])
    for p in cache.block_tables[other]:
        cache.k_pages[p] = cache.v_pages[p] = np.nan
    assert np.isnan(cache.k_pages).any() and cache.num_free_pages > 0
    q = rng.standard_normal((4, 4, 2, 4))
    with no_warnings():
        O, lse = paged_attention(q, cache, seqs, return_lse=True)
    assert not np.isnan(O).any() and not np.isnan(lse).any()
    O_ref, lse_ref = reference(q, contiguous, "bottom_right")
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


def test_sequences_of_length_zero_and_one():
    rng = np.random.default_rng(4)
    cache = PagedKVCache(num_pages=4, page_size=8, num_kv_heads=1, head_dim=3, dtype=np.float64)
    (empty, one), [_, (K, V)] = fill(cache, rng, [0, 1])
    q = rng.standard_normal((2, 3, 1, 3))  # decoding: one query per sequence
    with no_warnings():
        O, lse = paged_attention(q, cache, [empty, one], return_lse=True)
    assert not O[0].any() and np.isneginf(lse[0]).all()  # no key: zeros and -inf
    np.testing.assert_allclose(O[1], np.broadcast_to(V[0], (3, 1, 3)), rtol=1e-15)  # one key
    score = np.einsum("hqd,d->hq", q[1], K[0, 0]) / np.sqrt(3)  # (Hq, 1)
    assert_close(lse[1], score, RTOL64, "lse of a single key is its score")


def test_bottom_right_alignment():
    # Prefill of Nq = 3 new tokens against a sequence of L = 8: query i sits at position
    # 5 + i and sees keys 0..5 + i, so the last query sees everything and the first misses
    # two keys. Top-left alignment would give query 0 key 0 alone.
    rng = np.random.default_rng(5)
    cache = PagedKVCache(num_pages=4, page_size=3, num_kv_heads=1, head_dim=4, dtype=np.float64)
    (s,), [(K, V)] = fill(cache, rng, [8])
    q = rng.standard_normal((1, 2, 3, 4))
    O = paged_attention(q, cache, [s])
    for i in range(3):
        O_i, _ = attention_gqa_ref(q[0][:, i : i + 1], K[:, : 6 + i], V[:, : 6 + i])
        assert_close(O[0][:, i : i + 1], O_i, RTOL64, f"query {i}")
    top_left, _ = attention_gqa_ref(q[0][:, :1], K[:, :1], V[:, :1])
    assert rel_error(O[0][:, :1], top_left) > 1e-3
    # With Nq = L the alignments agree: the top-left causal attention of the whole prompt.
    q8 = rng.standard_normal((1, 2, 8, 4))
    assert_close(
        paged_attention(q8, cache, [s]),
        naive_attention(q8[0], K, V, causal=True)[None],
        RTOL64,
        "Nq = L",
    )
    # Decoding (Nq = 1): bottom-right hides nothing.
    q1 = q8[:, :, :1]
    np.testing.assert_array_equal(
        paged_attention(q1, cache, [s]), paged_attention(q1, cache, [s], causal=False)
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_error_at_most_twice_naive(dtype):
    rng = np.random.default_rng(6)
    cache = PagedKVCache(num_pages=40, page_size=16, num_kv_heads=2, head_dim=32, dtype=dtype)
    seqs, contiguous = fill(cache, rng, [200, 77, 4], chunk=40)  # every query sees a key
    q = rng.standard_normal((3, 8, 4, 32)).astype(dtype)
    O, lse = paged_attention(q, cache, seqs, return_lse=True)
    assert O.dtype == dtype and lse.dtype == np.float32
    O_ref, _ = reference(q, contiguous, "bottom_right")
    eps = np.finfo(dtype).eps
    for b, (K, V) in enumerate(contiguous):
        mask = bottom_right_pairs(4, K.shape[1])
        O_low, _ = attention_naive_lowp(
            q[b], np.repeat(K, 4, 0), np.repeat(V, 4, 0), dtype, mask=mask
        )
        assert rel_error(O[b], O_ref[b]) <= 2 * rel_error(O_low, O_ref[b]) + eps


def test_no_kv_copy_per_query_head():
    # 32 query heads on 4 K/V heads, one sequence of 8192 tokens (8 MiB of K in float32):
    # a copy per query head would be 64 MiB; paged attention holds a page at a time.
    rng = np.random.default_rng(7)
    cache = PagedKVCache(num_pages=64, page_size=128, num_kv_heads=4, head_dim=64)
    s = cache.new_sequence()
    k = rng.standard_normal((4, 8192, 64), dtype=np.float32)
    cache.append(s, k, k)
    q = rng.standard_normal((1, 32, 1, 64), dtype=np.float32)
    peak = peak_bytes(paged_attention, q, cache, [s])
    K_MiB = k.nbytes / 2**20
    print(f"paged_attention peak {peak / 2**20:.2f} MiB; the sequence's K is {K_MiB:.0f} MiB")
    assert peak < k.nbytes / 8


# ---- errors ---------------------------------------------------------------------------------


def expect(exc_type, call, *needles):
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, type(info.value)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


@pytest.mark.parametrize(
    "kw, exc, needle",
    [
        (dict(num_pages=0), ValueError, "num_pages must be >= 1, got 0"),
        (dict(page_size=2.5), TypeError, "page_size must be an int, got float"),
        (dict(num_kv_heads=0), ValueError, "num_kv_heads must be >= 1"),
        (dict(head_dim=True), TypeError, "head_dim must be an int, got bool"),
        (dict(head_dim_v=-1), ValueError, "head_dim_v must be >= 1"),
        (dict(dtype=np.int32), TypeError, "expected float16, float32 or float64"),
        (dict(dtype="bfloat17"), TypeError, "dtype is 'bfloat17'"),
        (dict(dtype=None), TypeError, "dtype is None"),
    ],
)
def test_bad_cache_arguments(kw, exc, needle):
    args = dict(num_pages=4, page_size=2, num_kv_heads=1, head_dim=2) | kw
    expect(exc, lambda: PagedKVCache(**args), needle)


def small_cache():
    cache = PagedKVCache(num_pages=4, page_size=2, num_kv_heads=2, head_dim=3, head_dim_v=4)
    s = cache.new_sequence()
    cache.append(s, np.zeros((2, 3, 3), np.float32), np.zeros((2, 3, 4), np.float32))
    return cache, s


def test_bad_appends_are_refused_and_change_nothing():
    cache, s = small_cache()
    k, v = np.ones((2, 1, 3), np.float32), np.ones((2, 1, 4), np.float32)
    state = (dict(cache.lengths), cache.num_free_pages, cache.k_pages.copy())
    expect(
        TypeError, lambda: cache.append("0", k, v), "seq must be an int (a sequence id), got str"
    )
    expect(TypeError, lambda: cache.append(True, k, v), "seq must be an int", "got bool")
    expect(
        ValueError,
        lambda: cache.append(7, k, v),
        "seq 7 is not a sequence of this cache",
        "its sequences: [0]",
        "new_sequence()",
    )
    expect(
        ValueError,
        lambda: cache.append(s, k[0], v),
        "k_new has shape (1, 3)",
        "(Hkv, n, 3) with Hkv = 2",
    )
    expect(ValueError, lambda: cache.append(s, k[:1], v), "k_new has shape (1, 1, 3)")
    expect(
        ValueError,
        lambda: cache.append(s, k, v[..., :3]),
        "v_new has shape (2, 1, 3)",
        "(Hkv, n, 4)",
    )
    expect(
        ValueError,
        lambda: cache.append(s, k, np.ones((2, 2, 4), np.float32)),
        "v_new has 2 tokens but k_new has 1",
    )
    expect(
        TypeError,
        lambda: cache.append(s, k.astype(np.float64), v),
        "k_new has dtype float64 but the cache holds float32",
        "k_new.astype(np.float32)",
    )
    expect(TypeError, lambda: cache.append(s, k, v.astype(int)), "v_new has dtype int64")
    assert (dict(cache.lengths), cache.num_free_pages) == state[:2]
    np.testing.assert_array_equal(cache.k_pages, state[2])
    expect(ValueError, lambda: cache.free(3), "seq 3 is not a sequence of this cache")


@pytest.fixture
def no_work(monkeypatch):
    """Any state created inside paged_attention fails the test: errors must come first."""

    class Refuse:
        @staticmethod
        def empty(*args, **kwargs):
            raise AssertionError("paged_attention started work before checking its arguments")

    monkeypatch.setattr(flashref.kvcache, "SoftmaxState", Refuse)


@pytest.mark.usefixtures("no_work")
def test_bad_paged_attention_arguments_are_refused_before_any_work():
    cache, s = small_cache()
    q = np.zeros((1, 4, 2, 3), np.float32)
    call = paged_attention
    expect(
        ValueError,
        lambda: call(q, cache, [s], causal=True),
        "causal=True is the top-left mask",
        "the mask of paged_attention is bottom-right",
        "causal='bottom_right'",
    )
    expect(ValueError, lambda: call(q, cache, [s], causal=np.True_), "top-left")
    expect(
        ValueError,
        lambda: call(q, cache, [s], causal="top_left"),
        "causal='top_left' is the top-left mask",
    )
    expect(
        ValueError,
        lambda: call(q, cache, [s], causal="bottom"),
        "causal must be False, True, 'top_left' or 'bottom_right', got 'bottom'",
    )
    expect(
        TypeError,
        lambda: call(q, cache, [s], causal=None),
        "causal must be False, True, 'top_left' or 'bottom_right', got NoneType",
    )
    expect(TypeError, lambda: call(q, cache, [s], causal=0), "got int")
    expect(
        TypeError, lambda: call(q, cache, [s], return_lse=1), "return_lse must be a bool, got int"
    )
    expect(TypeError, lambda: call(q, {"k": 1}, [s]), "cache must be a PagedKVCache, got dict")
    expect(ValueError, lambda: call(q[0], cache, [s]), "q has shape (4, 2, 3)", "(B, Hq, Nq, d)")
    expect(
        ValueError,
        lambda: call(q[..., :2], cache, [s]),
        "q has shape (1, 4, 2, 2)",
        "head dim d = 3",
    )
    expect(
        ValueError,
        lambda: call(q[:, :3], cache, [s]),
        "q has 3 heads but the cache has 2",
        "a multiple of the K/V heads",
    )
    expect(TypeError, lambda: call(q.astype(int), cache, [s]), "q has dtype int64")
    expect(ValueError, lambda: call(q, cache, [s, s]), "q has 1 sequences (axis 0) but seqs has 2")
    expect(ValueError, lambda: call(q, cache, [5]), "seqs[0] 5 is not a sequence of this cache")
    expect(TypeError, lambda: call(q, cache, [1.0]), "seqs[0] must be an int")
    expect(TypeError, lambda: call(q, cache, s), "seqs must be a list of sequence ids, got int")
    expect(TypeError, lambda: call(q, cache, "0"), "seqs must be a list of sequence ids, got str")
    expect(ValueError, lambda: call(q, cache, [s], scale=0.0), "scale must be finite and nonzero")
    expect(TypeError, lambda: call(q, cache, [s], scale="1"), "scale must be a real number")


def test_numpy_ids_and_an_empty_batch():
    cache, s = small_cache()
    q = np.ones((1, 2, 1, 3), np.float32)
    np.testing.assert_array_equal(
        paged_attention(q, cache, np.array([s])), paged_attention(q, cache, [s])
    )
    np.testing.assert_array_equal(
        paged_attention(q, cache, [s], causal=np.False_),
        paged_attention(q, cache, [s], causal=False),
    )
    O, lse = paged_attention(q[:0], cache, [], return_lse=True)
    assert O.shape == (0, 2, 1, 4) and lse.shape == (0, 2, 1)


def test_a_big_endian_dtype_is_taken_as_any_input_array_is():
    """dtype='>f4' is float32 in the other byte order: the cache holds native float32, and
    big-endian arrays append as everywhere else (converted, values unchanged)."""
    cache = PagedKVCache(4, 8, 2, 16, dtype=">f4")
    assert cache.dtype == np.float32 and cache.k_pages.dtype == np.float32
    seq = cache.new_sequence()
    k = np.arange(2 * 3 * 16, dtype=">f4").reshape(2, 3, 16)
    cache.append(seq, k, k)
    assert np.array_equal(cache.gather(seq)[0], k.astype(np.float32))
    with pytest.raises(TypeError, match="dtype is '>i4'; expected float16, float32 or float64"):
        PagedKVCache(4, 8, 2, 16, dtype=">i4")


def test_paged_attention_takes_every_spelling_of_its_mask():
    """``"bottom_right"`` (the default) and ``False`` are the two masks it computes; the
    top-left spellings are refused (``test_bad_paged_attention_arguments_...``)."""
    cache, s = small_cache()
    q = np.random.default_rng(1).standard_normal((1, 4, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(
        paged_attention(q, cache, [s], causal="bottom_right"), paged_attention(q, cache, [s])
    )
    full = paged_attention(q, cache, [s], causal=np.False_)
    np.testing.assert_array_equal(full, paged_attention(q, cache, [s], causal=False))


def test_page_table_reserves_all_or_nothing():
    """The host bookkeeping both caches share: pages for several sequences at once, or
    none (``CacheFullError`` naming the sequence that needs most), lengths untouched."""
    from flashref.kvcache import PageTable

    t = PageTable(num_pages=5, page_size=4)
    a, b = t.new_sequence(), t.new_sequence()
    assert t.reserve({a: 9, b: 1}) == {a: 0, b: 0}  # 3 pages and 1
    assert t.block_tables == {a: [0, 1, 2], b: [3]} and t.lengths == {a: 0, b: 0}
    t.lengths[b] = 4  # b's page is full
    with pytest.raises(CacheFullError) as info:
        t.reserve({a: 13, b: 1})  # one more page each: 2 > 1 free
    for needle in (
        "sequence 0 (0 tokens) needs 1 more pages of 4 tokens for 13 new ones",
        "(2 for the 2 sequences of the step)",
        "1 of 5 are free",
    ):
        assert needle in str(info.value), (needle, str(info.value))
    assert t.block_tables == {a: [0, 1, 2], b: [3]} and t.num_free_pages == 1
    assert t.reserve({a: 12}) == {}  # 12 tokens fit in a's 3 pages: nothing new
    assert t.reserve({b: 4}) == {b: 1} and t.block_tables[b] == [3, 4]
    table, lengths = t.table([b, a], width=4)
    np.testing.assert_array_equal(table, [[3, 4, -1, -1], [0, 1, 2, -1]])
    np.testing.assert_array_equal(lengths, [4, 0])
    t.free(a)
    assert t.num_free_pages == 3 and a not in t.lengths
    with pytest.raises(ValueError, match="seq 0 is not a sequence of this cache"):
        t.check_seq(a)
    with pytest.raises(TypeError, match="seq must be an int"):
        t.check_seq(True)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (2.5, TypeError, r"needs\[1\] must be an int, got float"),
        (2.0, TypeError, r"needs\[1\] must be an int, got float"),
        (np.float64(3.0), TypeError, r"needs\[1\] must be an int, got float64"),
        ("3", TypeError, r"needs\[1\] must be an int, got str"),
        (None, TypeError, r"needs\[1\] must be an int, got NoneType"),
        (True, TypeError, r"needs\[1\] must be an int, got bool"),
        (-1, ValueError, r"needs\[1\] must be >= 0, got -1"),
    ],
)
def test_reserve_checks_every_entry_before_it_gives_a_page(bad, error, match):
    """All or nothing: a bad entry after a good one raises, naming the entry, and the good
    one got no page."""
    table = PageTable(8, 4)
    a, b = table.new_sequence(), table.new_sequence()
    with pytest.raises(error, match=match):
        table.reserve({a: 3, b: bad})
    assert table.block_tables == {a: [], b: []} and table.num_free_pages == 8
    with pytest.raises(error, match=match):
        table.check_room({a: 3, b: bad})


def test_reserve_names_a_bad_mapping_or_sequence():
    table = PageTable(8, 4)
    a = table.new_sequence()
    with pytest.raises(TypeError, match=r"needs must be a dict \{seq: new tokens\}, got list"):
        table.reserve([(a, 3)])
    with pytest.raises(ValueError, match="needs key 7 is not a sequence of this cache"):
        table.reserve({a: 3, 7: 1})
    assert table.block_tables[a] == [] and table.num_free_pages == 8
    assert table.reserve({a: np.int64(5)}) == {a: 0} and len(table.block_tables[a]) == 2


@pytest.mark.parametrize(
    "width, error, match",
    [
        (1, ValueError, r"width is 1 but sequence 0 holds 2 pages; width must be at least 2"),
        (-1, ValueError, r"width must be >= 0, got -1"),
        (2.0, TypeError, r"width must be an int, got float"),
        ("3", TypeError, r"width must be an int, got str"),
    ],
)
def test_table_names_a_bad_width(width, error, match):
    table = PageTable(8, 4)
    a, b = table.new_sequence(), table.new_sequence()
    table.reserve({a: 5, b: 1})  # two pages, one page
    with pytest.raises(error, match=match):
        table.table([a, b], width=width)
    bt, lengths = table.table([a, b], width=np.int64(3))
    assert bt.tolist() == [[0, 1, -1], [2, -1, -1]] and lengths.tolist() == [0, 0]
