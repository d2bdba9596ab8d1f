"""Every backward kernel version of flashref.gpu against a float64 reference (needs a GPU).

The ground truth is ``flashref.naive_attention_backward`` on the host in float64, fed the very
same rounded inputs the kernel sees: q, k, v, dO rounded to the dtype, and O and lse from the
float64 forward, O rounded to the dtype and lse to float32 (as a forward kernel returns them).
The float64 forward rather than flashref's is used so that a failure here is the backward
kernel's own, not an error inherited from a forward version; ``test_after_flashref_forward``
runs the two kernels one after the other.

Tolerance (``flashref.gpu.tolerances.backward_tolerance``): each of dQ, dK, dV may have at most
twice the relative error of the naive backward run in the kernel's precision on the GPU (below),
plus the forward's floor, plus, for dQ when it is summed with float32 atomics, the error of
adding Tc terms in any order. A gradient that is exactly zero in float64 (dQ and dK when every
query sees one key: a softmax over one key is constant) is measured against the size of dV.

Every launch writes into buffers filled with NaN, so an element the kernels forget fails.
Failures say which shape, which gradient, the worst element and the error against its bound.
"""

from __future__ import annotations

import functools
import math
import zlib

import numpy as np
import pytest

from flashref import naive_attention, naive_attention_backward
from flashref.gpu.tolerances import BWD_CEILING, backward_tolerance

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
DTYPES = ["float16", "bfloat16"]


def _versions():
    """Every backward version but the architecture-specific (sm_90a) ones: those run only on
    compute capability 9.0, each (version, dtype, d) in its own process
    (tests/backward/test_backward_sm90a.py runs this file's cases there)."""
    from flashref.gpu import BWD_VERSIONS

    return [v for v in BWD_VERSIONS.values() if not v.arch]


def _host(dtype: str):
    from flashref.gpu.tolerances import host_dtype

    return host_dtype(dtype)


@functools.cache
def _case(dtype: str, lead, Nq, Nk, d, causal, scale=None):
    """Rounded inputs (numpy) and the float64 reference (dq, dk, dv), seeded per case."""
    seed = zlib.crc32(repr((dtype, lead, Nq, Nk, d, causal, scale)).encode())
    rng = np.random.default_rng(seed)
    dt = _host(dtype)  # bfloat16 is ml_dtypes.bfloat16, as CuPy holds it
    q, k, v = (
        rng.standard_normal((*lead, n, d)).astype(np.float32).astype(dt) for n in (Nq, Nk, Nk)
    )
    do = rng.standard_normal((*lead, Nq, d)).astype(np.float32).astype(dt)
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    o, lse = naive_attention(*f64[:3], causal=causal, scale=scale, return_lse=True)
    o, lse = o.astype(dt), lse.astype(np.float32)  # what a forward kernel hands on
    ref = naive_attention_backward(
        *f64[:3], o.astype(np.float64), lse.astype(np.float64), f64[3], causal=causal, scale=scale
    )
    return (q, k, v, o, lse, do), ref


def _naive_same_precision(cp, q, k, v, o, do, causal, scale):
    """Autograd's backward in q's precision on the GPU (the 2x baseline): P by a softmax of the
    scores, then the six products, every stored intermediate in the dtype. fp16 runs in fp16
    with CuPy's kernels; for bf16, which CuPy does not cover for every operation, the same steps
    run in fp32 with each stored intermediate rounded to bf16."""
    Nq, Nk = q.shape[-2], k.shape[-2]
    dtype = q.dtype  # kept: q is replaced by its float32 copy below for bf16
    bf16 = str(dtype) == "bfloat16"

    def rnd(x):
        return x.astype(dtype).astype(cp.float32) if bf16 else x

    if bf16:
        q, k, v, o, do = (x.astype(cp.float32) for x in (q, k, v, o, do))
    T = cp.swapaxes
    S = rnd((q @ T(k, -1, -2)) * q.dtype.type(scale))  # (..., Nq, Nk)
    if causal:
        S = cp.where(cp.arange(Nk)[None, :] <= cp.arange(Nq)[:, None], S, -cp.inf)
    S = rnd(S - S.max(axis=-1, keepdims=True))
    P = rnd(cp.exp(S))
    P = rnd(P / P.sum(axis=-1, keepdims=True))
    dV = rnd(T(P, -1, -2) @ do)  # (..., Nk, d)
    dP = rnd(do @ T(v, -1, -2))  # (..., Nq, Nk)
    D = rnd((do * o).sum(axis=-1, keepdims=True))  # (..., Nq, 1)
    dS = rnd(P * rnd(dP - D))  # (..., Nq, Nk)
    dQ = rnd(rnd(dS @ k) * q.dtype.type(scale))  # (..., Nq, d)
    dK = rnd(rnd(T(dS, -1, -2) @ q) * q.dtype.type(scale))  # (..., Nk, d)
    return tuple(cp.asnumpy(x).astype(np.float64) for x in (dQ, dK, dV))


