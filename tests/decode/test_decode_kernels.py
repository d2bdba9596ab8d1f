"""The split-KV decode kernels of flashref.gpu.decode against float64 references (needs a GPU).

References are computed on the host in float64 from the very same (fp16- or bf16-rounded)
inputs: ``flashref.naive_attention`` with the lengths and the bottom-right causal mask,
``flashref.split_kv_attention`` for the split counts, ``flashref.paged_attention`` for the
paged cache. The tolerance is ``flashref.gpu.tolerances``' rule (at most about twice the
error of matmul, softmax, matmul in the kernel's own precision on the same inputs). The
kernels write into memory CuPy hands out uninitialised, and ``lse`` and ``O`` are checked for
NaN; a failure names the case, the worst element and its error against the tolerance.
"""

from __future__ import annotations

import copy
import functools
import zlib

import numpy as np
import pytest

from flashref import PagedKVCache, naive_attention, paged_attention, split_kv_attention
from flashref.gpu.decode import BC, SM90A_VERSIONS, VERSIONS
from flashref.gpu.tolerances import LSE_TOL, tolerance

pytestmark = pytest.mark.gpu
DECODE_VERSIONS = sorted(VERSIONS)  # every kernel version runs every case
VERSION_IDS = [f"v{v}" for v in DECODE_VERSIONS]  # -k v3 picks version 3's cases


@pytest.fixture(autouse=True)
def _sm90a_only(request, cp):
    """Versions 5 and 6 (sm_90a) run on compute capability 9.0 only: skipped elsewhere, with why."""
    spec = getattr(request.node, "callspec", None)
    version = spec.params.get("version") if spec else None
    if version in SM90A_VERSIONS:
        cc = tuple(int(c) for c in divmod(int(cp.cuda.Device().compute_capability), 10))
        if cc != (9, 0):
            pytest.skip(f"decode version {version} needs compute capability 9.0, this GPU has {cc}")


def _host(dtype: str):
    from flashref.gpu.tolerances import host_dtype

    return host_dtype(dtype)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))  # stable across runs


def _inputs(dtype, B, Hq, Hkv, Nq, Nk, d, key):
    """q, k, v rounded to dtype (NumPy), seeded by the case."""
    rng, dt = _rng(dtype, B, Hq, Hkv, Nq, Nk, d, key), _host(dtype)
    q = rng.standard_normal((B, Hq, Nq, d)).astype(np.float32).astype(dt)
    k = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
    v = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
    return q, k, v


def _allowed(lengths, Nq, Nk, causal):
    """(B, 1, Nq, Nk) bool: key j < L_b, and j <= i + L_b - Nq when causal (bottom-right)."""
    L = np.asarray(lengths)[:, None, None, None]
    i, j = np.arange(Nq)[None, None, :, None], np.arange(Nk)[None, None, None, :]
    ok = j < L
    return ok & (j <= i + L - Nq) if causal else ok


def _reference(q, k, v, allowed, scale=None):
    f64 = (x.astype(np.float64) for x in (q, k, v))
    return naive_attention(*f64, mask=allowed, scale=scale, return_lse=True)


def _naive_same_precision(cp, q, k, v, allowed, scale):
    """matmul, softmax, matmul in q's precision on the GPU, K/V heads repeated (the 2x baseline).

    As in tests/gpu/test_forward.py: bf16 runs in fp32 with every stored intermediate rounded
    to bf16.
    A row that sees no key gives zeros.
    """
    q, k, v = (cp.asarray(x) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    k, v = cp.repeat(k, G, axis=1), cp.repeat(v, G, axis=1)  # (B, Hq, Nk, d)
    if str(q.dtype) == "bfloat16":
        dt = q.dtype

        def rnd(x):
            return x.astype(dt).astype(cp.float32)

        q, k, v = (x.astype(cp.float32) for x in (q, k, v))
    else:

        def rnd(x):
            return x

    S = rnd((q @ cp.swapaxes(k, -1, -2)) * q.dtype.type(scale))  # (B, Hq, Nq, Nk)
    S = cp.where(cp.asarray(allowed), S, -cp.inf)
    mx = S.max(axis=-1, keepdims=True)
    S = rnd(S - cp.where(cp.isfinite(mx), mx, 0))
    P = rnd(cp.exp(S))
    den = P.sum(axis=-1, keepdims=True)
    P = rnd(P / cp.where(den > 0, den, 1))
    return cp.asnumpy(rnd(P.astype(q.dtype) @ v)).astype(np.float64)


def _rel(out, ref) -> float:
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / n) if n > 0 else float(np.abs(out - ref).max())


