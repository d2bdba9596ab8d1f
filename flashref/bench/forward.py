"""GPU benchmark: every flashref.gpu version beside naive CuPy and torch SDPA backends.

    python -m flashref.bench gpu [--quick] [--d 64 128] [--n 1024 4096] [--rounds 5]
                                 [--dtypes float16 bfloat16] [--versions 14 17 19]
                                 [--no-cold] [--out PATH]

Shapes (B, H, N, d) with H = 16 and B = max(1, 2*16384 // N), so every N does about the same
number of query rows; forward pass only. fp16 and bf16 runs feed the tensor-core versions and
SDPA; versions 1-2 and naive fp32 take float32. TFLOP/s = 4 B H N^2 d / time, halved for
causal (the masked half is not work).

Timing: CUDA events around single calls after warm-up. The fast implementations (versions 3
and later, SDPA FLASH and cuDNN) are timed in ``--rounds`` interleaved rounds (every
implementation once per round, each time the median of 10 calls), so that a drift of the
clock or of the machine hits all of them alike; a row records the median over rounds and the
spread (largest minus smallest round, over the median): a difference between two versions
smaller than their spreads is noise. The slow ones (versions 1-2, naive CuPy, SDPA MATH and
EFFICIENT) are timed in one round. Each row carries its ratio to SDPA FLASH
(FlashAttention-2) of the same dtype, measured in the same run.

The same process first measures the GPU's ceilings (``flashref.bench.roofs``: the mma.sync and
wgmma peaks, L2 and HBM bandwidth, device facts) and samples the SM clock (NVML) while the
kernels run. The cold first call is measured in fresh subprocesses whose ``CUPY_CACHE_DIR``
names an empty folder before CuPy is imported (compile + load + run), and again in a second
process that finds the compiled modules in that folder (load + run).
Writes JSON (schema in ``write_json``) to ``results/gpu_bench.json`` or ``--out``.
The backward's benchmark is ``python -m flashref.bench backward``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flashref.gpu._runtime import require_gpu

from ._common import (
    HEADS,
    REPEATS,
    ClockSampler,
    batch,
    flops,
    import_torch,
    median_ms,
    write_result,
)
from .cli import ArgumentParser, at_least
from .provenance import provenance
from .roofs import measure as measure_roofs

ALL_N = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_N = (1024, 2048, 4096, 8192, 16384)
QUICK_N = (1024, 4096)
SLOW_REPEATS = 3  # version 1 (scalar) takes up to seconds per call at large N
SDPA_BACKENDS = {
    "sdpa_flash": ("FLASH_ATTENTION", "SDPA FLASH (FlashAttention-2)"),
    "sdpa_cudnn": ("CUDNN_ATTENTION", "SDPA cuDNN"),
    "sdpa_efficient": ("EFFICIENT_ATTENTION", "SDPA EFFICIENT (xFormers)"),
    "sdpa_math": ("MATH", "SDPA MATH (unfused)"),
}
SLOW = {"v1", "v2", "naive_cupy_fp32", "naive_cupy_fp16", "sdpa_math", "sdpa_efficient"}


PROG = "python -m flashref.bench gpu"


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


def run_meta(cp, torch, ceilings):
    return provenance(cp, torch, forward="all") | {
        "heads": HEADS,
        "batch_rule": "B = max(1, 2*16384 // N)",
        "timing": (
            f"CUDA events; each round the median of {REPEATS} calls after warm-up "
            f"(version 1: {SLOW_REPEATS}); fast implementations over interleaved rounds; "
            "flashref's versions through their internal launch with the outputs made "
            "beforehand, a study of the kernels (the public call against SDPA's: "
            "python -m flashref.bench calls)"
        ),
        "sm_count": ceilings["device"]["sm_count"],
        "peak_copy_tbps": ceilings["roofs"]["hbm_copy_tbps"],
        "ceilings": ceilings,
    }


def _impls(ctx, d, N, causal, dtype, inputs):
    """[(impl, label, family, version, dtype, run, out_or_None, skipped)] for one config."""
    cp, torch = ctx["cp"], ctx["torch"]
    SDPBackend, sdpa_kernel = ctx["SDPBackend"], ctx["sdpa_kernel"]
    from flashref.gpu import VERSIONS
    from flashref.gpu._launch import get_function, launch

    B = batch(N)
    out = []
    x16 = inputs[dtype]
    for impl, (backend, label) in SDPA_BACKENDS.items():
        if dtype != "float16" and impl in ("sdpa_efficient", "sdpa_math"):
            continue
        if torch is None:
            out.append((impl, label, "baseline", None, dtype, None, None, "torch not importable"))
            continue
        if impl == "sdpa_math" and N > 4096:
            out.append(
                (
                    impl,
                    label,
                    "baseline",
                    None,
                    dtype,
                    None,
                    None,
                    "MATH materialises B*H*N*N scores: not run beyond N = 4096",
                )
            )
            continue
        tq, tk, tv = (torch.from_dlpack(x) for x in x16)
        be = getattr(SDPBackend, backend)

        def sdpa(tq=tq, tk=tk, tv=tv, be=be):
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(
                    tq, tk, tv, is_causal=causal
                )

        try:
            res = cp.from_dlpack(sdpa())
            out.append((impl, label, "baseline", None, dtype, sdpa, res, None))
        except Exception as exc:  # a backend may refuse a shape or dtype
            msg = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            out.append((impl, label, "baseline", None, dtype, None, None, msg))
    naive_dtypes = ("float32", "float16") if dtype == "float16" else ()
    for ndt in naive_dtypes:
        impl = f"naive_cupy_{'fp32' if ndt == 'float32' else 'fp16'}"
        label = f"naive CuPy {ndt} (matmul, softmax, matmul)"
        if N >= 16384:
            gb = B * HEADS * N * N * np.dtype(ndt).itemsize / 1e9
            out.append(
                (
                    impl,
                    label,
                    "baseline",
                    None,
                    ndt,
                    None,
                    None,
                    f"the score matrix alone would take {gb:.0f} GB",
                )
            )
            continue
        bias = None
        if causal:
            i = cp.arange(N)
            bias = cp.where(i[None, :] <= i[:, None], 0, -cp.inf).astype(ndt)  # (N, N)
        q, k, v = inputs[ndt]

        def naive(q=q, k=k, v=v, bias=bias):
            return naive_cupy(cp, q, k, v, causal, bias)

        out.append((impl, label, "baseline", None, ndt, naive, None, None))
    for ver in VERSIONS.values():
        vdt = dtype if dtype in ver.dtypes else ("float32" if dtype == "float16" else None)
        if d not in ver.head_dims or vdt is None or vdt not in ver.dtypes:
            continue
        if ctx.get("versions") and ver.number not in ctx["versions"]:
            continue
        if not ver.runs_on(ctx["cc"]):
            label = f"v{ver.number} {ver.name}: {ver.summary}"
            cc = f"{ver.min_cc[0]}.{ver.min_cc[1]}"
            why = f"needs compute capability {cc} ({ver.arch or 'or higher'})"
            out.append((f"v{ver.number}", label, "flashref", ver.number, vdt, None, None, why))
            continue
        q, k, v = inputs[vdt]
        O = cp.empty(q.shape, dtype=q.dtype)
        lse = cp.empty(q.shape[:-1], dtype=cp.float32)
        get_function(ver, d, vdt)

        def flash(ver=ver, q=q, k=k, v=v, O=O, lse=lse):
            launch(ver, q, k, v, O, lse, causal=causal, scale=1 / math.sqrt(d))

        flash()
        label = f"v{ver.number} {ver.name}: {ver.summary}"
        out.append((f"v{ver.number}", label, "flashref", ver.number, vdt, flash, O, None))
    return out


def bench_config(ctx, d, N, causal, dtype, inputs, rounds: int) -> list[dict]:
    """All implementations at one (d, N, causal, dtype); returns the rows, ratios filled in."""
    cp, torch = ctx["cp"], ctx["torch"]
    B = batch(N)
    impls = _impls(ctx, d, N, causal, dtype, inputs)
    times: dict[str, list[float]] = {i[0]: [] for i in impls}
    torch_event = (lambda: torch.cuda.Event(enable_timing=True)) if torch is not None else None
    for rnd in range(rounds):
        for impl, *_, run, _, _ in impls:
            if run is None or (impl in SLOW and rnd > 0):
                continue
            make_event = torch_event if impl.startswith("sdpa") else cp.cuda.Event
            reps, warm = (SLOW_REPEATS, 1) if impl == "v1" else (REPEATS, 2)
            times[impl].append(median_ms(run, make_event, reps, warm))
    rows, outputs = [], {}
    for impl, label, family, version, vdt, _, res, skipped in impls:
        ts = times[impl]
        ms = statistics.median(ts) if ts else None
        spread = (max(ts) - min(ts)) / ms if len(ts) > 1 else None
        tf = flops(B, N, d, causal) / (ms * 1e-3) / 1e12 if ms else None
        rows.append(
            {
                "impl": impl,
                "label": label,
                "family": family,
                "version": version,
                "dtype": vdt,
                "run_dtype": dtype,
                "d": d,
                "causal": causal,
                "N": N,
                "B": B,
                "H": HEADS,
                "ms": ms,
                "round_ms": ts,
                "spread": spread,
                "tflops": tf,
                "ratio_to_flash": None,
                "skipped": skipped,
            }
        )
        outputs[impl] = res
    flash_row = next((r for r in rows if r["impl"] == "sdpa_flash"), None)
    ref = outputs.get("sdpa_flash")
    for r in rows:
        if flash_row and flash_row["tflops"] and r["tflops"]:
            r["ratio_to_flash"] = r["tflops"] / flash_row["tflops"]
        out = outputs.get(r["impl"])
        if ref is not None and out is not None and r["impl"] != "sdpa_flash":
            ref32 = ref.astype(cp.float32)
            rel = float(cp.linalg.norm(out.astype(cp.float32) - ref32) / cp.linalg.norm(ref32))
            r["rel_diff_to_flash"] = rel
            if not rel <= 2e-2:  # a sanity check only; tests/ holds the real checks
                print(
                    f"  WARNING {r['impl']}: relative difference to SDPA FLASH {rel:.2e}",
                    file=sys.stderr,
                )
    return rows


COLD_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import cupy as cp
import numpy as np
from flashref.gpu import VERSIONS
from flashref.gpu._launch import get_function, launch
cp.cuda.runtime.deviceSynchronize()
rng = np.random.default_rng(0)
out = {}
for n in json.loads(sys.argv[1]):
    ver = VERSIONS[n]
    q = cp.asarray(rng.standard_normal((8, 16, 4096, 64)).astype(ver.dtype))
    O = cp.empty_like(q)
    lse = cp.empty(q.shape[:-1], dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    launch(ver, q, q, q, O, lse, causal=False, scale=0.125)
    cp.cuda.runtime.deviceSynchronize()
    out[n] = (time.perf_counter() - t) * 1e3
print(json.dumps(out))
"""


