"""Every kernel version of flashref.gpu against a float64 reference (needs a GPU).

The ground truth is ``flashref.naive_attention`` on the host in float64, fed the
very same (fp16- or fp32-rounded) inputs the kernel sees. The tolerance follows
FlashAttention's rule: a kernel's error may be at most about twice the error of
the naive algorithm run in the kernel's own precision (matmul, softmax, matmul
on the GPU in fp16 or fp32), measured here on the same inputs, plus a small
floor for inputs where that naive error happens to be exactly zero, and never
above an absolute ceiling per dtype (``flashref.gpu.tolerances``).

Every launch writes into buffers filled with NaN, so an element the kernel
forgets to write fails the comparison (NaN never passes).
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

from flashref import naive_attention
from flashref.gpu.tolerances import CEILING, LSE_TOL, tolerance

pytestmark = pytest.mark.gpu

# (leading dims, Nq, Nk): N = 1, primes, a block size + 1, Nq != Nk both ways, several batch dims
SHAPES = [
    ((1, 1), 1, 1),
    ((2, 3), 17, 17),
    ((1, 2), 1000, 1000),
    ((1, 1), 4097, 4097),
    ((2,), 100, 37),
    ((3,), 37, 300),
    ((2, 2, 2), 129, 65),
]


def _versions():
    """Every version but the architecture-specific (sm_90a) ones: those run only on compute
    capability 9.0, each case in its own process (tests/gpu/test_forward_sm90a.py)."""
    from flashref.gpu import VERSIONS

    return [v for v in VERSIONS.values() if not v.arch]


def _version_dtypes():
    """(version, dtype) for every dtype every version takes: fp16 and bf16 for tensor cores."""
    return [(v, dt) for v in _versions() for dt in v.dtypes]


def _host(dtype: str):
    from flashref.gpu.tolerances import host_dtype

    return host_dtype(dtype)


@functools.cache
def _case(dtype: str, lead, Nq, Nk, d, causal):
    """Inputs (numpy, rounded to dtype), float64 reference (O, lse), seeded per case."""
    seed = zlib.crc32(repr((dtype, lead, Nq, Nk, d, causal)).encode())  # stable across runs
    rng = np.random.default_rng(seed)
    dt = _host(dtype)  # bfloat16 is ml_dtypes.bfloat16, as CuPy holds it
    q = rng.standard_normal((*lead, Nq, d)).astype(np.float32).astype(dt)
    k = rng.standard_normal((*lead, Nk, d)).astype(np.float32).astype(dt)
    v = rng.standard_normal((*lead, Nk, d)).astype(np.float32).astype(dt)
    ref, ref_lse = naive_attention(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        causal=causal,
        return_lse=True,
    )
    return q, k, v, ref, ref_lse


def _naive_same_precision(cp, q, k, v, causal):
    """matmul, softmax, matmul in q's precision on the GPU (the 2x baseline).

    fp16 and fp32 run in that dtype with CuPy's own kernels. CuPy's bfloat16 support does not
    cover every operation used here, so for bf16 the same steps run in fp32 and every
    intermediate a bf16 implementation would store (S, P, O) is rounded to bf16.
    """
    d, Nq, Nk = q.shape[-1], q.shape[-2], k.shape[-2]
    if str(q.dtype) == "bfloat16":
        bf16 = q.dtype  # kept: q is replaced by its float32 copy below

        def rnd(x):
            return x.astype(bf16).astype(cp.float32)

        q, k, v = (x.astype(cp.float32) for x in (q, k, v))
    else:

        def rnd(x):
            return x

    S = rnd((q @ cp.swapaxes(k, -1, -2)) * float(1.0 / np.sqrt(d)))  # (..., Nq, Nk)
    if causal:
        S = cp.where(cp.arange(Nk)[None, :] <= cp.arange(Nq)[:, None], S, -cp.inf)
    S = rnd(S - S.max(axis=-1, keepdims=True))
    P = rnd(cp.exp(S))
    P = rnd(P / P.sum(axis=-1, keepdims=True))
    return rnd(P.astype(q.dtype) @ v)  # (..., Nq, d)


def _rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _run(cp, ver, q, k, v, causal):
    from flashref.gpu._launch import launch

    O = cp.full(q.shape, np.nan, dtype=cp.float32).astype(q.dtype)  # poisoned: NaN if unwritten
    lse = cp.full(q.shape[:-1], np.nan, dtype=cp.float32)
    launch(
        ver,
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        O,
        lse,
        causal=causal,
        scale=1.0 / np.sqrt(q.shape[-1]),
    )
    return O, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,Nq,Nk", SHAPES)
@pytest.mark.parametrize(
    "ver,dtype", _version_dtypes(), ids=[f"v{v.number}-{dt}" for v, dt in _version_dtypes()]
)
def test_version_matches_float64(cp, ver, dtype, lead, Nq, Nk, d, causal):
    q, k, v, ref, ref_lse = _case(dtype, lead, Nq, Nk, d, causal)
    O, lse = _run(cp, ver, q, k, v, causal)
    out, got_lse = cp.asnumpy(O), cp.asnumpy(lse)
    assert not np.isnan(out).any(), "O has NaN: some element was never written"
    assert not np.isnan(got_lse).any(), "lse has NaN: some row was never written"
    err = _rel_err(out, ref)
    naive_err = _rel_err(
        cp.asnumpy(_naive_same_precision(cp, cp.asarray(q), cp.asarray(k), cp.asarray(v), causal)),
        ref,
    )
    tol = tolerance(dtype, naive_err)
    assert err <= tol, f"rel err {err:.3e} > {tol:.3e} (naive {dtype}: {naive_err:.3e})"
    lse_err = np.abs(got_lse.astype(np.float64) - ref_lse) / (1 + np.abs(ref_lse))
    assert lse_err.max() <= LSE_TOL, f"lse rel err {lse_err.max():.3e}"


@pytest.mark.parametrize(
    "ver,dtype", _version_dtypes(), ids=[f"v{v.number}-{dt}" for v, dt in _version_dtypes()]
)
def test_same_inputs_same_bits(cp, ver, dtype):
    q, k, v, _, _ = _case(dtype, (2, 3), 1000, 1000, 64, True)
    O1, lse1 = _run(cp, ver, q, k, v, True)
    O2, lse2 = _run(cp, ver, q, k, v, True)
    assert cp.asnumpy(O1).tobytes() == cp.asnumpy(O2).tobytes()
    assert cp.asnumpy(lse1).tobytes() == cp.asnumpy(lse2).tobytes()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_public_api_default_version_out_and_lse(cp, dtype):
    from flashref.gpu import flash_attention

    q, k, v, ref, ref_lse = _case(dtype, (2, 3), 17, 17, 64, True)
    out = cp.full(q.shape, np.nan, dtype=cp.float32).astype(q.dtype)
    O, lse = flash_attention(
        cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True, return_lse=True, out=out
    )
    assert O is out and str(O.dtype) == dtype and lse.dtype == np.float32
    assert lse.shape == q.shape[:-1]
    assert _rel_err(cp.asnumpy(O), ref) <= CEILING[dtype]
    assert np.max(np.abs(cp.asnumpy(lse) - ref_lse)) <= LSE_TOL * 10


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_default_is_the_table_of_this_gpu(cp, dtype, d, causal):
    """version=None runs what default_forward_version names for this GPU's compute capability (on an
    H200 the sm_90a table): the same bits as asking for that version by number."""
    from flashref.gpu import flash_attention
    from flashref.gpu._runtime import device_cc
    from flashref.gpu.forward_versions import default_forward_version

    number = default_forward_version(dtype, d, causal, device_cc(cp))
    q, k, v, ref, _ = _case(dtype, (2, 2), 300, 300, d, causal)
    q, k, v = cp.asarray(q), cp.asarray(k), cp.asarray(v)
    O = flash_attention(q, k, v, causal=causal)
    O_n = flash_attention(q, k, v, causal=causal, version=number)
    assert cp.asnumpy(O).tobytes() == cp.asnumpy(O_n).tobytes(), f"default is not v{number}"
    assert _rel_err(cp.asnumpy(O), ref) <= CEILING[dtype]


@pytest.mark.parametrize("number", [1, 2, 8])
def test_scale_non_contiguous_and_no_keys(cp, number):
    from flashref.gpu import VERSIONS, flash_attention

    ver = VERSIONS[number]
    rng = np.random.default_rng(number)
    x = rng.standard_normal((2, 50, 3, 64)).astype(ver.dtype)  # (B, N, H, d): a transposed view
    q = cp.asarray(x).transpose(0, 2, 1, 3)  # (B, H, N, d), not contiguous
    for scale in (-0.3, 0.05):  # a negative scale is folded into q for the fp16 versions
        O = flash_attention(q, q, q, scale=scale, version=number)
        x64 = x.astype(np.float64).transpose(0, 2, 1, 3)
        ref = naive_attention(x64, x64, x64, scale=scale)
        assert _rel_err(cp.asnumpy(O), ref) <= CEILING[ver.dtype]
    empty = cp.zeros((2, 3, 0, 64), dtype=ver.dtype)  # Nk = 0: every row sees no key
    O, lse = flash_attention(q, empty, empty, version=number, return_lse=True)
    assert (cp.asnumpy(O) == 0).all() and np.isneginf(cp.asnumpy(lse)).all()


def test_fp32_versions_take_odd_head_dims(cp):
    from flashref.gpu import VERSIONS

    for number in (1, 2):
        q, k, v, ref, _ = _case("float32", (2,), 33, 70, 40, True)
        O, _ = _run(cp, VERSIONS[number], q, k, v, True)
        assert _rel_err(cp.asnumpy(O), ref) <= CEILING["float32"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_tensors_in_and_out(cp, dtype):
    torch = pytest.importorskip("torch")
    from flashref.gpu import flash_attention

    q, k, v, ref, ref_lse = _case(dtype, (2, 3), 100, 130, 64, False)
    tq, tk, tv = (torch.from_dlpack(cp.asarray(x)) for x in (q, k, v))
    O, lse = flash_attention(tq, tk, tv, return_lse=True)
    assert isinstance(O, torch.Tensor) and O.dtype == getattr(torch, dtype) and O.is_cuda
    assert _rel_err(cp.asnumpy(cp.from_dlpack(O)), ref) <= CEILING[dtype]
    assert np.max(np.abs(cp.asnumpy(cp.from_dlpack(lse)) - ref_lse)) <= LSE_TOL * 10
    with pytest.raises(TypeError, match="q is a torch tensor on cpu"):
        flash_attention(tq.cpu(), tk, tv)