def _rel_errs(got, ref):
    """||x - x_ref|| / ||x_ref|| per gradient; a zero reference is measured against ||dV||."""
    size_dv = np.linalg.norm(ref[2])
    out = []
    for x, r in zip(got, ref, strict=True):
        denom = np.linalg.norm(r)
        out.append(float(np.linalg.norm(np.asarray(x, np.float64) - r) / (denom or size_dv)))
    return out


def _worst(x, r) -> str:
    """Where one gradient is furthest from the reference, for failure messages."""
    diff = np.abs(np.asarray(x, np.float64) - r)
    if np.isnan(diff).any():
        idx = np.unravel_index(np.argmax(np.isnan(diff)), diff.shape)
        return f"first NaN at {idx} (never written, or NaN computed)"
    idx = np.unravel_index(np.argmax(diff), diff.shape)
    return f"worst element {idx}: got {float(np.asarray(x)[idx]):.5g}, want {r[idx]:.5g}"


def _run(cp, ver, inputs, causal, scale):
    """Launch version ``ver`` into NaN-poisoned dq, dk, dv; returns them as numpy arrays."""
    from flashref.gpu.backward import launch_backward

    q, k, v, o, lse, do = (cp.asarray(x) for x in inputs)
    dq, dk, dv = (cp.full(x.shape, np.nan, dtype=cp.float32).astype(x.dtype) for x in (q, k, v))
    launch_backward(ver, q, k, v, o, lse, do, dq, dk, dv, causal=causal, scale=scale)
    return tuple(cp.asnumpy(x) for x in (dq, dk, dv))


def _check(cp, ver, dtype, inputs, ref, causal, scale, label):
    got = _run(cp, ver, inputs, causal, scale)
    errs = _rel_errs(got, ref)
    gpu_inputs = [cp.asarray(x) for x in inputs]
    q, k, v, o, _, do = gpu_inputs
    naive = _naive_same_precision(cp, q, k, v, o, do, causal, scale)
    naive_errs = _rel_errs(naive, ref)
    adds = ver.dq_adds(k.shape[-2])  # dQ's float32 additions per element (0: deterministic)
    problems = []
    for i, name in enumerate(("dq", "dk", "dv")):
        atomic = adds if name == "dq" else 0
        tol = backward_tolerance(dtype, naive_errs[i], atomic)
        if not errs[i] <= tol:  # NaN fails
            problems.append(
                f"{name}: rel err {errs[i]:.3e} > tol {tol:.3e} (naive {dtype} {naive_errs[i]:.3e}"
                f"); {_worst(got[i], ref[i])}"
            )
    assert not problems, f"bwd{ver.number} {label}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,Nq,Nk", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ver", _versions(), ids=lambda v: f"bwd{v.number}")
def test_version_matches_float64(cp, ver, dtype, lead, Nq, Nk, d, causal):
    inputs, ref = _case(dtype, lead, Nq, Nk, d, causal)
    label = f"{dtype} lead={lead} Nq={Nq} Nk={Nk} d={d} causal={causal}"
    _check(cp, ver, dtype, inputs, ref, causal, 1.0 / math.sqrt(d), label)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ver", _versions(), ids=lambda v: f"bwd{v.number}")
