"""GPU benchmark: every flashref.gpu version beside naive CuPy and torch SDPA backends.

    python -m flashref.bench gpu [--quick] [--d 64 128] [--n 1024 4096] [--out PATH]

Shapes (B, H, N, d) with H = 16 and B = max(1, 2*16384 // N), so every N does
about the same number of query rows; forward pass only. The fp16 kernels and
SDPA run on float16 inputs, versions 1-2 and naive fp32 on float32 inputs.
TFLOP/s = 4 B H N^2 d / time, halved for causal (the masked half is not work).
Each time is the median of CUDA-event timings of single calls after warm-up,
all in one process, and each row carries its ratio to SDPA's FLASH backend
(FlashAttention-2) measured in the same run. The first call of each version is
timed separately (wall clock, including NVRTC compilation and module load, with
CuPy's on-disk kernel cache pointed at an empty folder) next to its warm median.
Writes JSON (schema in ``write_json``) to ``results/gpu_bench.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HEADS = 16
ALL_N = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_N = (1024, 4096)
REPEATS = 10
SLOW_REPEATS = 3  # version 1 (scalar) takes up to seconds per call at large N
SDPA_BACKENDS = {
    "sdpa_flash": ("FLASH_ATTENTION", "SDPA FLASH (FlashAttention-2)"),
    "sdpa_cudnn": ("CUDNN_ATTENTION", "SDPA cuDNN"),
    "sdpa_efficient": ("EFFICIENT_ATTENTION", "SDPA EFFICIENT (xFormers)"),
    "sdpa_math": ("MATH", "SDPA MATH (unfused)"),
}


def batch(N: int) -> int:
    return max(1, 2 * 16384 // N)


def flops(B: int, N: int, d: int, causal: bool) -> float:
    f = 4.0 * B * HEADS * N * N * d
    return f / 2 if causal else f


def _median_ms(run, make_event, repeats: int, warmup: int) -> float:
    """Median over ``repeats`` of one call, timed by device events around it."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start, end = make_event(), make_event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append((start, end))
    return statistics.median(_elapsed(s, e) for s, e in times)


def _elapsed(start, end) -> float:
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return start.elapsed_time(end)
    import cupy as cp

    return cp.cuda.get_elapsed_time(start, end)


def naive_cupy(cp, q, k, v, causal: bool, bias=None):
    """matmul, softmax, matmul in the inputs' dtype: the (..., N, N) score matrix in HBM."""
    d = q.shape[-1]
    S = q @ cp.swapaxes(k, -1, -2)  # (B, H, N, N)
    S *= S.dtype.type(1.0 / math.sqrt(d))
    if causal:
        S += bias  # (N, N): 0 on and below the diagonal, -inf above
    S -= S.max(axis=-1, keepdims=True)
    cp.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    return S @ v  # (B, H, N, d)


def peak_copy_tbps(cp) -> float:
    """Device-to-device copy bandwidth, bytes read + written, median of 10 2-GiB copies."""
    n = 2 * 1024**3
    a = cp.ones(n, dtype=cp.uint8)
    b = cp.empty_like(a)
    kind = cp.cuda.runtime.memcpyDeviceToDevice

    def run():
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, kind, 0)

    ms = _median_ms(run, cp.cuda.Event, REPEATS, 2)
    return 2 * n / (ms * 1e-3) / 1e12


def _meta(cp, torch, copy_tbps, repeats_note):
    props = cp.cuda.runtime.getDeviceProperties(0)
    drv = cp.cuda.runtime.driverGetVersion()
    rt = cp.cuda.runtime.runtimeGetVersion()
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py)

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        driver = f"CUDA driver API {drv // 1000}.{drv % 1000 // 10}"
    return {
        "gpu": props["name"].decode(),
        "driver": driver,
        "cuda_runtime": f"{rt // 1000}.{rt % 1000 // 10}",
        "cupy": cp.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": datetime.date.today().isoformat(),
        "heads": HEADS,
        "batch_rule": "B = max(1, 2*16384 // N)",
        "timing": f"median of {REPEATS} CUDA-event timings after warm-up ({repeats_note})",
        "sm_count": int(props["multiProcessorCount"]),
        "peak_copy_tbps": round(copy_tbps, 3) if copy_tbps else None,
    }


def _import_torch():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:
        return None, None, None
    if not torch.cuda.is_available():
        return None, None, None
    return torch, SDPBackend, sdpa_kernel