def cold_calls(numbers) -> dict:
    """First call of each version (d = 64, N = 4096), in fresh processes: compile, then load."""
    with tempfile.TemporaryDirectory(prefix="flashref-cupy-cache-") as cache:
        env = {**os.environ, "CUPY_CACHE_DIR": cache}  # set before CuPy is imported
        runs = {}
        for what in ("compile_load_run_ms", "load_run_ms"):  # the 2nd finds the cache filled
            proc = subprocess.run(
                [sys.executable, "-c", COLD_PROBE, json.dumps(list(numbers))],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[what] = {int(k): v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}
    return [
        {"impl": f"v{n}", "d": 64, "N": 4096, "B": 8, **{what: runs[what][n] for what in runs}}
        for n in numbers
    ]


def run(args) -> dict:
    from flashref.gpu import VERSIONS

    cp = require_gpu()
    if "bfloat16" in args.dtypes:
        import ml_dtypes  # noqa: F401  (registers the name "bfloat16" with NumPy, as CuPy needs)
    torch, SDPBackend, sdpa_kernel = import_torch()
    ceilings = measure_roofs(cp)
    cp.get_default_memory_pool().free_all_blocks()
    meta = run_meta(cp, torch, ceilings)
    r = ceilings["roofs"]
    print(
        f"{meta['gpu']}, driver {meta['driver']}, CUDA runtime {meta['cuda_runtime']}, "
        f"CuPy {meta['cupy']}, torch {meta['torch']}; mma.sync {r['mma_sync_tflops']:.0f} "
        f"TFLOP/s, copy {r['hbm_copy_tbps']:.2f} TB/s",
        file=sys.stderr,
    )
    cc = tuple(int(c) for c in divmod(int(cp.cuda.Device().compute_capability), 10))
    ctx = {
        "cp": cp,
        "torch": torch,
        "SDPBackend": SDPBackend,
        "sdpa_kernel": sdpa_kernel,
        "versions": args.versions,
        "cc": cc,
    }
    rows = []
    Ns = args.n or (QUICK_N if args.quick else DEFAULT_N)
    rng = cp.random.default_rng(0)
    with ClockSampler() as clock:
        for d in args.d or [64, 128]:
            for N in Ns:
                shape = (batch(N), HEADS, N, d)
                x32 = tuple(rng.standard_normal(shape, dtype=cp.float32) for _ in range(3))
                inputs = {
                    "float32": x32,
                    **{dt: tuple(x.astype(dt) for x in x32) for dt in args.dtypes},
                }
                for dtype in args.dtypes:
                    for causal in (False, True):
                        t0 = time.perf_counter()
                        new = bench_config(ctx, d, N, causal, dtype, inputs, args.rounds)
                        rows += new
                        cp.get_default_memory_pool().free_all_blocks()
                        if args.out:  # what is measured so far survives an interruption
                            partial = {"meta": {**meta, "partial": True}, "rows": rows, "cold": []}
                            write_json(partial, args.out)
                        done = ", ".join(
                            f"{r['impl']} {r['tflops']:.0f}" for r in new if r["tflops"]
                        )
                        print(
                            f"[{dtype} d={d} N={N} B={batch(N)} causal={causal}] "
                            f"{time.perf_counter() - t0:.1f} s; TFLOP/s: {done}",
                            file=sys.stderr,
                        )
                del inputs, x32
                cp.get_default_memory_pool().free_all_blocks()
    meta["sm_clock_during_benchmark"] = clock.summary()
    numbers = [n for n, v in VERSIONS.items() if v.runs_on(cc)]
    numbers = [n for n in numbers if not args.versions or n in args.versions]
    cold = [] if args.no_cold else cold_calls(numbers)
    return {"meta": meta, "rows": rows, "cold": cold}


def print_table(result: dict) -> None:
    rows = result["rows"]
    print(f"# {result['meta']['gpu']}  ({result['meta']['timing']})")
    print("# TFLOP/s (ratio to SDPA FLASH of the same run and dtype)")
    for dtype in dict.fromkeys(r["run_dtype"] for r in rows):
        for d in sorted({r["d"] for r in rows}):
            for causal in (False, True):
                key = (dtype, d, causal)
                sel = [r for r in rows if (r["run_dtype"], r["d"], r["causal"]) == key]
                if not sel:
                    continue
                Ns = sorted({r["N"] for r in sel})
                print(f"\n{dtype} d={d} causal={causal}")
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
        print(
            "\nfirst call in a fresh process, d = 64, N = 4096, ms: empty kernel cache "
            "(compile + load + run) / cache filled (load + run)"
        )
        for c in result["cold"]:
            print(f"  {c['impl']:4s} {c['compile_load_run_ms']:8.1f} / {c['load_run_ms']:8.1f}")


def write_json(result: dict, path: Path) -> None:
    """{"meta": {..., "ceilings": {"device": {...}, "roofs": {...}}, "sm_clock_during_benchmark"},
    "rows": [{impl, label, family, version, dtype, run_dtype, d, causal, N, B, H, ms, round_ms,
    spread, tflops, ratio_to_flash, skipped, rel_diff_to_flash?}],
    "cold": [{impl, d, N, B, compile_load_run_ms, load_run_ms}]}"""
    write_result(result, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
    )
    parser.add_argument("--quick", action="store_true", help=f"only N in {QUICK_N}")
    parser.add_argument("--d", type=int, nargs="+", choices=(64, 128), help="head dims")
    parser.add_argument("--n", type=int, nargs="+", choices=ALL_N, help="sequence lengths")
    parser.add_argument("--rounds", type=at_least(1), default=5, help="interleaved rounds")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float16", "bfloat16"],
        choices=("float16", "bfloat16"),
        help="16-bit input dtypes to run",
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-call subprocesses")
    parser.add_argument(
        "--versions",
        type=int,
        nargs="+",
        help="only these kernel versions (the baselines always run)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/gpu_bench.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    from flashref.gpu.forward_versions import VERSIONS

    if args.versions and not set(args.versions) <= set(VERSIONS):
        parser.error(f"--versions must be among {sorted(VERSIONS)}, got {args.versions}")
    result = run(args)
    print_table(result)
    write_json(result, args.out)
    print(f"\nwrote {args.out}")
    return 0