def _check(label, dtype, out, lse, ref, ref_lse, naive):
    """O within the 2x-naive tolerance, lse within LSE_TOL, -inf exactly where no key is seen."""
    out = np.asarray(out).astype(np.float64)
    lse = np.asarray(lse).astype(np.float64)
    assert not np.isnan(out).any(), f"{label}: O has NaN at {np.argwhere(np.isnan(out))[:3]}"
    assert not np.isnan(lse).any(), f"{label}: lse has NaN at {np.argwhere(np.isnan(lse))[:3]}"
    err, tol = _rel(out, ref), tolerance(dtype, _rel(naive, ref))
    if not err <= tol:
        worst = np.unravel_index(np.argmax(np.abs(out - ref)), out.shape)
        raise AssertionError(
            f"{label}: rel err {err:.3e} > tol {tol:.3e} (naive {dtype}: {_rel(naive, ref):.3e}); "
            f"worst element (b, h, i, c) = {tuple(int(x) for x in worst)}: got "
            f"{out[worst]:.6g}, reference {ref[worst]:.6g}"
        )
    empty = np.isneginf(ref_lse)
    wrong = np.argwhere(np.isneginf(lse) != empty)
    assert not wrong.size, f"{label}: lse -inf mismatch at (b, h, i) = {wrong[:3].tolist()}"
    assert (out[empty] == 0).all(), f"{label}: a row that sees no key is not zeros"
    if (~empty).any():
        e = np.abs(lse[~empty] - ref_lse[~empty]) / (1 + np.abs(ref_lse[~empty]))
        assert e.max() <= LSE_TOL, f"{label}: lse rel err {e.max():.3e} > {LSE_TOL:.1e}"


# (B, Hq, Hkv, Nq, lengths): G = 1, 4, 8 and MQA; Nq 1, 3, 16; lengths 0, 1, ragged, odd
SHAPES = [
    (1, 1, 1, 1, [193]),
    (2, 4, 1, 3, [1, 257]),  # MQA
    (3, 8, 2, 1, [0, 300, 65]),  # G = 4
    (3, 8, 8, 3, [300, 0, 1]),  # G = 1
    (2, 8, 1, 16, [300, 17]),  # MQA, G * Nq = 128 rows: 2 row tiles, 4 row blocks
    (2, 16, 2, 16, [129, 300]),  # G = 8, Nq = 16
    (1, 8, 2, 3, [300]),  # G * Nq = 12 rows
]
NK = 300  # keys in the cache; not a multiple of any tile


