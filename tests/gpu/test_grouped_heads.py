"""Grouped K/V heads in the forward ``flash_attention`` (needs a GPU).

``q (..., Hq, Nq, d)`` against ``k``, ``v (..., Hkv, Nk, d)``: query head ``h`` uses K/V head
``h // G``. Inputs the decode kernel does not take (more than 16 queries, a version asked for,
fp32, leading dims other than (B, H)) run a numbered version once per group member; the float64
reference is the NumPy ``naive_attention``, which takes grouped heads itself, and the tolerance
the 2x-naive rule of tests/gpu/test_forward.py, with the naive baseline run on K/V repeated
to q's heads.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from test_forward import _host, _naive_same_precision, _rel_err

from flashref import naive_attention
from flashref.gpu.tolerances import LSE_TOL, tolerance

pytestmark = pytest.mark.gpu


# (lead, Hq, Hkv, Nq, Nk, d, version): Nq > 16 (not the decode kernel), odd shapes, MQA
CASES = [
    ((2,), 8, 2, 100, 37, 64, None),
    ((1,), 4, 1, 300, 300, 128, None),  # multi-query
    ((2, 3), 6, 3, 17, 129, 64, None),  # two leading dims before the heads
    ((2,), 8, 4, 5, 70, 128, 14),  # Nq <= 16 but a version asked for
    ((1,), 4, 2, 65, 65, 64, 2),  # fp32 version
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead,Hq,Hkv,Nq,Nk,d,version", CASES)
def test_grouped_forward_matches_float64(cp, lead, Hq, Hkv, Nq, Nk, d, version, causal):
    from flashref.gpu import VERSIONS, flash_attention

    dtype = "float32" if version == 2 else "float16"
    seed = zlib.crc32(repr((lead, Hq, Hkv, Nq, Nk, d, version, causal)).encode())
    rng = np.random.default_rng(seed)
    dt = _host(dtype)
    q = rng.standard_normal((*lead, Hq, Nq, d)).astype(np.float32).astype(dt)
    k = rng.standard_normal((*lead, Hkv, Nk, d)).astype(np.float32).astype(dt)
    v = rng.standard_normal((*lead, Hkv, Nk, d)).astype(np.float32).astype(dt)
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    ref, ref_lse = naive_attention(*f64, causal=causal, return_lse=True)
    G = Hq // Hkv
    kr, vr = (cp.asarray(np.repeat(x, G, axis=-3)) for x in (k, v))  # baseline only
    naive = cp.asnumpy(_naive_same_precision(cp, cp.asarray(q), kr, vr, causal))
    out = cp.full(q.shape, np.nan, dtype=cp.float32).astype(q.dtype)  # NaN if unwritten
    O, lse = flash_attention(
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        causal=causal,
        version=version,
        return_lse=True,
        out=out,
    )
    got, got_lse = cp.asnumpy(O), cp.asnumpy(lse)
    label = f"{lead} Hq={Hq} Hkv={Hkv} Nq={Nq} Nk={Nk} d={d} version={version} {causal=}"
    assert not np.isnan(got).any(), f"{label}: O has NaN (an element never written)"
    assert not np.isnan(got_lse).any(), f"{label}: lse has NaN"
    err, naive_err = _rel_err(got, ref), _rel_err(naive, ref)
    tol = tolerance(dtype, naive_err)
    assert err <= tol, f"{label}: rel err {err:.3e} > {tol:.3e} (naive {naive_err:.3e})"
    lse_err = np.abs(got_lse.astype(np.float64) - ref_lse) / (1 + np.abs(ref_lse))
    assert lse_err.max() <= LSE_TOL, f"{label}: lse rel err {lse_err.max():.3e}"
    ver = VERSIONS[version] if version is not None else None
    assert ver is None or dtype in ver.dtypes


def test_grouped_forward_leaves_kv_alone_and_repeats_bitwise(cp):
    from flashref.gpu import flash_attention

    rng = np.random.default_rng(7)
    q = cp.asarray(rng.standard_normal((2, 8, 200, 64)).astype(np.float16))
    k = cp.asarray(rng.standard_normal((2, 2, 300, 64)).astype(np.float16))
    v = cp.asarray(rng.standard_normal((2, 2, 300, 64)).astype(np.float16))
    k0, v0 = k.copy(), v.copy()
    O1 = flash_attention(q, k, v, causal=True)
    O2 = flash_attention(q, k, v, causal=True)
    assert cp.asnumpy(O1).tobytes() == cp.asnumpy(O2).tobytes()
    assert bool((k == k0).all()) and bool((v == v0).all())
    # the same as repeating K/V to q's heads, bit for bit: the same kernel on the same rows
    O3 = flash_attention(q, cp.repeat(k, 4, axis=1), cp.repeat(v, 4, axis=1), causal=True)
    assert cp.asnumpy(O1).tobytes() == cp.asnumpy(O3).tobytes()


# The backward: dK and dV of a shared K/V head sum over its G query heads. The float64
# reference is the NumPy naive_attention_backward (grouped heads itself); the naive baseline
# runs on K/V repeated to q's heads and sums its dK, dV over each group in float32, rounding
# each member's share first, as the kernel's grouped launch does.
BWD_CASES = [((2,), 8, 2, 100, 37, 64), ((1,), 4, 1, 300, 300, 128), ((2, 3), 6, 3, 17, 129, 64)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead,Hq,Hkv,Nq,Nk,d", BWD_CASES)
def test_grouped_backward_matches_float64(cp, lead, Hq, Hkv, Nq, Nk, d, causal, dtype):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backward"))
    from test_backward_kernels import _naive_same_precision as naive_bwd
    from test_backward_kernels import _rel_errs, _worst

    from flashref import naive_attention_backward
    from flashref.gpu import BWD_VERSIONS, flash_attention_backward
    from flashref.gpu.tolerances import backward_tolerance

    seed = zlib.crc32(repr(("bwd", lead, Hq, Hkv, Nq, Nk, d, causal, dtype)).encode())
    rng = np.random.default_rng(seed)
    dt = _host(dtype)
    q, do = (rng.standard_normal((*lead, Hq, Nq, d)).astype(np.float32).astype(dt) for _ in "qo")
    k, v = (rng.standard_normal((*lead, Hkv, Nk, d)).astype(np.float32).astype(dt) for _ in "kv")
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    o, lse = naive_attention(*f64[:3], causal=causal, return_lse=True)
    o, lse = o.astype(dt), lse.astype(np.float32)  # what a forward kernel hands on
    ref = naive_attention_backward(
        *f64[:3], o.astype(np.float64), lse.astype(np.float64), f64[3], causal=causal
    )
    G, scale = Hq // Hkv, 1 / np.sqrt(d)
    gq, gk, gv, go, gdo = (cp.asarray(x) for x in (q, k, v, o, do))
    kr, vr = (cp.repeat(x, G, axis=-3) for x in (gk, gv))
    n_dq, n_dk, n_dv = naive_bwd(cp, gq, kr, vr, go, gdo, causal, scale)  # (..., Hq, ...)

    def group_sum(x):  # (..., Hq, N, d) -> (..., Hkv, N, d), shares rounded, summed in float32
        x = x.astype(dt).astype(np.float32).reshape(*lead, Hkv, G, *x.shape[-2:])
        return x.sum(axis=-3).astype(dt).astype(np.float64)

    naive_errs = _rel_errs((n_dq, group_sum(n_dk), group_sum(n_dv)), ref)
    for ver in BWD_VERSIONS.values():
        if ver.arch:  # sm_90a: in child processes only (tests/backward/test_backward_sm90a.py)
            continue
        got = flash_attention_backward(
            gq, gk, gv, go, cp.asarray(lse), gdo, causal=causal, version=ver.number
        )
        got = [cp.asnumpy(x) for x in got]
        errs = _rel_errs(got, ref)
        Tc = -(-Nk // ver.Bc)
        label = f"bwd{ver.number} {lead} Hq={Hq} Hkv={Hkv} Nq={Nq} Nk={Nk} d={d} {dtype} {causal=}"
        for i, name in enumerate(("dq", "dk", "dv")):
            atomic = Tc if (name == "dq" and not ver.deterministic_dq) else 0
            tol = backward_tolerance(dtype, naive_errs[i], atomic)
            assert errs[i] <= tol, (
                f"{label}: {name} rel err {errs[i]:.3e} > tol {tol:.3e} (naive "
                f"{naive_errs[i]:.3e}); {_worst(got[i], ref[i])}"
            )
