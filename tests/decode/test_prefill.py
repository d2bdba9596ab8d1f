"""Chunked prefill on the GPU (``flashref.gpu.decode.prefill.paged_prefill_attention``).

- Against ``flashref.paged_attention`` in float64 on the same dtype-rounded values: ragged
  lengths, pages out of order (two sequences appended in turns), grouped heads, Nq from 1 to
  more than a query block, bottom-right causal and none, host and device tables, d 64 and
  128, float16 and bfloat16, page sizes 64 and 128.
- Split keys (``splits`` > 1, a second kernel merging the splits): the same reference at 2,
  3 and 16 splits, where some sequences have too few key tiles for every split (empty
  splits) and some have many; the default choice splits a short chunk and gives the result
  of one split within the tolerance.
- A 1000-token prompt written chunk by chunk into a ``DevicePagedKVCache`` (append, then
  attend) gives the one-pass causal forward's result (``flash_attention``) within the
  tolerance, and its float64 reference.
- Arguments are refused with their names before any work.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashref
from flashref.gpu.tolerances import CEILING

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def sm90(cp):
    cc = divmod(int(cp.cuda.Device().compute_capability), 10)
    if cc != (9, 0):
        pytest.skip(f"the prefill kernel is built for sm_90a; this GPU has {cc}")


def _rounded(rng, shape, dtype):
    import ml_dtypes  # noqa: F401

    return rng.standard_normal(shape).astype(dtype).astype(np.float64)


def _case(dtype, ps, Hkv, d, lengths, seed):
    """A float64 PagedKVCache of dtype-rounded values, its sequences filled in turns."""
    rng = np.random.default_rng(seed)
    pages = sum(-(-L // ps) for L in lengths) + 3
    cache = flashref.PagedKVCache(pages, ps, Hkv, d, dtype=np.float64)
    seqs = [cache.new_sequence() for _ in lengths]
    left = list(lengths)
    while any(left):
        for i, s in enumerate(seqs):
            n = min(left[i], int(rng.integers(1, 2 * ps)))
            if n:
                k, v = (_rounded(rng, (Hkv, n, d), dtype) for _ in range(2))
                cache.append(s, k, v)
                left[i] -= n
    return cache, seqs, rng


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _check_reference(cp, dtype, d, ps, Nq, lengths, seed, splits=None):
    """paged_prefill_attention on a cache of ``lengths`` against float64, both masks, host
    and device tables (``splits`` as given)."""
    from flashref.gpu.decode.prefill import paged_prefill_attention

    cache, seqs, rng = _case(dtype, ps, 2, d, lengths, seed=seed)
    q = _rounded(rng, (3, 4, Nq, d), dtype)
    kp, vp = (cp.asarray(x.astype(dtype)) for x in (cache.k_pages, cache.v_pages))
    table, L = cache.block_table(seqs)
    for causal in ("bottom_right", False):
        ref, ref_lse = flashref.paged_attention(q, cache, seqs, causal=causal, return_lse=True)
        for tables in ((table, L), (cp.asarray(table, dtype=cp.int32), cp.asarray(L, cp.int32))):
            O, lse = paged_prefill_attention(
                cp.asarray(q.astype(dtype)),
                kp,
                vp,
                *tables,
                causal=causal,
                return_lse=True,
                splits=splits,
            )
            O = cp.asnumpy(O).astype(np.float64)
            assert not np.isnan(O).any()
            err = _rel(O, ref)
            assert err <= CEILING[dtype], f"{causal=} {type(tables[0]).__module__}: {err}"
            np.testing.assert_allclose(cp.asnumpy(lse), ref_lse, atol=2e-2, rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("ps", [64, 128])
@pytest.mark.parametrize("Nq", [1, 70, 129, 300])
def test_against_the_float64_reference(cp, sm90, dtype, d, ps, Nq):
    _check_reference(cp, dtype, d, ps, Nq, [Nq + 5, Nq, Nq + 400], seed=Nq * 7 + d + ps)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("splits", [2, 3, 16])
def test_split_keys_against_the_float64_reference(cp, sm90, dtype, d, splits):
    Nq = 200  # two query blocks; sequences of 2, 5 and 13 key tiles (or fewer, causal)
    _check_reference(
        cp, dtype, d, 64, Nq, [Nq + 5, Nq + 400, Nq + 1400], seed=splits * 11 + d, splits=splits
    )


def test_default_splits_a_short_chunk(torch, sm90):
    from flashref.gpu._launch import device_facts
    from flashref.gpu.decode.prefill import BC, BR, default_splits, paged_prefill_attention

    H, Nq, Lk, d, ps = 8, 256, 2048, 64, 128
    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn((1, H, Nq, d), generator=g, device="cuda").half()
    kp, vp = (
        torch.randn((Lk // ps, H, ps, d), generator=g, device="cuda").half() for _ in range(2)
    )
    table = torch.arange(Lk // ps, dtype=torch.int32, device="cuda")[None]
    L = torch.tensor([Lk], dtype=torch.int32, device="cuda")
    S = default_splits(H * Nq // BR, Lk // BC, device_facts()[2])
    assert S > 1  # 16 work tiles on an H200's 132 SMs
    one, lse1 = paged_prefill_attention(q, kp, vp, table, L, splits=1, return_lse=True)
    got, lse = paged_prefill_attention(q, kp, vp, table, L, return_lse=True)
    assert (got.float() - one.float()).norm() / one.float().norm() <= CEILING["float16"]
    assert (lse - lse1).abs().max() <= 1e-3


def test_chunks_through_the_cache_equal_one_forward(torch, sm90):
    from flashref.gpu import DevicePagedKVCache, flash_attention
    from flashref.gpu.decode.prefill import paged_prefill_attention

    N, chunk, H, d = 1000, 256, 4, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn((1, H, N, d), generator=g, device="cuda").half() for _ in range(3))
    cache = DevicePagedKVCache(20, 128, H, d, max_batch=1)
    seq = cache.new_sequence()
    outs = []
    for c0 in range(0, N, chunk):
        n = min(chunk, N - c0)
        cache.begin_step([seq], n)
        cache.append(0, k[:, :, c0 : c0 + n], v[:, :, c0 : c0 + n])
        outs.append(
            paged_prefill_attention(
                q[:, :, c0 : c0 + n], *cache.pools(0), cache.block_table, cache.lengths
            )
        )
    got = torch.cat(outs, dim=2).float()
    want = flash_attention(q, k, v, causal=True).float()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True
    )
    assert (got - ref).norm() / ref.norm() <= CEILING["float16"]
    assert (got - want).norm() / want.norm() <= 2 * CEILING["float16"]


def test_arguments(torch, sm90):
    from flashref.gpu.decode.prefill import paged_prefill_attention

    q = torch.zeros((1, 2, 10, 64), dtype=torch.float16, device="cuda")
    kp = torch.zeros((4, 2, 64, 64), dtype=torch.float16, device="cuda")
    bt, L = np.array([[0, 1]], np.int32), np.array([9], np.int32)
    with pytest.raises(ValueError, match=r"lengths\[0\] is 9 but q has Nq = 10"):
        paged_prefill_attention(q, kp, kp, bt, L)
    with pytest.raises(ValueError, match="the top-left mask|top_left|refused"):
        paged_prefill_attention(q, kp, kp, bt, L + 1, causal=True)
    with pytest.raises(ValueError, match="page_size must be a multiple of 64"):
        paged_prefill_attention(q, kp[:, :, :32], kp[:, :, :32], bt, L + 1)
    with pytest.raises(TypeError, match="must share one dtype"):
        paged_prefill_attention(q, kp.float(), kp, bt, L + 1)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] is 7"):
        paged_prefill_attention(q, kp, kp, np.array([[0, 7]], np.int32), np.array([70]))
    with pytest.raises(ValueError, match=r"splits=0; it must be in 1 \.\. 16"):
        paged_prefill_attention(q, kp, kp, bt, L + 1, splits=0)
    with pytest.raises(TypeError, match="splits must be an int or None, got float"):
        paged_prefill_attention(q, kp, kp, bt, L + 1, splits=2.0)
