"""GPU benchmark of the backward pass: flashref's backward versions beside SDPA FLASH and cuDNN.

    python -m flashref.bench backward [--out results/gpu_backward.json] [--rounds 5]
                                 [--d 64 128] [--n 1024 4096 16384] [--dtypes float16 bfloat16]
                                 [--versions 1 2 ...]

Only the backward part: the forward tables of ``python -m flashref.bench gpu`` are not re-run.
Shapes (B, H, N, d) with H = 16 and B = max(1, 2*16384 // N), as the forward bench. For each
(dtype, d, N, causal), in one process and in ``--rounds`` interleaved rounds (every
implementation once per round, each time the median of 10 calls after warm-up, CUDA events):

* flashref's forward (the default version) and each backward version (``BWD_VERSIONS``),
  given the forward's O and lse; a backward call is the whole of it: D, the main kernel and
  the dQ conversion, with dQ's float32 buffer zeroed inside the call;
* SDPA FLASH and cuDNN (torch), forward under ``torch.no_grad()``, and backward timed as
  ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)`` after one forward outside
  the timed region (the same backward kernels as ``out.backward(dout)``, without adding into
  ``.grad``);
* ``flashref_public``: what a user calls instead, ``flash_attention_backward`` with
  ``version=None`` on the same torch tensors (the default version; the row's ``version``
  says which), timed with torch's events as SDPA is: the public calls on both sides.

A row records the median over rounds and the smallest and largest round. Forward TFLOP/s =
4 B H N^2 d / time, halved for causal; backward TFLOP/s = 2.5 times the forward's FLOPs / time
(two products in the forward, five in the backward). Each flashref backward is also compared
once with SDPA FLASH's gradients (a sanity check printed as a warning; tests/ holds the real
checks). Writes JSON (schema in ``write_json``) to ``results/gpu_backward.json`` or ``--out``.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

from flashref.gpu import flash_attention_backward
from flashref.gpu._runtime import device_cc, require_gpu
from flashref.gpu.backward import get_functions, launch_backward
from flashref.gpu.backward_versions import default_bwd_version
from flashref.gpu.forward import resolve_version as forward_version

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

DEFAULT_N = (1024, 4096, 16384)
SDPA = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
BWD_FLOP_FACTOR = 2.5


PROG = "python -m flashref.bench backward"


def run_meta(cp, torch, args) -> dict:
    from flashref.gpu import BWD_VERSIONS

    props = cp.cuda.runtime.getDeviceProperties(0)
    return provenance(cp, torch, backward="all") | {
        "sm_count": props["multiProcessorCount"],
        "heads": HEADS,
        "batch_rule": "B = max(1, 2*16384 // N)",
        "shapes": {"N": list(args.n), "d": list(args.d), "dtypes": list(args.dtypes)},
        "timing": (
            f"CUDA events; each round the median of {REPEATS} calls after 2 warm-up "
            f"calls; {args.rounds} interleaved rounds; SDPA backward timed as "
            "torch.autograd.grad(out, (q, k, v), dout, retain_graph=True); flashref's "
            "versions through their internal launch, a study of the kernels; "
            "flashref_public: flash_attention_backward(version=None) on the same torch "
            "tensors, timed with torch's events as SDPA (the public calls on both "
            "sides)"
        ),
        "tflops_rule": "forward 4 B H N^2 d / time (halved for causal); backward 2.5x that",
        "backward_versions": {n: f"{v.name}: {v.summary}" for n, v in BWD_VERSIONS.items()},
    }


def _impls(ctx, d, causal, dtype, x):
    """[(impl, direction, version, run, grads_or_None)] for one configuration."""
    cp, torch = ctx["cp"], ctx["torch"]
    from flashref.gpu import BWD_VERSIONS, flash_attention

    q, k, v, do = x
    scale = 1 / math.sqrt(d)
    fwd = forward_version(None, dtype, d, causal, device_cc(cp))  # what version=None runs here
    O, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    out = [
        (
            "flashref",
            "forward",
            fwd.number,
            lambda: flash_attention(q, k, v, causal=causal, out=O),
            None,
        )
    ]
    for ver in BWD_VERSIONS.values():
        if ctx["versions"] and ver.number not in ctx["versions"]:
            continue
        if d not in ver.head_dims:  # a version built for one head dim (bwd17: d = 64)
            continue
        if not ver.runs_on(device_cc(cp)):  # an sm_90a version elsewhere than on 9.0
            print(
                f"  bwd{ver.number}: skipped, needs compute capability "
                f"{ver.min_cc[0]}.{ver.min_cc[1]} ({ver.arch or 'or higher'})"
            )
            continue
        get_functions(ver, d, dtype)
        grads = tuple(cp.empty_like(t) for t in (q, k, v))

        def bwd(ver=ver, grads=grads):
            launch_backward(ver, q, k, v, O, lse, do, *grads, causal=causal, scale=scale)

        bwd()
        out.append(("flashref", "backward", ver.number, bwd, grads))
    if torch is None:
        return out
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv = (torch.from_dlpack(t).detach().requires_grad_() for t in (q, k, v))
    tdo = torch.from_dlpack(do)
    for impl, backend in SDPA.items():
        be = getattr(SDPBackend, backend)

        def forward(be=be):
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(
                    tq, tk, tv, is_causal=causal
                )

        try:
            res = forward()  # one forward outside the timed region; its graph is kept
        except Exception as exc:  # a backend may refuse a shape or dtype
            print(
                f"  {impl} {dtype} d={d}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr
            )
            continue

        def fwd_nograd(forward=forward):
            with torch.no_grad():
                forward()

        def backward(res=res):
            return torch.autograd.grad(res, (tq, tk, tv), tdo, retain_graph=True)

        grads = tuple(cp.from_dlpack(g) for g in backward())
        out.append((impl, "forward", None, fwd_nograd, None))
        out.append((impl, "backward", None, backward, grads))

    args = (*(t.detach() for t in (tq, tk, tv)), torch.from_dlpack(O), torch.from_dlpack(lse), tdo)
    default = default_bwd_version(dtype, d, causal, device_cc(cp))

    def public():
        return flash_attention_backward(*args, causal=causal)

    grads = tuple(cp.from_dlpack(g) for g in public())
    out.append(("flashref_public", "backward", default, public, grads))
    return out


def _rel(a, b, cp) -> float:
    a, b = a.astype(cp.float32), b.astype(cp.float32)
    return float(cp.linalg.norm(a - b) / cp.linalg.norm(b))


def bench_config(ctx, d, N, causal, dtype, x, rounds: int) -> list[dict]:
    cp, torch = ctx["cp"], ctx["torch"]
    B = batch(N)
    impls = _impls(ctx, d, causal, dtype, x)
    times: list[list[float]] = [[] for _ in impls]
    torch_event = (lambda: torch.cuda.Event(enable_timing=True)) if torch is not None else None
    for _ in range(rounds):
        for i, (impl, _, _, run, _) in enumerate(impls):
            on_torch = impl.startswith("sdpa") or impl == "flashref_public"
            times[i].append(median_ms(run, torch_event if on_torch else cp.cuda.Event, REPEATS, 2))
    ref = next((g for impl, direc, _, _, g in impls if impl == "sdpa_flash" and g), None)
    rows = []
    for (impl, direction, version, _, grads), ts in zip(impls, times, strict=True):
        ms = statistics.median(ts)
        f = flops(B, N, d, causal) * (BWD_FLOP_FACTOR if direction == "backward" else 1.0)
        row = {
            "impl": impl,
            "direction": direction,
            "version": version,
            "dtype": dtype,
            "d": d,
            "causal": causal,
            "N": N,
            "B": B,
            "H": HEADS,
            "ms": ms,
            "ms_min": min(ts),
            "ms_max": max(ts),
            "round_ms": ts,
            "tflops": f / (ms * 1e-3) / 1e12,
        }
        if impl.startswith("flashref") and grads is not None and ref is not None:
            row["rel_diff_to_flash"] = [_rel(a, b, cp) for a, b in zip(grads, ref, strict=True)]
            if not max(row["rel_diff_to_flash"]) <= 2e-2:
                print(
                    f"  WARNING bwd{version} {dtype} d={d} N={N} causal={causal}: relative "
                    f"difference to SDPA FLASH (dq, dk, dv) {row['rel_diff_to_flash']}",
                    file=sys.stderr,
                )
        rows.append(row)
    return rows


def run(args) -> dict:
    cp = require_gpu()
    if "bfloat16" in args.dtypes:
        import ml_dtypes  # noqa: F401  (registers the name "bfloat16" with NumPy, as CuPy needs)
    torch, _, _ = import_torch()
    meta = run_meta(cp, torch, args)
    print(
        f"{meta['gpu']}, driver {meta['driver']}, CuPy {meta['cupy']}, torch {meta['torch']}",
        file=sys.stderr,
    )
    ctx = {"cp": cp, "torch": torch, "versions": args.versions}
    rows = []
    rng = cp.random.default_rng(0)
    with ClockSampler() as clock:
        for d in args.d:
            for N in args.n:
                shape = (batch(N), HEADS, N, d)
                x32 = [rng.standard_normal(shape, dtype=cp.float32) for _ in range(4)]
                for dtype in args.dtypes:
                    x = tuple(t.astype(dtype) for t in x32)  # q, k, v, dO
                    for causal in (False, True):
                        t0 = time.perf_counter()
                        new = bench_config(ctx, d, N, causal, dtype, x, args.rounds)
                        rows += new
                        if args.out:  # what is measured so far survives an interruption
                            write_json({"meta": {**meta, "partial": True}, "rows": rows}, args.out)
                        done = ", ".join(
                            f"{r['impl']}/{r['direction'][0]}{r['version'] or ''} {r['tflops']:.0f}"
                            for r in new
                        )
                        print(
                            f"[{dtype} d={d} N={N} B={batch(N)} causal={causal}] "
                            f"{time.perf_counter() - t0:.1f} s; TFLOP/s: {done}",
                            file=sys.stderr,
                        )
                    del x
                    cp.get_default_memory_pool().free_all_blocks()
                del x32
                cp.get_default_memory_pool().free_all_blocks()
    meta["sm_clock_during_benchmark"] = clock.summary()
    return {"meta": meta, "rows": rows}


def print_table(result: dict) -> None:
    rows = result["rows"]
    print(f"# {result['meta']['gpu']}  ({result['meta']['timing']})")
    print("# backward TFLOP/s (2.5x forward FLOPs / time), ratio to SDPA FLASH / cuDNN backward")
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for d in sorted({r["d"] for r in rows}):
            for causal in (False, True):
                sel = [r for r in rows if (r["dtype"], r["d"], r["causal"]) == (dtype, d, causal)]
                if not sel:
                    continue
                Ns = sorted({r["N"] for r in sel})
                print(f"\n{dtype} d={d} causal={causal}")
                print(f"{'impl':20s}" + "".join(f"{'N=' + str(n):>22s}" for n in Ns))
                keys = dict.fromkeys((r["impl"], r["direction"], r["version"]) for r in sel)
                for impl, direction, version in keys:
                    abbr = "bwd" if direction == "backward" else "fwd v"
                    name = f"{impl} {abbr}{'' if version is None else version}".rstrip(" v")
                    cells = []
                    for n in Ns:
                        at = [r for r in sel if r["N"] == n]
                        r = next(
                            (
                                x
                                for x in at
                                if (x["impl"], x["direction"], x["version"])
                                == (impl, direction, version)
                            ),
                            None,
                        )
                        if r is None:
                            cells.append("-")
                            continue
                        base = {x["impl"]: x["tflops"] for x in at if x["direction"] == direction}
                        ratios = "/".join(
                            f"{r['tflops'] / base[b]:.2f}" if b in base else "-" for b in SDPA
                        )
                        cells.append(f"{r['tflops']:.1f} ({ratios})")
                    print(f"{name:20s}" + "".join(f"{c:>22s}" for c in cells))


def write_json(result: dict, path: Path) -> None:
    """{"meta": {gpu, sm_count, driver, cuda_runtime, cupy, torch, python, numpy, date, heads,
    batch_rule, shapes, timing, tflops_rule, sm_clock_during_benchmark}, "rows": [{impl,
    direction, version, dtype, d, causal, N, B, H, ms, ms_min, ms_max, round_ms, tflops,
    rel_diff_to_flash?}]}"""
    write_result(result, path)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
    )
    parser.add_argument("--d", type=int, nargs="+", choices=(64, 128), default=[64, 128])
    parser.add_argument("--n", type=at_least(1), nargs="+", default=list(DEFAULT_N))
    parser.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds")
    parser.add_argument(
        "--dtypes", nargs="+", default=["float16", "bfloat16"], choices=("float16", "bfloat16")
    )
    parser.add_argument("--versions", type=int, nargs="+", help="only these backward versions")
    parser.add_argument("--out", type=Path, default=Path("results/gpu_backward.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if any(n < 1 for n in args.n):
        parser.error("--n values must be >= 1")
    from flashref.gpu import BWD_VERSIONS

    if args.versions and not set(args.versions) <= set(BWD_VERSIONS):
        parser.error(f"--versions must be among {sorted(BWD_VERSIONS)}")
    result = run(args)
    print_table(result)
    write_json(result, args.out)
    print(f"\nwrote {args.out}")
    return 0