def test_repeatable(cp, ver, dtype, d):
    """dK and dV: the same bits on every call, and dQ too where it is written, not added. dQ
    with atomics: the same float32 terms added in another order differ by far less than a unit
    in the last place of the 16-bit result, so after rounding an element can move by one such
    unit; the bound is one unit of the largest element (at most 2^-10 of it in fp16, 2^-7 in
    bf16: 10 and 7 fraction bits)."""
    inputs, _ = _case(dtype, (2, 3), 1000, 1000, d, True)
    a = _run(cp, ver, inputs, True, 1.0 / math.sqrt(d))
    b = _run(cp, ver, inputs, True, 1.0 / math.sqrt(d))
    for name, x, y in zip(("dk", "dv"), a[1:], b[1:], strict=True):
        assert x.tobytes() == y.tobytes(), f"bwd{ver.number} {dtype} d={d}: {name} not bitwise"
    x, y = a[0].astype(np.float64), b[0].astype(np.float64)
    if ver.deterministic_dq:
        assert a[0].tobytes() == b[0].tobytes(), f"bwd{ver.number} {dtype} d={d}: dq not bitwise"
    unit = (2.0**-10 if dtype == "float16" else 2.0**-7) * np.abs(x).max()
    diff = np.abs(x - y).max()
    assert diff <= unit, f"bwd{ver.number} {dtype} d={d}: dq runs differ by {diff:.3e} > {unit:.3e}"


_PROMISES = [(v, d, n) for v in _versions() for d, n in v.blocks_per_sm]


