"""Run every kernel version once and compare it with the float64 reference.

    python -m flashref.bench selfcheck            # a few shapes, d = 64 and 128
    python -m flashref.bench selfcheck --small    # one small ragged shape per case (for
                                                # compute-sanitizer memcheck / racecheck)
    python -m flashref.bench selfcheck --decode   # only the split-KV decode kernels, small
                                                # ragged and paged cases (for the sanitizers)
    python -m flashref.bench selfcheck --backward [--small]   # the backward versions instead
    python -m flashref.bench selfcheck --prefill  # the chunked-prefill kernel (sm_90a), small
                                                # ragged paged cases, one and three key splits

Prints one line per (version, d, causal) with the relative error
||O - O_ref|| / ||O_ref|| and the largest |lse - lse_ref|, and exits with 1 if
any output holds a NaN or an error is above 1e-2 (fp16) / 1e-4 (fp32). With ``--backward``,
one line per (backward version, dtype, d, causal) with the relative errors of dq, dk, dv.
"""

from __future__ import annotations

import numpy as np

from flashref.attention import naive_attention
from flashref.backward import naive_attention_backward

from ..gpu import BWD_VERSIONS, VERSIONS
from ..gpu._runtime import device_cc, require_gpu
from ..gpu.backward import launch_backward
from ..gpu.decode import VERSIONS as DECODE_VERSIONS
from ..gpu.decode.prefill import paged_prefill_attention
from ..gpu.tolerances import host_dtype
from .cli import ArgumentParser

LIMIT = {"float16": 1e-2, "bfloat16": 3e-2, "float32": 1e-4}  # loose: a smoke test only


PROG = "python -m flashref.bench selfcheck"


def check(ver, d: int, causal: bool, shape_q, shape_k, seed: int = 0, dtype: str | None = None):
    """Relative error of O and max abs error of lse for one version, dtype and shape."""
    cp = require_gpu()
    from ..gpu._launch import launch  # imports CuPy

    dt = host_dtype(dtype or ver.dtype)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*shape_q, d)).astype(np.float32).astype(dt)
    k = rng.standard_normal((*shape_k, d)).astype(np.float32).astype(dt)
    v = rng.standard_normal((*shape_k, d)).astype(np.float32).astype(dt)
    ref, ref_lse = naive_attention(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        causal=causal,
        return_lse=True,
    )
    O = cp.full((*shape_q, d), np.nan, dtype=np.float32).astype(dt)  # poisoned: NaN shows
    lse = cp.full(shape_q, np.nan, dtype=cp.float32)
    launch(
        ver,
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        O,
        lse,
        causal=causal,
        scale=1.0 / np.sqrt(d),
    )
    out = cp.asnumpy(O).astype(np.float64)
    got_lse = cp.asnumpy(lse).astype(np.float64)
    if np.isnan(out).any() or np.isnan(got_lse).any():
        return float("nan"), float("nan")
    rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    lse_err = float(np.max(np.abs(got_lse - ref_lse)))
    return rel, lse_err


def check_decode(versions=None) -> int:
    """Every decode version (or those in ``versions``) on small cases (ragged lengths with 0
    and 1, splits past the tiles, a shuffled block table with partly filled pages, causal and
    not); returns failures."""
    cp = require_gpu()
    from ..gpu.decode import SM90A_VERSIONS, decode_attention, paged_decode_attention

    cc = tuple(int(c) for c in divmod(int(cp.cuda.Device().compute_capability), 10))
    failed = 0
    for number in sorted(DECODE_VERSIONS):
        if versions and number not in versions:
            continue
        if number in SM90A_VERSIONS and cc != (9, 0):
            print(f"decode v{number}: skipped, needs compute capability 9.0 (sm_90a)")
            continue
        failed += _check_decode_version(cp, number, decode_attention, paged_decode_attention)
    return failed