def bench_config(ctx, d, N, causal, inputs) -> list[dict]:
    """All implementations at one (d, N, causal); returns the rows, ratios filled in."""
    cp, torch, SDPBackend, sdpa_kernel = (
        ctx["cp"],
        ctx["torch"],
        ctx["SDPBackend"],
        ctx["sdpa_kernel"],
    )
    from flashref.gpu import VERSIONS
    from flashref.gpu._launch import get_function, launch

    B = batch(N)
    (q32, k32, v32), (q16, k16, v16) = inputs["float32"], inputs["float16"]
    config = {"d": d, "causal": causal, "N": N, "B": B, "H": HEADS}
    found = []  # (row, output or None)

    def add(impl, label, family, version, dtype, ms, skipped=None, out=None):
        tf = flops(B, N, d, causal) / (ms * 1e-3) / 1e12 if ms else None
        row = {"impl": impl, "label": label, "family": family, "version": version,
               "dtype": dtype, **config, "ms": ms, "tflops": tf, "ratio_to_flash": None,
               "skipped": skipped}  # fmt: skip
        found.append((row, out))

    # torch SDPA backends (fp16)
    for impl, (backend, label) in SDPA_BACKENDS.items():
        if torch is None:
            add(impl, label, "baseline", None, "float16", None, "torch not importable")
            continue
        if impl == "sdpa_math" and N > 4096:
            add(impl, label, "baseline", None, "float16", None,
                "MATH materialises B*H*N*N scores: not run beyond N = 4096")  # fmt: skip
            continue
        tq, tk, tv = (torch.from_dlpack(x) for x in (q16, k16, v16))

        def sdpa(tq=tq, tk=tk, tv=tv):
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                out = cp.from_dlpack(sdpa())
                ms = _median_ms(sdpa, lambda: torch.cuda.Event(enable_timing=True), REPEATS, 2)
            add(impl, label, "baseline", None, "float16", ms, out=out)
        except Exception as exc:  # a backend may refuse a shape or dtype
            msg = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            add(impl, label, "baseline", None, "float16", None, msg)

    # naive CuPy, fp32 and fp16
    for dtype, (q, k, v) in (("float32", (q32, k32, v32)), ("float16", (q16, k16, v16))):
        impl = f"naive_cupy_{'fp32' if dtype == 'float32' else 'fp16'}"
        label = f"naive CuPy {dtype} (matmul, softmax, matmul)"
        if N >= 16384:
            gb = B * HEADS * N * N * np.dtype(dtype).itemsize / 1e9
            add(impl, label, "baseline", None, dtype, None,
                f"the score matrix alone would take {gb:.0f} GB")  # fmt: skip
            continue
        bias = None
        if causal:
            i = cp.arange(N)
            bias = cp.where(i[None, :] <= i[:, None], 0, -cp.inf).astype(dtype)  # (N, N)

        def naive(q=q, k=k, v=v, bias=bias):
            return naive_cupy(cp, q, k, v, causal, bias)

        out = naive()
        ms = _median_ms(naive, cp.cuda.Event, REPEATS, 1)
        add(impl, label, "baseline", None, dtype, ms, out=out)
        del bias, out
        cp.get_default_memory_pool().free_all_blocks()

    # flashref versions
    for ver in VERSIONS.values():
        if d not in ver.head_dims:
            continue
        q, k, v = inputs[ver.dtype]
        O = cp.empty(q.shape, dtype=q.dtype)
        lse = cp.empty(q.shape[:-1], dtype=cp.float32)

        def flash(ver=ver, q=q, k=k, v=v, O=O, lse=lse):
            launch(ver, q, k, v, O, lse, causal=causal, scale=1 / math.sqrt(d))

        first_ms = None
        if (ver.number, d) not in ctx["compiled"]:
            cp.cuda.runtime.deviceSynchronize()
            t = time.perf_counter()
            get_function(ver, d)  # NVRTC compile + module load
            flash()
            cp.cuda.runtime.deviceSynchronize()
            first_ms = (time.perf_counter() - t) * 1e3
            ctx["compiled"].add((ver.number, d))
        slow = ver.number == 1
        reps, warm = (SLOW_REPEATS, 1) if slow else (REPEATS, 2)
        ms = _median_ms(flash, cp.cuda.Event, reps, warm)
        add(f"v{ver.number}", f"v{ver.number} {ver.name}: {ver.summary}", "flashref",
            ver.number, ver.dtype, ms, out=O)  # fmt: skip
        if first_ms is not None:
            ctx["cold"].append({"impl": f"v{ver.number}", "d": d, "N": N,
                                "first_call_ms": first_ms, "warm_median_ms": ms})  # fmt: skip

    flash_row, ref = next(((r, o) for r, o in found if r["impl"] == "sdpa_flash"), (None, None))
    for r, out in found:
        if flash_row and flash_row["tflops"] and r["tflops"]:
            r["ratio_to_flash"] = r["tflops"] / flash_row["tflops"]
        if ref is not None and out is not None and r["impl"] != "sdpa_flash":
            ref32 = ref.astype(cp.float32)
            rel = float(cp.linalg.norm(out.astype(cp.float32) - ref32) / cp.linalg.norm(ref32))
            if not rel <= 1e-2:  # a sanity check only; tests/ holds the real checks
                print(f"  WARNING {r['impl']}: relative difference to SDPA FLASH {rel:.2e}",
                      file=sys.stderr)  # fmt: skip
    return [r for r, _ in found]


