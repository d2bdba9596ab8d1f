"""Decode benchmark: flashref's split-KV kernel (contiguous and paged) beside torch SDPA.

    python -m flashref.bench decode [--rounds 5] [--dtypes float16 bfloat16] [--versions 1 2 3]
                                    [--out PATH]

One new token per sequence (Nq = 1), d = 128, Hq = 32 query heads with Hkv = 32 (multi-head)
or 8 (grouped-query) K/V heads, batches B in 1, 8, 32 and caches of Nk = 4096, 32768, 131072
keys, every sequence full. Implementations: ``flashref`` (``decode_attention``'s kernels on a
contiguous cache), ``flashref_paged`` (the same kernels through a block table over pages of
``PAGE_SIZE`` tokens, in order), the same two for every other decode kernel version
(``flashref_v2``, ``flashref_paged_v2``, ...; ``--versions`` picks them, all by default),
SDPA FLASH, cuDNN and MATH (torch, same process, on the same memory through DLPack; grouped
heads through ``enable_gqa=True``, and where a backend refuses that, K/V repeated to Hq
heads, which the row's note says). A backend that refuses a shape, or a
shape that does not fit in memory, is recorded with the reason.

GB/s = bytes of K and V the problem needs (B * Hkv * Nk * d * 2 tensors * itemsize, every key
valid here) / time: the same bytes for every implementation, so an implementation that
reads K/V more than once (or repeated) shows it as a lower rate. The same run measures the
ceilings: HBM read bandwidth (``roofs/roof_hbm_read.cu``, a 4 GiB buffer, far beyond L2) and
the device-to-device copy bandwidth (``flashref.bench.roofs``, bytes read + written).

Timing as ``python -m flashref.bench gpu``: CUDA events around single calls, each round the
median of 10 calls after warm-up, the fast implementations over interleaved rounds (SDPA
MATH in one round, fp16 only); a row holds the median over rounds, the fastest and slowest
round. flashref rows time the public API, as SDPA's rows do: ``decode_attention``, and
``paged_decode_attention`` with the block table and lengths as host NumPy int32 arrays, as a
serving loop holds them (the events are recorded before the call's Python runs, so its host
time is in the event time wherever the kernels are shorter than it).

Two more times per row (``flashref.bench.timing.call_time``): ``host_us``, the median host time of
one call (``perf_counter`` around it, the device synchronised after each call), for every
row but SDPA MATH; and ``kernel_us``, the GPU time of the call's kernels from
``torch.profiler``'s CUDA activity (sum of kernel durations / calls), for the default decode
version's rows and SDPA FLASH and cuDNN only (``kernel_impls``), to keep the run short.

And the time of a call as a serving loop runs it (``flashref.bench.timing.graph_time``): the
contiguous rows of every version and SDPA FLASH and cuDNN, captured in a CUDA graph and
replayed, the inputs rotated among copies that together overflow the L2 (``graph_us``,
``graph_gbps``, ``graph_ratio_to_cudnn``). Host time is gone from that figure; what stays
is the kernels and the gaps between them. The paged rows are not graphed: their block
table is checked on the host every call, which a graph cannot repeat.
Writes ``results/gpu_decode.json`` (schema in ``write_json``) or ``--out``.
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

import numpy as np

from flashref.gpu._runtime import require_gpu
from flashref.gpu.decode import (
    decode_attention,
    decode_plan,
    default_decode_version,
    paged_decode_attention,
)

from ..gpu.decode import VERSIONS
from ..recorded.decode import impl_names
from ._common import ClockSampler, import_torch, median_ms, write_result
from .cli import ArgumentParser, at_least
from .provenance import provenance
from .roofs import ROOF_DIR, device_facts, hbm_roof, time_ms
from .timing.call_time import host_us, kernel_us
from .timing.graph_time import L2_MULTIPLE, CapturedCalls, graph_calls, input_sets

HQ, NQ, D = 32, 1, 128
BATCHES, KV_HEADS, CONTEXTS = (1, 8, 32), (32, 8), (4096, 32768, 131072)
PAGE_SIZE = 64
REPEATS = 10
HOST_CALLS = 20  # host_us: the median of this many calls
KERNEL_CALLS = 5  # kernel_us: profiled calls
READ_BYTES = 4 * 2**30
BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_math": "MATH"}
GRAPH_BACKENDS = ("sdpa_flash", "sdpa_cudnn")  # the SDPA rows that get graph_us
GRAPH_REPLAYS = 5  # graph_us: each round the median of this many replays


PROG = "python -m flashref.bench decode"


def hbm_read_roof(cp, sm_count: int) -> float:
    """GB/s of a read-only kernel over a 4 GiB buffer (16-byte loads, nothing written)."""
    module = cp.RawModule(
        code=(ROOF_DIR / "roof_hbm_read.cu").read_text(), options=("--std=c++17",)
    )
    fn = module.get_function("roof_hbm_read")
    buf = cp.empty(READ_BYTES // 4, dtype=cp.uint32)
    buf[:] = cp.arange(buf.size, dtype=cp.uint32)  # touched: every page of it is real memory
    out = cp.empty(4, dtype=cp.uint32)
    args = (buf, np.int64(READ_BYTES // 16), out)
    ms = time_ms(cp, lambda: fn((sm_count * 8,), (256,), args))
    del buf
    return READ_BYTES / (ms * 1e-3) / 1e9


def run_meta(cp, torch, facts, read_gbps, copy_gbps, versions=(1,)) -> dict:
    return provenance(cp, torch, decode=versions) | {
        "hbm_read_gbps": read_gbps,
        "hbm_copy_gbps": copy_gbps,
        "sm_count": facts["sm_count"],
        "page_size": PAGE_SIZE,
        "what_is_timed": (
            "flashref's versions through their public calls with a version "
            "asked for; SDPA through its public call; the plain-loop decode "
            "of the public calls beside SDPA's: python -m flashref.bench calls"
        ),
        "decode_versions": list(versions),
        "gbps_rule": "bytes of K and V (every key valid) / time",
        "host_rule": (
            f"host_us: median over {HOST_CALLS} calls of perf_counter around one call of the "
            "public API (flashref) or of SDPA, the device synchronised after each, outside it"
        ),
        "kernel_rule": (
            f"kernel_us: sum of the kernel durations torch.profiler (CUPTI) records over "
            f"{KERNEL_CALLS} calls / {KERNEL_CALLS}, copies and memsets left out; for the "
            "default decode version's rows (contiguous and paged) and SDPA FLASH and cuDNN"
        ),
        "timing": (
            f"CUDA events; each round the median of {REPEATS} calls after warm-up; "
            "fast implementations over interleaved rounds, SDPA MATH one round"
        ),
        "graph_rule": (
            "graph_us: the calls captured in one CUDA graph (torch.cuda.graph on a side stream, "
            f"relaxed mode), inputs rotated among graph_sets copies (together >= {L2_MULTIPLE}x "
            f"the L2), graph_calls calls per graph; device events around one replay / "
            f"graph_calls, each round the median of {GRAPH_REPLAYS} replays, the median over "
            "interleaved rounds; contiguous flashref rows (the public API) and SDPA FLASH, cuDNN"
        ),
    }


def decode_inputs(cp, B, Hkv, Nk, dtype, seed, d=D):
    """q (B, HQ, 1, d), k, v (B, Hkv, Nk, d) of normals, filled a sequence at a time."""
    rng = cp.random.default_rng(seed)
    q = rng.standard_normal((B, HQ, NQ, d), dtype=cp.float32).astype(dtype)
    k, v = (cp.empty((B, Hkv, Nk, d), dtype=dtype) for _ in range(2))
    for x in (k, v):
        for b in range(B):  # no float32 copy of the whole cache at once
            x[b] = rng.standard_normal((Hkv, Nk, d), dtype=cp.float32).astype(dtype)
    return q, k, v


def _flashref_impls(ctx, q, k, v, paged_ok: bool, versions):
    """[(impl, run_or_None, num_splits, note, make_or_None)]: each decode version, contiguous
    and paged, through the public API (the block table and lengths as host int32 arrays).
    ``make(q, k, v)`` gives the contiguous call on other inputs of the shape (the graph
    timing's rotation); the paged rows have none (their table is checked on the host)."""

    cp = ctx["cp"]
    B, Hkv, Nk, _ = k.shape
    if paged_ok:
        n = Nk // PAGE_SIZE  # pages per sequence, laid out in order: page b * n + p
        kp, vp = (
            cp.ascontiguousarray(
                x.reshape(B, Hkv, n, PAGE_SIZE, D).transpose(0, 2, 1, 3, 4)
            ).reshape(B * n, Hkv, PAGE_SIZE, D)
            for x in (k, v)
        )
        bt = np.arange(B * n, dtype=np.int32).reshape(B, n)  # (B, n) on the host
        lens = np.full(B, Nk, dtype=np.int32)  # (B,) on the host
    out = []
    for version in versions:
        plan = decode_plan(B, HQ, Hkv, NQ, Nk, D, ctx["sm_count"], version=version)
        name, paged_name = impl_names(version)

        def contiguous(version=version):
            return decode_attention(q, k, v, version=version)

        def make(q, k, v, version=version):  # O and lse both kept by the graph's outputs
            return lambda: decode_attention(q, k, v, version=version, return_lse=True)

        out.append((name, contiguous, plan.num_splits, f"decode version {version}", make))
        if paged_ok:
            note = f"decode version {version}; page_size {PAGE_SIZE}, block table in order"

            def paged(version=version):  # every sequence full: no mask either way
                return paged_decode_attention(q, kp, vp, bt, lens, causal=False, version=version)

            out.append((paged_name, paged, plan.num_splits, note, None))
        else:
            out.append(
                (
                    paged_name,
                    None,
                    None,
                    "not run: a second copy of K/V (the pages) "
                    "would not fit in memory beside the contiguous one",
                    None,
                )
            )
    return out


def _impls(ctx, q, k, v, dtype, paged_ok: bool, versions=(1,)):
    """[(impl, run_or_None, num_splits, note, make_or_None)] for one shape."""
    torch = ctx["torch"]
    Hkv = k.shape[1]
    out = _flashref_impls(ctx, q, k, v, paged_ok, versions)
    if torch is None:
        return out + [(impl, None, None, "torch not importable", None) for impl in BACKENDS]
    for impl, backend in BACKENDS.items():
        if impl == "sdpa_math" and dtype != "float16":
            continue
        run, note = None, None
        for how in ("enable_gqa", "repeated") if Hkv != HQ else ("plain",):
            try:
                make = functools.partial(sdpa_decode, backend=backend, how=how)
                run = make(q, k, v)
                run()
                torch.cuda.synchronize()
                done = {
                    "enable_gqa": "enable_gqa=True",
                    "plain": None,
                    "repeated": f"K/V repeated to {HQ} heads (the repeat is not timed)",
                }
                note = done[how] if note is None else f"{note}; {done[how]}"
                break
            except Exception as exc:  # a backend may refuse a shape, or run out of memory
                msg = f"{how}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                note = msg if note is None else f"{note}; {msg}"
                run = make = None
                torch.cuda.empty_cache()
        graphed = make if impl in GRAPH_BACKENDS else None
        out.append((impl, run, None, note if run is not None else f"refused: {note}", graphed))
    return out


def sdpa_decode(q, k, v, *, backend: str, how: str):
    """A call of torch SDPA with ``backend`` (a name in ``SDPBackend``) on decode inputs (CuPy
    arrays, through DLPack), grouped heads by ``how``: ``"enable_gqa"``, ``"plain"`` (as many
    K/V heads as query heads) or ``"repeated"`` (K/V repeated to q's heads here, once, outside
    the call). The benchmark, its graph rows, the profile and the split sweep all call SDPA
    through this."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = getattr(SDPBackend, backend)
    tq, kk, vv = (torch.from_dlpack(x) for x in (q, k, v))
    if how == "repeated":
        kk, vv = (x.repeat_interleave(tq.shape[1] // kk.shape[1], dim=1) for x in (kk, vv))
    gqa = how == "enable_gqa"

    def run():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(tq, kk, vv, enable_gqa=gqa)

    return run


def kernel_impls(versions, cc=None) -> set[str]:
    """The rows that get ``kernel_us``: the default decode version of this GPU (contiguous,
    and paged with ``PAGE_SIZE``) where it is among ``versions``, SDPA FLASH and cuDNN."""

    if cc is None:
        from flashref.gpu._launch import device_facts as gpu_facts

        cc = gpu_facts()[0]
    contiguous, paged = default_decode_version(cc, None), default_decode_version(cc, PAGE_SIZE)
    rows = {impl_names(contiguous)[0]} if contiguous in versions else set()
    rows |= {impl_names(paged)[1]} if paged in versions else set()
    return rows | {"sdpa_flash", "sdpa_cudnn"}


def bench_shape(ctx, dtype, B, Hkv, Nk, rounds, versions=(1,)) -> list[dict]:
    cp, torch = ctx["cp"], ctx["torch"]
    item = np.dtype(dtype).itemsize
    kv_bytes = 2 * B * Hkv * Nk * D * item
    free = cp.cuda.runtime.memGetInfo()[0]
    base = {"dtype": dtype, "d": D, "B": B, "Hq": HQ, "Hkv": Hkv, "Nq": NQ, "Nk": Nk}
    if kv_bytes > 0.8 * free:
        note = f"not run: K and V take {kv_bytes / 1e9:.0f} GB, {free / 1e9:.0f} GB free"
        return [
            {
                **base,
                "impl": i,
                "ms": None,
                "ms_min": None,
                "ms_max": None,
                "gbps": None,
                "num_splits": None,
                "host_us": None,
                "kernel_us": None,
                "note": note,
            }
            for i in (*(n for v in versions for n in impl_names(v)), *BACKENDS)
        ]
    q, k, v = decode_inputs(cp, B, Hkv, Nk, dtype, seed=B * 1000 + Hkv + Nk)
    impls = _impls(ctx, q, k, v, dtype, paged_ok=2 * kv_bytes < 0.8 * free, versions=versions)
    times = {impl: [] for impl, *_ in impls}
    events = {"cp": cp.cuda.Event}
    if torch is not None:
        events["torch"] = lambda: torch.cuda.Event(enable_timing=True)
    for rnd in range(rounds):
        for impl, run, *_ in impls:
            if run is None or (impl == "sdpa_math" and rnd > 0):
                continue
            make = events["torch" if impl.startswith("sdpa") else "cp"]
            times[impl].append(median_ms(run, make, REPEATS, 2))
    host, kernel = {}, {}
    for impl, run, *_ in impls:
        if run is None or impl == "sdpa_math":
            continue
        sdpa = impl.startswith("sdpa")
        sync = torch.cuda.synchronize if sdpa else cp.cuda.runtime.deviceSynchronize
        host[impl] = host_us(run, sync, HOST_CALLS)
        if torch is not None and impl in ctx["kernel_impls"]:
            kernel[impl] = kernel_us(torch, run, KERNEL_CALLS)
    graph = _graph_times(ctx, impls, (q, k, v), kv_bytes, rounds, seed=B * 1000 + Hkv + Nk)
    ref = impls[0][1]()  # the first version's output: a sanity check of the others (tests/ too)
    rows = []
    for impl, run, splits, note, _ in impls:
        ts = times[impl]
        ms = statistics.median(ts) if ts else None
        row = {
            **base,
            "impl": impl,
            "ms": ms,
            "ms_min": min(ts) if ts else None,
            "ms_max": max(ts) if ts else None,
            "round_ms": ts,
            "gbps": kv_bytes / (ms * 1e-3) / 1e9 if ms else None,
            "bytes": kv_bytes,
            "num_splits": splits,
            "host_us": host.get(impl),
            "kernel_us": kernel.get(impl),
            "note": note,
            **graph.get(impl, _NO_GRAPH),
        }
        if run is not None and impl != impls[0][0]:
            other = run()
            other = cp.from_dlpack(other) if not isinstance(other, cp.ndarray) else other
            a, b = other.astype(cp.float32), ref.astype(cp.float32)
            row["rel_diff_to_flashref"] = float(cp.linalg.norm(a - b) / cp.linalg.norm(b))
        rows.append(row)
    del q, k, v, impls
    cp.get_default_memory_pool().free_all_blocks()
    if torch is not None:
        torch.cuda.empty_cache()
    return rows


_NO_GRAPH = {
    "graph_us": None,
    "graph_us_min": None,
    "graph_us_max": None,
    "graph_gbps": None,
    "graph_calls": None,
    "graph_sets": None,
}


def _graph_times(ctx, impls, inputs, kv_bytes: int, rounds: int, seed: int) -> dict:
    """{impl: graph fields} for the rows with a ``make``: ``graph_us`` the median over rounds
    of ``CapturedCalls.replay_us`` (interleaved rounds), with its fastest and slowest round,
    ``graph_gbps`` from it, the graph's calls and input sets, and
    ``graph_rel_diff_to_flashref`` (the captured last call's O beside the first row's);
    a row whose capture failed gets ``graph_note`` instead."""
    cp, torch = ctx["cp"], ctx["torch"]
    made = [(impl, make) for impl, run, _, _, make in impls if run is not None and make]
    if torch is None or not made:
        return {}
    q, k, v = inputs
    B, Hkv, Nk, _ = k.shape
    n_sets = input_sets(kv_bytes, ctx["l2_bytes"])
    sets = [inputs] + [
        decode_inputs(cp, B, Hkv, Nk, q.dtype, seed=seed + i) for i in range(1, n_sets)
    ]
    n_calls = graph_calls(kv_bytes, n_sets)
    captured, out = {}, {}
    for impl, make in made:
        try:
            captured[impl] = CapturedCalls(
                torch, cp, [make(*sets[i % n_sets]) for i in range(n_calls)]
            )
        except Exception as exc:  # a backend that cannot be captured says why
            out[impl] = {
                **_NO_GRAPH,
                "graph_note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
            }
            torch.cuda.synchronize()
    times = {impl: [] for impl in captured}
    for _ in range(rounds):
        for impl, c in captured.items():
            times[impl].append(c.replay_us(GRAPH_REPLAYS))
    first = None
    for impl, c in captured.items():
        O = c.last_output()
        O = O[0] if isinstance(O, tuple) else O  # flashref's (O, lse)
        O = (O if isinstance(O, cp.ndarray) else cp.from_dlpack(O)).astype(cp.float32)
        first = O if first is None else first
        us = statistics.median(times[impl])
        out[impl] = {
            "graph_us": us,
            "graph_us_min": min(times[impl]),
            "graph_us_max": max(times[impl]),
            "graph_gbps": kv_bytes / us * 1e-3,
            "graph_calls": n_calls,
            "graph_sets": n_sets,
            "graph_rel_diff_to_flashref": float(cp.linalg.norm(O - first) / cp.linalg.norm(first)),
        }
    del captured, sets
    torch.cuda.synchronize()
    return out


def run(args) -> dict:
    cp = require_gpu()
    if "bfloat16" in args.dtypes:
        import ml_dtypes  # noqa: F401  (registers the name "bfloat16" with NumPy, as CuPy needs)
    torch, _, _ = import_torch()
    facts = device_facts(cp)
    read = hbm_read_roof(cp, facts["sm_count"])
    copy = hbm_roof(cp)["hbm_copy_tbps"] * 1e3
    cp.get_default_memory_pool().free_all_blocks()
    meta = run_meta(cp, torch, facts, read, copy, args.versions)
    print(
        f"{meta['gpu']}, CuPy {meta['cupy']}, torch {meta['torch']}: HBM read {read:.0f} GB/s, "
        f"copy {copy:.0f} GB/s",
        file=sys.stderr,
    )
    ctx = {
        "cp": cp,
        "torch": torch,
        "sm_count": facts["sm_count"],
        "l2_bytes": facts["l2_bytes"],
        "kernel_impls": kernel_impls(args.versions),
    }
    rows = []
    with ClockSampler() as clock:
        for dtype in args.dtypes:
            for Nk in CONTEXTS:
                for Hkv in KV_HEADS:
                    for B in BATCHES:
                        new = bench_shape(ctx, dtype, B, Hkv, Nk, args.rounds, args.versions)
                        rows += new
                        done = ", ".join(f"{r['impl']} {r['gbps']:.0f}" for r in new if r["gbps"])
                        print(f"[{dtype} B={B} Hkv={Hkv} Nk={Nk}] GB/s: {done}", file=sys.stderr)
                        if args.out:  # what is measured so far survives an interruption
                            write_json({"meta": {**meta, "partial": True}, "rows": rows}, args.out)
    meta["clocks"] = clock.summary()
    for r in rows:
        cudnn = next(
            (
                x
                for x in rows
                if x["impl"] == "sdpa_cudnn"
                and all(x[key] == r[key] for key in ("dtype", "B", "Hkv", "Nk"))
            ),
            None,
        )
        ok = r["gbps"] and cudnn and cudnn["gbps"]
        r["ratio_to_cudnn"] = r["gbps"] / cudnn["gbps"] if ok else None
        r["fraction_of_read"] = r["gbps"] / read if r["gbps"] else None
        r["fraction_of_copy"] = r["gbps"] / copy if r["gbps"] else None
        ok = r["graph_gbps"] and cudnn and cudnn["graph_gbps"]
        r["graph_ratio_to_cudnn"] = r["graph_gbps"] / cudnn["graph_gbps"] if ok else None
        r["graph_fraction_of_read"] = r["graph_gbps"] / read if r["graph_gbps"] else None
    return {"meta": meta, "rows": rows}


def print_table(result: dict) -> None:
    m = result["meta"]
    print(
        f"# {m['gpu']}: HBM read {m['hbm_read_gbps']:.0f} GB/s, copy {m['hbm_copy_gbps']:.0f} "
        f"GB/s; d = {D}, Nq = {NQ}, Hq = {HQ}"
    )
    print("# GB/s of K and V (ratio to SDPA cuDNN, fraction of the HBM read ceiling)")
    impls = list(dict.fromkeys(r["impl"] for r in result["rows"]))
    print(
        f"{'dtype':9s}{'B':>4s}{'Hkv':>5s}{'Nk':>8s}{'splits':>7s}"
        + "".join(f"{i:>22s}" for i in impls)
    )
    keys = dict.fromkeys((r["dtype"], r["B"], r["Hkv"], r["Nk"]) for r in result["rows"])
    for dtype, B, Hkv, Nk in keys:
        sel = {
            r["impl"]: r
            for r in result["rows"]
            if (r["dtype"], r["B"], r["Hkv"], r["Nk"]) == (dtype, B, Hkv, Nk)
        }
        cells = []
        for i in impls:
            r = sel.get(i)
            if r is None or r["gbps"] is None:
                cells.append("-" if r is None else "skipped")
                continue
            ratio = f"{r['ratio_to_cudnn']:.2f}" if r["ratio_to_cudnn"] else "-"
            cells.append(f"{r['gbps']:.0f} ({ratio}, {r['fraction_of_read']:.2f})")
        splits = next((r["num_splits"] for r in sel.values() if r.get("num_splits")), None)
        print(
            f"{dtype:9s}{B:4d}{Hkv:5d}{Nk:8d}{splits if splits else '-':>7}"
            + "".join(f"{c:>22s}" for c in cells)
        )
    print("# microseconds per call: host time / kernel time ('-': not measured)")
    _cell_table(result["rows"], keys, impls, _us_cell)
    graphed = [
        i for i in impls if any(r.get("graph_gbps") for r in result["rows"] if r["impl"] == i)
    ]
    print("# replayed from a CUDA graph: GB/s (ratio to SDPA cuDNN's, fraction of read)")
    _cell_table(result["rows"], keys, graphed, _graph_cell)
    for r in result["rows"]:
        if r.get("graph_note"):
            print(
                f"  graph {r['impl']} {r['dtype']} B={r['B']} Hkv={r['Hkv']} Nk={r['Nk']}: "
                f"{r['graph_note']}"
            )
    for r in result["rows"]:
        if r["note"] and r["gbps"] is None:
            print(f"  {r['impl']} {r['dtype']} B={r['B']} Hkv={r['Hkv']} Nk={r['Nk']}: {r['note']}")


def _cell_table(rows, keys, impls, cell) -> None:
    """A header of ``impls``, then one line per shape of ``keys``: ``cell(row)`` per impl."""
    print(
        f"{'dtype':9s}{'B':>4s}{'Hkv':>5s}{'Nk':>8s}{'':>7s}" + "".join(f"{i:>22s}" for i in impls)
    )
    for dtype, B, Hkv, Nk in keys:
        sel = {
            r["impl"]: r
            for r in rows
            if (r["dtype"], r["B"], r["Hkv"], r["Nk"]) == (dtype, B, Hkv, Nk)
        }
        cells = [cell(sel.get(i)) for i in impls]
        print(f"{dtype:9s}{B:4d}{Hkv:5d}{Nk:8d}{'':>7s}" + "".join(f"{c:>22s}" for c in cells))


def _graph_cell(r) -> str:
    """``GB/s (ratio, fraction of read)`` of a row's graph replay, ``-`` for none."""
    if r is None or not r.get("graph_gbps"):
        return "-"
    ratio = r.get("graph_ratio_to_cudnn")
    return (
        f"{r['graph_gbps']:.0f} ({f'{ratio:.2f}' if ratio else '-'}, "
        f"{r['graph_fraction_of_read']:.2f})"
    )


def _us_cell(r) -> str:
    """``host / kernel`` microseconds of a row, ``-`` for one not measured."""
    if r is None:
        return "-"
    host, kernel = r.get("host_us"), r.get("kernel_us")
    return f"{f'{host:.1f}' if host is not None else '-'} / " + (
        f"{kernel:.1f}" if kernel is not None else "-"
    )


def write_json(result: dict, path: Path) -> None:
    """{"meta": {gpu, driver, cuda_runtime, cupy, torch, python, date, hbm_read_gbps,
    hbm_copy_gbps, sm_count, page_size, decode_versions, gbps_rule, host_rule, kernel_rule,
    timing, clocks}, "rows": [{impl, dtype, d, B, Hq, Hkv, Nq, Nk, ms, ms_min, ms_max,
    round_ms, gbps, bytes, num_splits, host_us, kernel_us, note, graph_us, graph_us_min,
    graph_us_max, graph_gbps, graph_calls, graph_sets, graph_rel_diff_to_flashref?,
    graph_note?, rel_diff_to_flashref?, ratio_to_cudnn, fraction_of_read, fraction_of_copy,
    graph_ratio_to_cudnn, graph_fraction_of_read}]} (host_us, kernel_us, graph_*: None where
    not measured); meta also holds graph_rule"""
    write_result(result, path)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
    )
    parser.add_argument("--rounds", type=at_least(1), default=5, help="interleaved rounds")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float16", "bfloat16"],
        choices=("float16", "bfloat16"),
        help="16-bit dtypes to run",
    )
    parser.add_argument(
        "--versions",
        type=int,
        nargs="+",
        default=sorted(VERSIONS),
        help="decode kernel versions to run (default: all)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/gpu_decode.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    bad = [v for v in args.versions if v not in VERSIONS]
    if bad:
        parser.error(f"--versions: {bad} are not decode versions; they are {sorted(VERSIONS)}")
    result = run(args)
    print_table(result)
    write_json(result, args.out)
    print(f"\nwrote {args.out}")
    return 0