def _check_decode_version(cp, version, decode_attention, paged_decode_attention) -> int:
    from ..gpu.decode import SM90A_VERSIONS

    failed = 0
    for dtype, d, S, causal in [
        ("float16", 64, 1, False),
        ("float16", 128, 3, "bottom_right"),
        ("bfloat16", 128, 7, False),
        ("bfloat16", 64, 2, "bottom_right"),
    ]:
        dt, rng = host_dtype(dtype), np.random.default_rng(d + S)
        B, Hq, Hkv, Nq, Nk = 3, 8, 2, 3 if causal else 16, 200
        q = rng.standard_normal((B, Hq, Nq, d)).astype(np.float32).astype(dt)
        k = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
        v = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
        L = np.array([0, 1, 199], dtype=np.int32)
        j, i = np.arange(Nk), np.arange(Nq)[:, None]
        mask = j < L[:, None, None, None]  # (B, 1, 1, Nk) -> with causal (B, 1, Nq, Nk)
        if causal:
            mask = mask & (j <= i + L[:, None, None, None] - Nq)
        ref = naive_attention(*(x.astype(np.float64) for x in (q, k, v)), mask=mask)
        # the paged pool: the same keys, pages in reverse order (version 5 takes 64-key pages)
        ps = 64 if version in SM90A_VERSIONS else 48
        n = -(-Nk // ps)
        pad = np.zeros((B, Hkv, n * ps - Nk, d), dt)
        kp, vp = (np.concatenate([x, pad], axis=2).reshape(B, Hkv, n, ps, d) for x in (k, v))
        kp, vp = (x.transpose(0, 2, 1, 3, 4).reshape(B * n, Hkv, ps, d)[::-1] for x in (kp, vp))
        table = (B * n - 1 - np.arange(B * n)).reshape(B, n).astype(np.int32)
        outs = {
            "contiguous": decode_attention(
                cp.asarray(q),
                cp.asarray(k),
                cp.asarray(v),
                lengths=L,
                causal=causal,
                num_splits=S,
                version=version,
            ),
            "paged": paged_decode_attention(
                cp.asarray(q),
                cp.asarray(np.ascontiguousarray(kp)),
                cp.asarray(np.ascontiguousarray(vp)),
                table,
                L,
                causal=causal,
                num_splits=S,
                version=version,
            ),
        }
        for what, O in outs.items():
            out = cp.asnumpy(O).astype(np.float64)
            rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            ok = not np.isnan(out).any() and rel <= LIMIT[dtype]
            failed += not ok
            flag = "" if ok else "  FAIL"
            print(
                f"decode v{version} {what:10s} {dtype:8s} d={d:3d} splits={S} "
                f"causal={causal!s:12s} Nq={Nq} lengths {L.tolist()}: "
                f"rel err {rel:.2e}{flag}"
            )
    return failed


def check_prefill() -> int:
    """``paged_prefill_attention`` on small ragged cases (sequences of 2 to 6 key tiles, pages
    in reverse order, grouped heads), one and three key splits (some of them empty),
    bottom-right causal and none, against the float64 reference; returns failures."""
    cp = require_gpu()

    cc = tuple(int(c) for c in divmod(int(cp.cuda.Device().compute_capability), 10))
    if cc != (9, 0):
        print("prefill: skipped, needs compute capability 9.0 (sm_90a)")
        return 0
    failed = 0
    for dtype, d in (("float16", 64), ("bfloat16", 128)):
        dt, rng = host_dtype(dtype), np.random.default_rng(d)
        B, Hq, Hkv, Nq, ps = 3, 4, 2, 150, 64
        L = np.array([Nq, Nq + 100, Nq + 600], dtype=np.int32)
        Nk = -(-int(L.max()) // ps) * ps  # whole pages; keys past a sequence's length masked
        q = rng.standard_normal((B, Hq, Nq, d)).astype(np.float32).astype(dt)
        k = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
        v = rng.standard_normal((B, Hkv, Nk, d)).astype(np.float32).astype(dt)
        n = -(-Nk // ps)
        kp, vp = (
            x.reshape(B, Hkv, n, ps, d).transpose(0, 2, 1, 3, 4).reshape(B * n, Hkv, ps, d)
            for x in (k, v)
        )
        kp, vp = (cp.asarray(np.ascontiguousarray(x[::-1])) for x in (kp, vp))
        table = (B * n - 1 - np.arange(B * n)).reshape(B, n).astype(np.int32)
        G = Hq // Hkv
        kk, vv = (np.repeat(x.astype(np.float64), G, axis=1) for x in (k, v))
        j, i = np.arange(Nk), np.arange(Nq)[:, None]
        for causal in ("bottom_right", False):
            mask = j < L[:, None, None, None]
            if causal:
                mask = mask & (j <= i + L[:, None, None, None] - Nq)
            ref = naive_attention(q.astype(np.float64), kk, vv, mask=mask)
            for S in (1, 3):
                O = paged_prefill_attention(
                    cp.asarray(q), kp, vp, table, L, causal=causal, splits=S
                )
                out = cp.asnumpy(O).astype(np.float64)
                rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                ok = not np.isnan(out).any() and rel <= LIMIT[dtype]
                failed += not ok
                print(
                    f"prefill {dtype:8s} d={d:3d} splits={S} causal={causal!s:12s} Nq={Nq} "
                    f"lengths {L.tolist()}: rel err {rel:.2e}{'' if ok else '  FAIL'}"
                )
    return failed


def check_backward(ver, d: int, causal: bool, shape_q, shape_k, dtype: str, seed: int = 0):
    """Relative errors of (dq, dk, dv) of one backward version against float64 (NaN if any
    element holds NaN), with O and lse from the float64 forward rounded as a kernel's are."""
    cp = require_gpu()

    dt = host_dtype(dtype)
    rng = np.random.default_rng(seed)
    q, k, v = (
        rng.standard_normal((*s, d)).astype(np.float32).astype(dt)
        for s in (shape_q, shape_k, shape_k)
    )
    do = rng.standard_normal((*shape_q, d)).astype(np.float32).astype(dt)
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    o, lse = naive_attention(*f64[:3], causal=causal, return_lse=True)
    o, lse = o.astype(dt), lse.astype(np.float32)
    ref = naive_attention_backward(
        *f64[:3], o.astype(np.float64), lse.astype(np.float64), f64[3], causal=causal
    )
    args = [cp.asarray(x) for x in (q, k, v, o, lse, do)]
    outs = [cp.full(x.shape, np.nan, dtype=np.float32).astype(dt) for x in (q, k, v)]  # poisoned
    launch_backward(ver, *args, *outs, causal=causal, scale=1.0 / np.sqrt(d))
    errs = []
    for x, r in zip(outs, ref, strict=True):
        x = cp.asnumpy(x).astype(np.float64)
        errs.append(
            float("nan") if np.isnan(x).any() else float(np.linalg.norm(x - r) / np.linalg.norm(r))
        )
    return errs


def main_backward(args, cp) -> int:
    shapes = (
        [((2, 70), (2, 100))]
        if args.small
        else [((2, 3, 70), (2, 3, 100)), ((1, 2, 257), (1, 2, 257))]
    )
    failed = 0
    cc = device_cc(cp)
    for ver in BWD_VERSIONS.values():
        if args.versions and ver.number not in args.versions:
            continue
        if not ver.runs_on(cc):
            print(
                f"bwd{ver.number}: skipped, needs compute capability "
                f"{ver.min_cc[0]}.{ver.min_cc[1]} ({ver.arch or 'or higher'})"
            )
            continue
        dims = [d for d in (64, 128) if d in ver.head_dims]
        for dtype, d, causal in ((t, d, c) for t in ver.dtypes for d in dims for c in (0, 1)):
            for shape_q, shape_k in shapes:
                errs = check_backward(ver, d, bool(causal), shape_q, shape_k, dtype)
                ok = all(e <= LIMIT[dtype] for e in errs)  # NaN fails
                failed += not ok
                print(
                    f"bwd{ver.number} {dtype:8s} d={d:3d} causal={bool(causal)!s:5s} "
                    f"q{shape_q} k{shape_k}: rel err dq {errs[0]:.2e} dk {errs[1]:.2e} "
                    f"dv {errs[2]:.2e}{'' if ok else '  FAIL'}"
                )
    cp.cuda.runtime.deviceSynchronize()
    print("selfcheck --backward:", "all passed" if not failed else f"{failed} case(s) FAILED")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m flashref.bench selfcheck")
    parser.add_argument("--small", action="store_true", help="one small ragged shape per case")
    parser.add_argument("--versions", type=int, nargs="+", help="only these versions")
    parser.add_argument("--decode", action="store_true", help="only the decode kernels")
    parser.add_argument("--backward", action="store_true", help="the backward versions")
    parser.add_argument("--prefill", action="store_true", help="only the chunked-prefill kernel")
    args = parser.parse_args(argv)
    cp = require_gpu()
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    if args.backward:
        return main_backward(args, cp)
    if args.decode or args.prefill:
        failed = check_decode(args.versions) if args.decode else check_prefill()
        cp.cuda.runtime.deviceSynchronize()
        print("selfcheck:", "all passed" if not failed else f"{failed} case(s) FAILED")
        return 1 if failed else 0
    shapes = (
        [((2, 70), (2, 100))]
        if args.small
        else [((2, 3, 70), (2, 3, 100)), ((1, 2, 257), (1, 2, 257))]
    )
    failed = 0
    cc = device_cc(cp)
    for ver in VERSIONS.values():
        if args.versions and ver.number not in args.versions:
            continue
        if not ver.runs_on(cc):
            print(
                f"v{ver.number}: skipped, needs compute capability "
                f"{ver.min_cc[0]}.{ver.min_cc[1]} ({ver.arch or 'or higher'})"
            )
            continue
        dims = [d for d in (64, 128) if d in ver.head_dims]  # those of 64 and 128 it offers
        for dtype, d, causal in ((t, d, c) for t in ver.dtypes for d in dims for c in (0, 1)):
            causal = bool(causal)
            for shape_q, shape_k in shapes:
                rel, lse_err = check(ver, d, causal, shape_q, shape_k, dtype=dtype)
                ok = rel <= LIMIT[dtype] and lse_err <= 10 * LIMIT[dtype]
                failed += not ok
                print(
                    f"v{ver.number} {dtype:8s} d={d:3d} causal={causal!s:5s} "
                    f"q{shape_q} k{shape_k}: rel err {rel:.2e}, lse err {lse_err:.2e}"
                    f"{'' if ok else '  FAIL'}"
                )
    cp.cuda.runtime.deviceSynchronize()
    print("selfcheck:", "all passed" if not failed else f"{failed} case(s) FAILED")
    return 1 if failed else 0