@pytest.mark.parametrize(
    "ver,d,blocks", _PROMISES, ids=[f"bwd{v.number}-d{d}" for v, d, _ in _PROMISES]
)
def test_blocks_per_sm_on_the_device(cp, ver, d, blocks):
    """The blocks per SM a version is built for (``BwdVersion.blocks_per_sm``), as the driver's
    occupancy calculator sees the kernel NVRTC compiled, with its dynamic shared memory."""
    from flashref.gpu.backward import get_functions

    main = get_functions(ver, d, "float16")[1]
    smem = ver.smem_bytes(d)
    occupancy = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
    got = occupancy(main.kernel.ptr, ver.threads, smem)
    assert got >= blocks, (
        f"bwd{ver.number} d={d}: {got} blocks per SM fit ({main.num_regs} registers x "
        f"{ver.threads} threads, {smem} B shared memory); the registry promises {blocks}"
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_after_flashref_forward(cp, dtype, causal):
    """Forward and backward kernels in a row, as training runs them, against float64 gradients
    of the float64 forward; the naive baseline does its own forward too."""
    from flashref.gpu import flash_attention, flash_attention_backward

    (q, k, v, o64, _, do), ref = _case(dtype, (2, 3), 300, 257, 64, causal)
    gq, gk, gv, gdo = (cp.asarray(x) for x in (q, k, v, do))
    O, lse = flash_attention(gq, gk, gv, causal=causal, return_lse=True)
    got = [cp.asnumpy(x) for x in flash_attention_backward(gq, gk, gv, O, lse, gdo, causal=causal)]
    errs = _rel_errs(got, ref)
    from flashref.gpu._runtime import device_cc
    from flashref.gpu.backward import resolve_bwd_version

    default = resolve_bwd_version(None, dtype, 64, causal, device_cc(cp))  # what ran above
    Tc = default.dq_adds(257)  # dQ's float32 additions per element in that version
    naive = _naive_same_precision(cp, gq, gk, gv, cp.asarray(o64), gdo, causal, 0.125)
    for name, err, n_err in zip(("dq", "dk", "dv"), errs, _rel_errs(naive, ref), strict=True):
        tol = backward_tolerance(dtype, n_err, Tc if name == "dq" else 0)
        assert err <= tol, f"{dtype} causal={causal} {name}: {err:.3e} > {tol:.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_public_api_cupy_and_torch(cp, dtype):
    """CuPy in, CuPy out; torch in, torch out (through DLPack), and the same bits either way."""
    from flashref.gpu import flash_attention_backward

    inputs, ref = _case(dtype, (2, 3), 100, 130, 128, False)
    args = [cp.asarray(x) for x in inputs]
    out = flash_attention_backward(*args)
    assert all(isinstance(x, cp.ndarray) and str(x.dtype) == dtype for x in out)
    assert [x.shape for x in out] == [x.shape for x in args[:3]]
    errs = _rel_errs([cp.asnumpy(x) for x in out], ref)
    assert max(errs) <= BWD_CEILING[dtype], errs
    torch = pytest.importorskip("torch")
    targs = [torch.from_dlpack(x) for x in args]
    tout = flash_attention_backward(*targs)
    assert all(isinstance(x, torch.Tensor) and x.is_cuda for x in tout)
    assert all(x.dtype == getattr(torch, dtype) for x in tout)
    for name, a, b in zip(("dk", "dv"), out[1:], tout[1:], strict=True):
        assert cp.asnumpy(a).tobytes() == cp.asnumpy(cp.from_dlpack(b)).tobytes(), name
    with pytest.raises(TypeError, match="q is a torch tensor on cpu"):
        flash_attention_backward(targs[0].cpu(), *targs[1:])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_default_is_the_table_of_this_gpu(cp, d, causal):
    """version=None runs this GPU's default (on an H200 backward version 8): dK and dV are
    the same bits as that version's by number, and all three within the ceiling."""
    from flashref.gpu import flash_attention_backward
    from flashref.gpu._runtime import device_cc
    from flashref.gpu.backward_versions import default_bwd_version

    number = default_bwd_version("float16", d, causal, device_cc(cp))
    inputs, ref = _case("float16", (2, 2), 300, 300, d, causal)
    args = [cp.asarray(x) for x in inputs]
    out = flash_attention_backward(*args, causal=causal)
    out_n = flash_attention_backward(*args, causal=causal, version=number)
    for name, a, b in zip(("dk", "dv"), out[1:], out_n[1:], strict=True):
        assert cp.asnumpy(a).tobytes() == cp.asnumpy(b).tobytes(), f"{name}: not bwd{number}"
    errs = _rel_errs([cp.asnumpy(x) for x in out], ref)
    assert max(errs) <= BWD_CEILING["float16"], errs


def test_negative_scale_transposed_views_and_empty(cp):
    """A negative scale (no row maximum in the backward: it is used as it is), inputs that are
    transposed views (copied to contiguous before the launch), and Nk = 0 or Nq = 0 (zeros)."""
    from flashref.gpu import flash_attention_backward

    inputs, ref = _case("float16", (2, 3), 50, 70, 64, True, -0.3)
    views = [
        cp.asarray(np.ascontiguousarray(np.swapaxes(x, 0, -2))).swapaxes(0, -2)
        if x.ndim == 4
        else cp.asarray(x)
        for x in inputs
    ]
    assert not views[0].flags.c_contiguous
    got = [cp.asnumpy(x) for x in flash_attention_backward(*views, causal=True, scale=-0.3)]
    errs = _rel_errs(got, ref)
    assert max(errs) <= BWD_CEILING["float16"], errs
    q, k, v, o, lse, do = (cp.asarray(x) for x in inputs)
    empty = cp.zeros((2, 3, 0, 64), dtype=q.dtype)
    dq, dk, dv = flash_attention_backward(q, empty, empty, o, lse, do)
    assert (cp.asnumpy(dq) == 0).all() and dk.shape == dv.shape == (2, 3, 0, 64)
    dq, dk, dv = flash_attention_backward(empty, k, v, empty, lse[..., :0], empty)
    assert dq.shape == (2, 3, 0, 64) and (cp.asnumpy(dk) == 0).all() and (cp.asnumpy(dv) == 0).all()