@pytest.mark.parametrize("causal", [False, "bottom_right"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("B,Hq,Hkv,Nq,lengths", SHAPES)
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_decode_matches_float64(cp, version, B, Hq, Hkv, Nq, lengths, dtype, d, causal):
    from flashref.gpu import decode_attention

    q, k, v = _inputs(dtype, B, Hq, Hkv, Nq, NK, d, "decode")
    allowed = _allowed(lengths, Nq, NK, bool(causal))
    ref, ref_lse = _reference(q, k, v, allowed)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(d))
    L = cp.asarray(np.array(lengths, dtype=np.int32))
    for S in (None, 1, 3):
        O, lse = decode_attention(
            cp.asarray(q),
            cp.asarray(k),
            cp.asarray(v),
            lengths=L,
            causal=causal,
            num_splits=S,
            return_lse=True,
            version=version,
        )
        label = f"v{version} B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} L={lengths} {dtype} d={d}"
        label += f" {causal=} splits={S}"
        _check(label, dtype, cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_every_split_count_matches_split_kv_attention(cp, version, dtype):
    """num_splits from 1 to past the 7 tiles of Nk = 389 (empty splits included), all keys."""
    from flashref.gpu import decode_attention

    B, Hq, Hkv, Nq, Nk, d = 2, 8, 2, 3, 389, 128
    q, k, v = _inputs(dtype, B, Hq, Hkv, Nq, Nk, d, "splits")
    allowed = _allowed([Nk] * B, Nq, Nk, False)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(d))
    qc, kc, vc = (cp.asarray(x) for x in (q, k, v))
    for S in range(1, 11):
        f64 = (x.astype(np.float64) for x in (q, k, v))
        ref, ref_lse = split_kv_attention(*f64, num_splits=S, return_lse=True)
        O, lse = decode_attention(qc, kc, vc, num_splits=S, return_lse=True, version=version)
        _check(
            f"v{version} {dtype} num_splits={S}",
            dtype,
            cp.asnumpy(O),
            cp.asnumpy(lse),
            ref,
            ref_lse,
            naive,
        )


@pytest.mark.parametrize("dtype,d", [("float16", 128), ("bfloat16", 64)])
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_many_splits_match_float64(cp, version, dtype, d):
    """Split counts across the combine's lane map: version 3 holds splits s, s + 32, ... of
    a row in lane s % 32 and loads 16 splits' O per round (at d = 64, two per warp step), so
    S = 15, 16, 17, 31, 32, 33, 64, 100, 128 cross every edge; 130 tiles, so every split has
    keys; one row of length 1000 makes most of its splits empty."""
    from flashref.gpu import decode_attention

    B, Hq, Hkv, Nq, Nk = 2, 8, 2, 2, 64 * 130 - 5
    lengths = [Nk, 1000]
    q, k, v = _inputs(dtype, B, Hq, Hkv, Nq, Nk, d, "many-splits")
    allowed = _allowed(lengths, Nq, Nk, False)
    ref, ref_lse = _reference(q, k, v, allowed)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(d))
    qc, kc, vc = (cp.asarray(x) for x in (q, k, v))
    L = cp.asarray(np.array(lengths, dtype=np.int32))
    for S in (15, 16, 17, 31, 32, 33, 64, 100, 128):
        O, lse = decode_attention(
            qc, kc, vc, lengths=L, num_splits=S, return_lse=True, version=version
        )
        label = f"v{version} {dtype} d={d} Nk={Nk} L={lengths} num_splits={S}"
        _check(label, dtype, cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)


