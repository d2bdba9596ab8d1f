"""Runs one stage of ``flashref/kernels/probes/probe_wgmma.cu``; says what, if anything, is
wrong.

    python -m flashref.bench hopper_probe tma|pipeline|ss_hand|ss_tma|rs --dtype float16 --n 64

prints one JSON line: ``{"stage", "dtype", "n", "ok", "checks": [[name, ok, detail], ...]}``.
One stage per process, because an illegal wgmma poisons the CUDA context and a barrier bug
hangs (``tests/gpu/test_hopper_probe.py`` runs each with a timeout). Each stage runs twice: on small
integers, where every product and sum is exact, so the result must equal NumPy's bit for bit
and a wrong layout is recognised by which alternative layout it equals (``hypotheses``); then on
random normals, against float64 with the 2x-naive rule of ``flashref.gpu.tolerances``.
"""

from __future__ import annotations

import json

import numpy as np

from ..gpu.registry import DTYPE_DEFINES, KERNEL_DIR, paste_includes
from ..gpu.tma import tensor_map
from ..gpu.tolerances import tolerance
from ..hardware import hopper as hp
from .cli import ArgumentParser

STAGES = ("tma", "pipeline", "ss_hand", "ss_tma", "rs")
PIPELINE_TILES = 5  # odd: each buffer's barrier goes through both parities
PROBE = KERNEL_DIR / "probes" / "probe_wgmma.cu"
S_BOUND = 64 * 2.0**-23  # fp32 accumulation of 64 exact products, elementwise
SHOW = 5  # mismatching elements printed


PROG = "python -m flashref.bench hopper_probe"


def source() -> str:
    """probe_wgmma.cu with its headers pasted in (as the registries' versions do)."""
    return paste_includes(PROBE)


def np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.float16


def first_mismatches(got, want, show=SHOW) -> str:
    """'(r, c): expected e, got g' for the first ``show`` elements that differ (NaN differs)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bad = np.argwhere(~(got == want))
    items = [f"({r}, {c}): expected {want[r, c]:g}, got {got[r, c]:g}" for r, c in bad[:show]]
    return f"{len(bad)} of {want.size} differ; " + "; ".join(items)


def rel_err(got, want) -> float:
    """max |got - want| / max |want|; NaN if got holds a NaN (a NaN must fail)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    return float(np.nan if np.isnan(diff).any() else diff.max() / max(np.abs(want).max(), 1e-30))


# ------------------------------------------------------------ alternatives to recognise


def read_as(tile, swizzle: int) -> np.ndarray:
    """The tile wgmma sees if it reads the 128-byte-swizzled image of ``tile`` as ``swizzle``."""
    rows = tile.shape[0]
    return hp.unswizzle_tile(hp.swizzle_tile(tile, 128), rows, swizzle)


def product_hypotheses(Q, K) -> dict[str, np.ndarray]:
    """S = Q K^T as a wrong descriptor or k-step would make it (Q, K float64 integers)."""
    out = {}
    for sw in (0, 64, 32):
        as_ = f"as the {sw}-byte swizzle" if sw else "with no swizzle"
        out[f"Q and K read {as_}"] = read_as(Q, sw) @ read_as(K, sw).T
        out[f"K read {as_}"] = Q @ read_as(K, sw).T
    out["k-step stuck at the first 16 columns"] = 4 * Q[:, :16] @ K[:, :16].T
    return out