def run(args) -> dict:
    from flashref.gpu import _require_gpu

    cp = _require_gpu()
    # An empty kernel cache (CuPy reads the variable when it compiles), so that the first
    # call of each version really runs NVRTC.
    os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="flashref-cupy-cache-")
    torch, SDPBackend, sdpa_kernel = _import_torch()
    copy_tbps = peak_copy_tbps(cp)
    cp.get_default_memory_pool().free_all_blocks()
    meta = _meta(cp, torch, copy_tbps, f"version 1: {SLOW_REPEATS}")
    print(f"{meta['gpu']}, driver {meta['driver']}, CUDA runtime {meta['cuda_runtime']}, "
          f"CuPy {meta['cupy']}, torch {meta['torch']}; copy {copy_tbps:.2f} TB/s",
          file=sys.stderr)  # fmt: skip
    ctx = {"cp": cp, "torch": torch, "SDPBackend": SDPBackend, "sdpa_kernel": sdpa_kernel,
           "compiled": set(), "cold": []}  # fmt: skip
    rows = []
    Ns = [n for n in (QUICK_N if args.quick else ALL_N) if not args.n or n in args.n]
    rng = cp.random.default_rng(0)
    for d in args.d or [64, 128]:
        for N in Ns:
            shape = (batch(N), HEADS, N, d)
            x32 = tuple(rng.standard_normal(shape, dtype=cp.float32) for _ in range(3))
            inputs = {"float32": x32, "float16": tuple(x.astype(cp.float16) for x in x32)}
            for causal in (False, True):
                t0 = time.perf_counter()
                new = bench_config(ctx, d, N, causal, inputs)
                rows += new
                cp.get_default_memory_pool().free_all_blocks()
                done = ", ".join(f"{r['impl']} {r['tflops']:.0f}" for r in new if r["tflops"])
                took = time.perf_counter() - t0
                print(f"[d={d} N={N} B={batch(N)} causal={causal}] {took:.1f} s; TFLOP/s: {done}",
                      file=sys.stderr)  # fmt: skip
            del inputs, x32
            cp.get_default_memory_pool().free_all_blocks()
    return {"meta": meta, "rows": rows, "cold": ctx["cold"]}


def print_table(result: dict) -> None:
    rows = result["rows"]
    print(f"# {result['meta']['gpu']}  ({result['meta']['timing']})")
    print("# TFLOP/s (ratio to SDPA FLASH of the same run); fp16 unless the impl says fp32")
    for d in sorted({r["d"] for r in rows}):
        for causal in (False, True):
            sel = [r for r in rows if r["d"] == d and r["causal"] == causal]
            Ns = sorted({r["N"] for r in sel})
            print(f"\nd={d} causal={causal}")
            print(f"{'impl':18s}" + "".join(f"{'N=' + str(n):>16s}" for n in Ns))
            for impl in dict.fromkeys(r["impl"] for r in sel):
                cells = []
                for n in Ns:
                    r = next((x for x in sel if x["impl"] == impl and x["N"] == n), None)
                    if r is None or r["tflops"] is None:
                        cells.append("skipped" if r is not None and r["skipped"] else "-")
                    elif r["ratio_to_flash"] is None:
                        cells.append(f"{r['tflops']:.1f}")
                    else:
                        cells.append(f"{r['tflops']:.1f} ({r['ratio_to_flash']:.2f})")
                print(f"{impl:18s}" + "".join(f"{c:>16s}" for c in cells))
    if result["cold"]:
        print("\nfirst call (NVRTC compile + load + run) vs warm median, ms")
        for c in result["cold"]:
            print(f"  {c['impl']:4s} d={c['d']:3d} N={c['N']:5d}: first {c['first_call_ms']:8.1f}"
                  f"   warm {c['warm_median_ms']:8.3f}")  # fmt: skip


def write_json(result: dict, path: Path) -> None:
    """{"meta": {...}, "rows": [{impl, label, family, version, dtype, d, causal, N, B, H, ms,
    tflops, ratio_to_flash, skipped}], "cold": [{impl, d, N, first_call_ms, warm_median_ms}]}"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashref.bench gpu", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"only N in {QUICK_N}")
    parser.add_argument("--d", type=int, nargs="+", choices=(64, 128), help="head dims")
    parser.add_argument("--n", type=int, nargs="+", choices=ALL_N, help="sequence lengths")
    parser.add_argument("--out", type=Path, default=Path("results/gpu_bench.json"))
    args = parser.parse_args(argv)
    result = run(args)
    print_table(result)
    write_json(result, args.out)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