def _paged_case(dtype, page_size, Hkv, d, lengths, seed):
    """A float64 PagedKVCache of dtype-rounded values, filled in ragged round-robin chunks
    (so sequences' pages interleave), one sequence freed and its pages reused; then the pool
    permuted, so block tables are shuffled. Returns (cache, seqs, k_pages, v_pages, table)."""
    rng, dt = _rng("paged", dtype, page_size, Hkv, d, tuple(lengths), seed), _host(dtype)
    pages = sum(-(-L // page_size) for L in lengths) + 4
    cache = PagedKVCache(pages, page_size, Hkv, d, dtype=np.float64)

    def kv(n):
        return rng.standard_normal((Hkv, n, d)).astype(np.float32).astype(dt).astype(np.float64)

    victim = cache.new_sequence()
    cache.append(victim, kv(2 * page_size), kv(2 * page_size))
    seqs, left = [cache.new_sequence() for _ in lengths], list(lengths)
    cache.free(victim)  # its pages go to the back of the free list, handed out later
    while any(left):
        for i, s in enumerate(seqs):
            n = min(left[i], int(rng.integers(1, 2 * page_size)))
            if n:
                cache.append(s, kv(n), kv(n))
                left[i] -= n
    perm = rng.permutation(cache.num_pages)  # page p of the cache is page perm[p] on the GPU
    k_pages, v_pages = np.empty_like(cache.k_pages), np.empty_like(cache.v_pages)
    k_pages[perm], v_pages[perm] = cache.k_pages, cache.v_pages
    table, L = cache.block_table(seqs)
    table = np.where(table >= 0, perm[np.maximum(table, 0)], -1)
    return cache, seqs, k_pages.astype(dt), v_pages.astype(dt), table, L


def _naive_paged(cp, cache, seqs, q, dtype, causal):
    """The same-precision baseline on the cache's sequences gathered into one padded array."""
    L = [cache.lengths[s] for s in seqs]
    Kc = np.zeros((len(seqs), cache.num_kv_heads, max(L), cache.head_dim))  # (B, Hkv, Nk, d)
    Vc = np.zeros_like(Kc)
    for b, s in enumerate(seqs):
        Kc[b, :, : L[b]], Vc[b, :, : L[b]] = cache.gather(s)
    dt, allowed = _host(dtype), _allowed(L, q.shape[2], max(L), causal)
    return _naive_same_precision(
        cp, q, Kc.astype(dt), Vc.astype(dt), allowed, 1 / np.sqrt(q.shape[3])
    )


@pytest.mark.parametrize("causal", [False, "bottom_right"])
@pytest.mark.parametrize("page_size", [16, 64, 100, 128])
@pytest.mark.parametrize("dtype,d", [("float16", 128), ("bfloat16", 64)])
@pytest.mark.parametrize("Hq,Hkv,Nq", [(8, 2, 1), (4, 4, 3), (8, 1, 16)])
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_paged_matches_paged_attention(cp, version, Hq, Hkv, Nq, dtype, d, page_size, causal):
    """page_size 16 and 64: version 2 reads the table once per 16 keys; 100: once per key.
    Versions 5 and 6 take page sizes that are multiples of 64 only, and refuse the others."""
    from flashref.gpu import paged_decode_attention

    if version in SM90A_VERSIONS and page_size % BC:
        q = np.zeros((2, Hq, Nq, d), dtype=_host(dtype))  # refused before any GPU work
        kp = np.zeros((4, Hkv, page_size, d), dtype=_host(dtype))
        with pytest.raises(
            ValueError, match=rf"page_size is {page_size}; decode version {version}"
        ):
            paged_decode_attention(q, kp, kp, np.zeros((2, 1), np.int32), [1, 1], version=version)
        return

    lengths = [0, 1, 250, 65]  # last pages partly filled; an empty sequence; one key
    cache, seqs, kp, vp, table, L = _paged_case(dtype, page_size, Hkv, d, lengths, Hq)
    B = len(lengths)
    rng = _rng("paged-q", Hq, Nq, d)
    q = rng.standard_normal((B, Hq, Nq, d)).astype(np.float32).astype(_host(dtype))
    ref, ref_lse = paged_attention(
        q.astype(np.float64), cache, seqs, causal=causal, return_lse=True
    )
    naive = _naive_paged(cp, cache, seqs, q, dtype, bool(causal))
    args = (cp.asarray(q), cp.asarray(kp), cp.asarray(vp), cp.asarray(table.astype(np.int32)))
    for S in (None, 1, 2, 5):
        O, lse = paged_decode_attention(
            *args,
            cp.asarray(L.astype(np.int32)),
            causal=causal,
            num_splits=S,
            return_lse=True,
            version=version,
        )
        label = f"v{version} paged ps={page_size} Hq={Hq} Hkv={Hkv} Nq={Nq} {dtype} d={d}"
        label += f" {causal=} S={S}"
        _check(label, dtype, cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)


@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_cache_convenience_and_host_tables(cp, version):
    """A PagedKVCache with its pools on the GPU; the block table straight from block_table()."""
    from flashref.gpu import cache_decode_attention

    ps = BC if version in SM90A_VERSIONS else 32  # versions 5, 6 take multiples of 64
    cache, seqs, _, _, _, _ = _paged_case("float16", ps, 2, 64, [70, 5, 0], 0)
    q = _rng("conv").standard_normal((3, 4, 2, 64)).astype(np.float16)
    ref, ref_lse = paged_attention(q.astype(np.float64), cache, seqs, return_lse=True)
    gpu = copy.copy(cache)  # the same tables, the pools on the GPU
    gpu.k_pages, gpu.v_pages = (
        cp.asarray(x.astype(np.float16)) for x in (cache.k_pages, cache.v_pages)
    )
    O, lse = cache_decode_attention(cp.asarray(q), gpu, seqs, return_lse=True, version=version)
    naive = _naive_paged(cp, cache, seqs, q, "float16", True)
    _check(
        f"v{version} cache_decode_attention",
        "float16",
        cp.asnumpy(O),
        cp.asnumpy(lse),
        ref,
        ref_lse,
        naive,
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_same_inputs_same_bits(cp, version, dtype):
    from flashref.gpu import decode_attention

    q, k, v = (cp.asarray(x) for x in _inputs(dtype, 2, 8, 2, 3, 1000, 128, "bits"))
    L = cp.asarray(np.array([1000, 333], dtype=np.int32))
    for S in (1, 6):
        kw = {"lengths": L, "num_splits": S, "return_lse": True, "version": version}
        O1, lse1 = decode_attention(q, k, v, **kw)
        O2, lse2 = decode_attention(q, k, v, **kw)
        assert cp.asnumpy(O1).tobytes() == cp.asnumpy(O2).tobytes(), f"v{version}: O differs, {S=}"
        assert cp.asnumpy(lse1).tobytes() == cp.asnumpy(lse2).tobytes(), f"v{version}: lse, {S=}"


def _first_difference(a, b) -> str:
    """Where two arrays of one shape first differ, and by how much at most (NaN-aware)."""
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    where = tuple(int(x) for x in np.argwhere(differ)[0])
    with np.errstate(invalid="ignore"):
        worst = np.nanmax(np.abs(a - b)[differ])
    x, y = float(a[where]), float(b[where])
    return (
        f"{differ.sum()} elements differ, first at {where}: {x!r} vs {y!r}, "
        f"largest difference {worst:.3e}"
    )


@pytest.mark.parametrize("version", [6], ids=["v6"])
def test_version_6_is_version_5_with_its_merge_moved(cp, version):
    """Version 6 runs version 5's split kernel and merges with version 3's combine, the merge
    version 5 runs in its last split block (the same function, the splits in the same order):
    the same bits as version 5 at one split and at many, contiguous and paged."""
    from flashref.gpu import decode_attention, paged_decode_attention

    B, Hq, Hkv, Nq, Nk, d = 3, 16, 2, 2, 1024, 128
    q, k, v = (cp.asarray(x) for x in _inputs("bfloat16", B, Hq, Hkv, Nq, Nk, d, "v6-is-v5"))
    lengths = cp.asarray(np.array([1024, 333, 0], dtype=np.int32))
    n = Nk // BC  # pages of 64 keys; sequence b's pages are b, b + B, ...
    kp, vp = (
        cp.ascontiguousarray(x.reshape(B, Hkv, n, BC, d).transpose(2, 0, 1, 3, 4)).reshape(
            n * B, Hkv, BC, d
        )
        for x in (k, v)
    )
    table = cp.asarray((np.arange(n)[None, :] * B + np.arange(B)[:, None]).astype(np.int32))
    runs = {
        "contiguous": functools.partial(decode_attention, q, k, v, lengths=lengths),
        "paged": functools.partial(paged_decode_attention, q, kp, vp, table, lengths),
    }
    for S in (1, 3, 16, None):
        for what, run in runs.items():
            O5, lse5 = run(num_splits=S, return_lse=True, version=5)
            O6, lse6 = run(num_splits=S, return_lse=True, version=version)
            O5, lse5, O6, lse6 = (cp.asnumpy(x) for x in (O5, lse5, O6, lse6))
            label = f"v{version} vs v5 {what} B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} splits={S}"
            assert O6.tobytes() == O5.tobytes(), f"{label}: O: {_first_difference(O6, O5)}"
            assert lse6.tobytes() == lse5.tobytes(), (
                f"{label}: lse: {_first_difference(lse6, lse5)}"
            )


@pytest.mark.parametrize("version", [4, 5], ids=["v4", "v5"])
def test_counters_are_zero_after_every_call(cp, version):
    """Versions 4 and 5's arrival counters: back to 0 after each call, so calls of other shapes and
    split counts sharing the buffer merge correctly, and a call repeated gives the same bits.
    (Without the reset, the second call's blocks would never see the last count.)"""
    from flashref.gpu import decode_attention, decode_plan, paged_decode_attention
    from flashref.gpu.decode.buffers import counter_buffer

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    # (B, Hq, Hkv, Nq, lengths, num_splits, paged): 1 to 128 splits, 1 to 4 row blocks
    for B, Hq, Hkv, Nq, lengths, S, paged in [
        (2, 8, 2, 3, [1000, 333], 6, False),
        (2, 8, 2, 3, [1000, 333], 6, False),  # the same call again on the same counters
        (3, 8, 1, 16, [0, 1, 700], 5, True),  # 4 row blocks, an empty sequence
        (1, 4, 4, 1, [1000], 128, False),  # many splits, most of them with no key
        (2, 8, 2, 3, [1000, 333], 1, False),  # one split: no counter touched
        (2, 8, 2, 3, [1000, 333], None, True),
    ]:
        Nk = 1024  # the paged calls' page_size: a multiple of 64, as version 5 needs
        q, k, v = _inputs("bfloat16", B, Hq, Hkv, Nq, Nk, 128, "counters")
        allowed = _allowed(lengths, Nq, Nk, False)
        ref, ref_lse = _reference(q, k, v, allowed)
        naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(128))
        L = np.array(lengths, dtype=np.int32)
        qc = cp.asarray(q)
        if paged:  # every sequence's Nk keys as its own Nk-slot page: pages b = sequence b
            args = (qc, cp.asarray(k), cp.asarray(v), np.arange(B, dtype=np.int32)[:, None], L)
            kw = {"causal": False}
            run = paged_decode_attention
        else:
            args, kw, run = (qc, cp.asarray(k), cp.asarray(v)), {"lengths": L}, decode_attention
        O, lse = run(*args, **kw, num_splits=S, return_lse=True, version=version)
        label = f"v{version} B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} L={lengths} splits={S} {paged=}"
        _check(label, "bfloat16", cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)
        O2, lse2 = run(*args, **kw, num_splits=S, return_lse=True, version=version)
        assert cp.asnumpy(O2).tobytes() == cp.asnumpy(O).tobytes(), f"{label}: O differs twice"
        assert cp.asnumpy(lse2).tobytes() == cp.asnumpy(lse).tobytes(), f"{label}: lse differs"
        plan = decode_plan(B, Hq, Hkv, Nq, Nk, 128, sms, num_splits=S, version=version)
        counters = cp.asnumpy(counter_buffer(cp, B * plan.grid[1]))
        dirty = np.flatnonzero(counters)
        assert not dirty.size, (
            f"{label}: {dirty.size} counters left non-zero after the call, first "
            f"counters[{dirty[0]}] = {counters[dirty[0]]} (grid {plan.grid})"
        )


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_nan_in_unused_cache_slots_never_reaches_o(cp, version, d):
    """Keys past a sequence's length are NaN in K and V (contiguous: the slots past L, read
    by a tile that crosses L; paged: the stale slots of partly filled pages and whole unused
    pages). Masked scores and V rows that cannot reach O: no NaN, and the float64 result."""
    from flashref.gpu import decode_attention, paged_decode_attention

    B, Hq, Hkv, Nq, Nk, dtype = 4, 8, 2, 3, 320, "float16"
    lengths = [1, 65, 200, 0]  # a tile crosses L inside a warp's 16 keys, and at its start
    q, k, v = _inputs(dtype, B, Hq, Hkv, Nq, Nk, d, "nan")
    allowed = _allowed(lengths, Nq, Nk, False)
    ref, ref_lse = _reference(q, k, v, allowed)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(d))
    kn, vn = k.copy(), v.copy()
    for b, L in enumerate(lengths):
        kn[b, :, L:], vn[b, :, L:] = np.nan, np.nan
    L = np.array(lengths, dtype=np.int32)
    for S in (1, 2):
        O, lse = decode_attention(
            cp.asarray(q),
            cp.asarray(kn),
            cp.asarray(vn),
            lengths=L,
            num_splits=S,
            return_lse=True,
            version=version,
        )
        label = f"v{version} NaN past L, contiguous d={d} splits={S}"
        _check(label, dtype, cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)
    ps = 64  # pages of 64 slots; sequence b's pages are b, b + B, ... (interleaved)
    n = Nk // ps
    kp = kn.reshape(B, Hkv, n, ps, d).transpose(2, 0, 1, 3, 4).reshape(n * B, Hkv, ps, d)
    vp = vn.reshape(B, Hkv, n, ps, d).transpose(2, 0, 1, 3, 4).reshape(n * B, Hkv, ps, d)
    table = (np.arange(n)[None, :] * B + np.arange(B)[:, None]).astype(np.int32)  # (B, n)
    kp, vp = (cp.asarray(np.ascontiguousarray(x)) for x in (kp, vp))
    O, lse = paged_decode_attention(
        cp.asarray(q),
        kp,
        vp,
        table,
        L,
        causal=False,
        num_splits=2,
        return_lse=True,
        version=version,
    )
    label = f"v{version} NaN in stale page slots, paged ps={ps} d={d}"
    _check(label, dtype, cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)


@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_scale_all_empty_and_noncontiguous(cp, version):
    from flashref.gpu import decode_attention

    q, k, v = _inputs("float16", 2, 4, 2, 1, 130, 64, "scale")
    allowed = _allowed([130, 130], 1, 130, False)
    for scale in (-0.3, 0.05):  # a negative scale is folded into q
        ref, ref_lse = _reference(q, k, v, allowed, scale)
        naive = _naive_same_precision(cp, q, k, v, allowed, scale)
        kt = cp.asarray(np.ascontiguousarray(k.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
        O, lse = decode_attention(
            cp.asarray(q), kt, cp.asarray(v), scale=scale, return_lse=True, version=version
        )
        _check(
            f"v{version} scale={scale}",
            "float16",
            cp.asnumpy(O),
            cp.asnumpy(lse),
            ref,
            ref_lse,
            naive,
        )
    L = cp.zeros(2, dtype=cp.int32)  # no sequence has a key
    O, lse = decode_attention(
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        lengths=L,
        num_splits=3,
        return_lse=True,
        version=version,
    )
    assert (cp.asnumpy(O) == 0).all(), f"v{version}: no key seen, O is not zeros"
    assert np.isneginf(cp.asnumpy(lse)).all(), f"v{version}: no key seen, lse is not -inf"


@pytest.mark.parametrize("version", DECODE_VERSIONS, ids=VERSION_IDS)
def test_torch_tensors_in_and_out(cp, version):
    torch = pytest.importorskip("torch")
    from flashref.gpu import decode_attention

    q, k, v = _inputs("bfloat16", 2, 8, 2, 1, 500, 128, "torch")
    allowed = _allowed([500, 200], 1, 500, False)
    ref, ref_lse = _reference(q, k, v, allowed)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(128))
    tq, tk, tv = (torch.from_dlpack(cp.asarray(x)) for x in (q, k, v))
    L = torch.tensor([500, 200], dtype=torch.int32, device="cuda")
    O, lse = decode_attention(tq, tk, tv, lengths=L, return_lse=True, version=version)
    assert isinstance(O, torch.Tensor) and O.dtype == torch.bfloat16 and O.is_cuda
    out = cp.asnumpy(cp.from_dlpack(O))
    _check(
        f"v{version} torch", "bfloat16", out, cp.asnumpy(cp.from_dlpack(lse)), ref, ref_lse, naive
    )
    with pytest.raises(TypeError, match="q is a torch tensor on cpu"):
        decode_attention(tq.cpu(), tk, tv)


def test_errors_before_any_work(cp):
    from flashref.gpu import decode_attention, paged_decode_attention

    q, k, v = (cp.asarray(x) for x in _inputs("float16", 2, 4, 2, 1, 64, 64, "err"))
    with pytest.raises(ValueError, match=r"lengths\[1\] is 65; expected 0 <= length <= 64"):
        decode_attention(q, k, v, lengths=np.array([3, 65], dtype=np.int32))  # host: checked
    kp = cp.zeros((3, 2, 16, 64), dtype=cp.float16)
    table = np.array([[0, 1], [2, 7]], dtype=np.int32)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] is 7"):
        paged_decode_attention(q, kp, kp, table, np.array([5, 20]))
    # device tables are read where they are (their values are not): both or neither
    with pytest.raises(TypeError, match="lengths is a host array but the other table is on"):
        paged_decode_attention(q, kp, kp, cp.asarray(table), np.array([5, 20]))
    with pytest.raises(ValueError, match=r"lengths has shape \(3,\); expected \(2,\)"):
        decode_attention(q, k, v, lengths=cp.asarray([1, 2, 3]))


@pytest.mark.parametrize("Nq,Nk,causal", [(3, 300, False), (16, 16, True), (1, 1, True)])
def test_flash_attention_routes_grouped_heads_to_decode(cp, Nq, Nk, causal):
    from flashref.gpu import flash_attention

    q, k, v = _inputs("float16", 2, 8, 2, Nq, Nk, 128, "route")
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    ref, ref_lse = naive_attention(*f64, causal=causal, return_lse=True)  # top-left
    allowed = np.tril(np.ones((Nq, Nk), bool)) if causal else np.ones((Nq, Nk), bool)
    naive = _naive_same_precision(cp, q, k, v, allowed, 1 / np.sqrt(128))
    out = cp.full(q.shape, np.nan, dtype=cp.float16)
    O, lse = flash_attention(
        cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal, return_lse=True, out=out
    )
    assert O is out
    label = f"flash_attention grouped Nq={Nq} Nk={Nk} {causal=}"
    _check(label, "float16", cp.asnumpy(O), cp.asnumpy(lse), ref, ref_lse, naive)


@pytest.mark.parametrize("page_size", [None, 64, 100])
def test_default_version_is_this_gpus(cp, page_size):
    """version=None runs default_decode_version of this GPU (on an H200 version 5 for a contiguous
    cache or 64-key pages, version 3 for pages of 100): the same bits as that version by number."""
    from flashref.gpu._launch import device_facts
    from flashref.gpu.decode import decode_attention, default_decode_version, paged_decode_attention

    cc = device_facts()[0]
    q, k, v = (cp.asarray(x) for x in _inputs("float16", 2, 8, 2, 1, 1000, 128, "default"))
    if page_size is None:
        number = default_decode_version(cc)
        run = functools.partial(decode_attention, q, k, v, lengths=cp.asarray([1000, 37]))
    else:
        number = default_decode_version(cc, page_size)
        pages = -(-1000 // page_size)  # sequence b in pages b*pages .. (b+1)*pages - 1
        pad = pages * page_size - 1000
        kp, vp = (cp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
        kp, vp = (
            x.reshape(2, 2, pages, page_size, 128)
            .transpose(0, 2, 1, 3, 4)
            .reshape(2 * pages, 2, page_size, 128)
            for x in (kp, vp)
        )
        table = cp.arange(2 * pages, dtype=cp.int32).reshape(2, pages)
        kp, vp = cp.ascontiguousarray(kp), cp.ascontiguousarray(vp)
        run = functools.partial(paged_decode_attention, q, kp, vp, table, cp.asarray([1000, 37]))
    O, O_n = run(), run(version=number)
    assert cp.asnumpy(O).tobytes() == cp.asnumpy(O_n).tobytes(), f"default is not v{number}"
    ref = decode_attention(q, k, v, lengths=cp.asarray([1000, 37]), version=1)
    assert float(cp.abs(O.astype(cp.float32) - ref.astype(cp.float32)).max()) < 2e-2