def map_hypotheses(raw, n: int) -> dict[str, np.ndarray]:
    """The raw registers (128, n / 2) placed by plausible wrong fragment maps."""
    src = hp.wgmma_c_map(n)  # (128, n / 2, 2)
    w = (np.arange(128) // 32)[:, None]  # (128, 1): each thread's warp
    alts = {}
    interleaved = src.copy()  # warp w holding rows w, w + 4, ... instead of 16 w .. 16 w + 15
    interleaved[..., 0] = 4 * (src[..., 0] % 16) + w
    alts["warp w holding rows w, w + 4, w + 8, ... (interleaved)"] = interleaved
    reversed_warps = src.copy()
    reversed_warps[..., 0] = 16 * (3 - w) + src[..., 0] % 16
    alts["warps in reverse order (warp 0 holding rows 48..63)"] = reversed_warps
    if n == 64:
        alts["the map transposed (row and column swapped)"] = src[..., ::-1]
    return {k: hp.place(raw, v, (64, n)) for k, v in alts.items()}


def boxes_read_as(V, swizzle: int) -> np.ndarray:
    """V (64, n) as TMA stores it in 64-column boxes, read back as ``swizzle``."""
    return np.hstack([read_as(V[:, b : b + 64], swizzle) for b in range(0, V.shape[1], 64)])


def p_hypotheses(P, V) -> dict[str, np.ndarray]:
    """O = P V as wrong A fragments or a wrong V descriptor would make it."""
    Pswap = P.reshape(64, 4, 2, 8)[:, :, ::-1].reshape(64, 64)  # a0/a1 <-> a2/a3: k halves
    return {
        "A fragments with the two 8-wide k halves of each slice swapped": Pswap @ V,
        "V read with no swizzle": P @ boxes_read_as(V, 0),
        "V read as the 64-byte swizzle": P @ boxes_read_as(V, 64),
        "V descriptor not advanced (the first 16 keys 4 times)": 4 * P[:, :16] @ V[:16],
    }


def matching(got, hypotheses) -> list[str]:
    """The names of the hypotheses that ``got`` equals exactly."""
    return [name for name, h in hypotheses.items() if np.array_equal(got, h)]


# ------------------------------------------------------------------------ the stages


def _module(dtype: str):
    import cupy as cp

    options = ("--std=c++17", "-arch=sm_90a", *DTYPE_DEFINES[dtype])
    return cp, cp.RawModule(code=source(), options=options)


def stage_tma(dtype: str, n: int) -> list:
    """(i) TMA of a (n, 64) box: the shared image must be the 128-byte swizzle of the box."""
    cp, module = _module(dtype)
    rows = 3 * n // 2  # the second box half outside the tensor: zero-filled
    codes = (np.arange(rows)[:, None] * 64 + np.arange(64)).astype(np.uint16)  # (rows, 64)
    x = cp.asarray(codes.view(np_dtype(dtype)))  # the bits are copied, not interpreted
    checks = []
    for row0 in (0, n):
        out = cp.full(n * 64, 0xFFFF, dtype=cp.uint16)  # poisoned
        flags = cp.zeros(2, dtype=cp.int32)
        fn = module.get_function("probe_tma")
        fn((1,), (128,), (tensor_map(x, n), out, np.int32(n), np.int32(row0), flags))
        cp.cuda.runtime.deviceSynchronize()
        got = cp.asnumpy(out)
        box = np.zeros((n, 64), np.uint16)
        box[: max(0, min(n, rows - row0))] = codes[row0 : row0 + n]
        ok = bool(np.array_equal(got, hp.swizzle_tile(box)))
        detail = f"box rows {row0}..{row0 + n - 1} of {rows}"
        if not ok:
            same = [
                f"{s}-byte" for s in (0, 32, 64) if np.array_equal(got, hp.swizzle_tile(box, s))
            ]
            where = np.flatnonzero(got != hp.swizzle_tile(box))[:SHOW]
            detail += (
                f"; image matches swizzle {same or 'none of 0/32/64-byte'}; first bad words "
                + ", ".join(
                    f"word {i} (row {i // 64}, chunk {i % 64 // 8}): expected element "
                    f"{divmod(int(hp.swizzle_tile(box)[i]), 64)}, got {divmod(int(got[i]), 64)}"
                    for i in where
                )
            )
        f = cp.asnumpy(flags)
        detail += f"; barrier wait returned: {f[1] == 1}; sm_90a feature macro defined: {f[0] == 1}"
        checks.append([f"TMA image, {detail.split(';')[0]}", ok, detail])
    return checks


def stage_pipeline(dtype: str) -> list:
    """(i') Tiles through two buffers and two re-armed mbarriers: each image is its tile's."""
    cp, module = _module(dtype)
    T = PIPELINE_TILES
    codes = (np.arange(64 * T)[:, None] * 64 + np.arange(64)).astype(np.uint16)  # (64 T, 64)
    x = cp.asarray(codes.view(np_dtype(dtype)))
    out = cp.full((T, 64 * 64), 0xFFFF, dtype=cp.uint16)  # poisoned
    flags = cp.zeros(2, dtype=cp.int32)
    module.get_function("probe_pipeline")(
        (1,), (128,), (tensor_map(x, 64), out, np.int32(T), flags)
    )
    cp.cuda.runtime.deviceSynchronize()
    got = cp.asnumpy(out)
    checks = []
    for t in range(T):
        want = hp.swizzle_tile(codes[64 * t : 64 * t + 64])
        ok = bool(np.array_equal(got[t], want))
        rows = sorted({int(v) // 64 for v in got[t][got[t] != want][:64]})
        detail = (
            "exact" if ok else f"holds rows {rows[:8]} of the tensor (tile {t} is rows {64 * t}..)"
        )
        checks.append([f"tile {t}: buffer {t % 2}, wait parity {(t // 2) % 2}", ok, detail])
    return checks


def _run_ss(dtype: str, n: int, tma: bool, Q, K):
    cp, module = _module(dtype)
    q = cp.asarray(Q.astype(np_dtype(dtype)))
    k = cp.asarray(K.astype(np_dtype(dtype)))
    raw = cp.full((128, n // 2), np.nan, dtype=cp.float32)
    S = cp.full((64, n), np.nan, dtype=cp.float32)
    if tma:
        flags = cp.zeros(2, dtype=cp.int32)
        args = (tensor_map(q, 64), tensor_map(k, n), raw, S, flags)
        module.get_function(f"probe_ss_tma_n{n}")((1,), (128,), args)
    else:
        module.get_function(f"probe_ss_hand_n{n}")((1,), (128,), (q, k, raw, S))
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(raw), cp.asnumpy(S)


def _check_product(name, raw, placed, want, n, hyps) -> list:
    from_map = hp.place(raw, hp.wgmma_c_map(n), (64, n))
    same = bool(np.array_equal(placed, from_map, equal_nan=True))
    checks = [
        [f"{name}: kernel's own placement = model map", same, first_mismatches(placed, from_map)]
    ]
    ok = bool(np.array_equal(from_map, want))
    detail = "exact" if ok else first_mismatches(from_map, want)
    if not ok:
        found = matching(from_map, hyps)
        found += [k for k, v in map_hypotheses(raw, n).items() if np.array_equal(v, want)]
        detail += f"; matches: {found or 'none of the hypotheses'}"
    checks.append([f"{name}: integer inputs, exact", ok, detail])
    return checks


def stage_ss(dtype: str, n: int, tma: bool) -> list:
    """(ii) / (iii) S = Q K^T with both operands from swizzled shared memory."""
    rng = np.random.default_rng(n)
    Q, K = (
        rng.integers(-2, 3, (64, 64)).astype(np.float64),
        rng.integers(-2, 3, (n, 64)).astype(np.float64),
    )
    raw, S = _run_ss(dtype, n, tma, Q, K)
    checks = _check_product("S", raw, S, Q @ K.T, n, product_hypotheses(Q, K))
    Q = rng.standard_normal((64, 64)).astype(np_dtype(dtype)).astype(np.float64)
    K = rng.standard_normal((n, 64)).astype(np_dtype(dtype)).astype(np.float64)
    raw, S = _run_ss(dtype, n, tma, Q, K)
    got = hp.place(raw, hp.wgmma_c_map(n), (64, n))
    # fp16/bf16 products are exact in fp32; each of the 64 additions may lose at most one fp32
    # unit (2^-23, whatever the order or rounding mode) of a partial sum <= (|Q| |K|^T)[r, c]
    err = np.abs(got - Q @ K.T) / (np.abs(Q) @ np.abs(K).T)  # (64, n)
    worst = float(np.nan if np.isnan(err).any() else err.max())
    checks.append(
        [
            "S: normal inputs vs float64",
            bool(worst <= S_BOUND),
            f"max |S - S64| / (|Q| |K|^T) = {worst:.3g}, bound 64 * 2^-23 = {S_BOUND:.3g}",
        ]
    )
    return checks


def _run_rs(dtype: str, n: int, Q, K, V, lbo: int, sbo: int):
    cp, module = _module(dtype)
    q, k, v = (cp.asarray(a.astype(np_dtype(dtype))) for a in (Q, K, V))
    raw = cp.full((128, n // 2), np.nan, dtype=cp.float32)
    O = cp.full((64, n), np.nan, dtype=cp.float32)
    flags = cp.zeros(2, dtype=cp.int32)
    args = (
        tensor_map(q, 64),
        tensor_map(k, 64),
        tensor_map(v, 64),
        raw,
        O,
        np.uint32(lbo),
        np.uint32(sbo),
        flags,
    )
    module.get_function(f"probe_rs_n{n}")((1,), (128,), args)
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(raw), cp.asnumpy(O)


def stage_rs(dtype: str, n: int, lbo: int, sbo: int) -> list:
    """(iv) O = P V: P (64 x 64) from S's accumulators as A registers, V (64 x n) MN-major."""
    rng = np.random.default_rng(100 + n)
    Q, K = (rng.integers(-2, 3, (64, 64)).astype(np.float64) for _ in range(2))
    V = rng.integers(-2, 3, (64, n)).astype(np.float64)
    raw, O = _run_rs(dtype, n, Q, K, V, lbo, sbo)
    P = Q @ K.T  # |P| <= 256: exact in fp16 and bf16
    checks = _check_product(f"O (lbo {lbo}, sbo {sbo})", raw, O, P @ V, n, p_hypotheses(P, V))
    Q, K = (
        rng.standard_normal((64, 64)).astype(np_dtype(dtype)).astype(np.float64) for _ in range(2)
    )
    V = rng.standard_normal((64, n)).astype(np_dtype(dtype)).astype(np.float64)
    raw, O = _run_rs(dtype, n, Q, K, V, lbo, sbo)
    got = hp.place(raw, hp.wgmma_c_map(n), (64, n))
    P = (Q @ K.T).astype(np_dtype(dtype)).astype(np.float64)  # rounded once, as the kernel does
    want = P @ V
    P32 = (Q.astype(np.float32) @ K.astype(np.float32).T).astype(np_dtype(dtype)).astype(np.float32)
    naive = rel_err(P32 @ V.astype(np.float32), want)
    err, tol = rel_err(got, want), tolerance(dtype, naive)
    checks.append(
        [
            "O: normal inputs vs float64",
            bool(err <= tol),
            f"error {err:.3g}, tolerance {tol:.3g} (2 x naive {naive:.3g} + floor)",
        ]
    )
    return checks


def run(stage: str, dtype: str, n: int, lbo: int | None = None, sbo: int = 1024) -> dict:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype must be float16 or bfloat16, got {dtype!r}")
    if n not in (64, 128):
        raise ValueError(f"n must be 64 or 128, got {n!r}")
    if stage == "tma":
        checks = stage_tma(dtype, n)
    elif stage == "pipeline":
        checks = stage_pipeline(dtype)
    elif stage in ("ss_hand", "ss_tma"):
        checks = stage_ss(dtype, n, stage == "ss_tma")
    else:
        checks = stage_rs(dtype, n, 64 * 64 * 2 if lbo is None else lbo, sbo)
    return {
        "stage": stage,
        "dtype": dtype,
        "n": n,
        "ok": all(c[1] for c in checks),
        "checks": checks,
    }


def main(argv=None) -> None:
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--n", type=int, default=64, choices=(64, 128))
    ap.add_argument("--lbo", type=int, default=None, help="V descriptor LBO in bytes (rs)")
    ap.add_argument("--sbo", type=int, default=1024, help="V descriptor SBO in bytes (rs)")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.stage, args.dtype, args.n, args.lbo, args.sbo)), flush=True)
