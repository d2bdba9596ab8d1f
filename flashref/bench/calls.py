"""What a user calls, timed beside what they would call instead: ``python -m flashref.bench calls``.

Every figure here is a *public* call on both sides: ``flashref.gpu.flash_attention``,
``flash_attention_backward``, ``decode_attention``, ``paged_decode_attention`` and
``flashref.torch.attention`` with torch tensors in, against
``torch.nn.functional.scaled_dot_product_attention`` (its own backend choice, or cuDNN's
backend chosen once, outside every timed region), timed by one helper (``CallTimer``) the
same way for both, in interleaved rounds (flashref, SDPA, flashref, ...). It records:

- ``host``: the host's microseconds per call at a tiny shape, where the GPU waits for the
  host: ``HOST_CALLS`` calls back to back without a sync, divided by their number;
- ``forward``: the GPU time of one call between two events, and of ``BACK_TO_BACK`` calls
  between two events (per call), inputs rotated among copies that together exceed the L2
  three times, at B = 2 * 16384 / N, H = 16, for fp16 and bf16, d 64 and 128, causal or not;
- ``training``: forward + backward through ``flashref.torch.attention`` against SDPA's
  (bf16, causal), ``BACK_TO_BACK`` steps between two events;
- ``decode``: a plain Python loop of ``DECODE_LOOP`` decode calls at the decode table's shapes
  (GB/s of K/V read), against SDPA with ``enable_gqa=True``;
- ``capture``: whether each entry point is captured by ``torch.cuda.graph`` in its default
  mode after one warm-up call, and whether the replay equals the eager call;
- ``compile``: whether ``torch.compile(fullgraph=True)`` (and ``mode="reduce-overhead"``)
  compiles and runs a small model calling ``flashref.torch.attention``, forward and backward.

The file (``results/gpu_calls.json`` by default) carries the provenance every results file
carries: GPU, driver, versions, SM clocks, date, commit, and each measured kernel's source hash.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
import traceback
from pathlib import Path

import flashref.gpu as fg

from ..gpu import _runtime
from ..gpu.backward_versions import default_bwd_version
from ..gpu.decode.versions import default_decode_version
from ..gpu.forward_versions import default_forward_version
from ._common import ClockSampler, write_result
from .cli import ArgumentParser
from .provenance import provenance
from .roofs import device_facts

PROG = "python -m flashref.bench calls"
HOST_SHAPE = (1, 8, 128, 64)  # (B, H, N, d) fp16: the kernels take microseconds
HOST_CALLS = 200
DECODE_HOST = (8, 32, 8, 4096, 128)  # (B, Hq, Hkv, Nk, d), Nq = 1
ROUNDS = 5
REPEATS = 10  # single calls timed per round; the round's figure is their median
BACK_TO_BACK = 20
DECODE_LOOP = 50
FORWARD_NS = (1024, 4096, 16384)
TRAINING_SHAPES = ((32, 6, 256, 64), (8, 16, 1024, 64), (2, 16, 4096, 128))  # (B, H, N, d)
DECODE_BATCHES, DECODE_KV_HEADS, DECODE_CONTEXTS = (1, 8, 32), (32, 8), (4096, 32768, 131072)
DECODE_HQ, DECODE_D = 32, 128
MAX_DECODE_BYTES = 24e9  # K/V bytes of one call at most (with the rotated copies, in memory)
L2_MULTIPLE = 3
PAGE_SIZE = 64


class CallTimer:
    """The one timing helper of both sides: ``single(runs)`` is the median GPU time (ms) of
    one call between two events, ``back_to_back(runs)`` that of ``BACK_TO_BACK`` calls between
    two events divided by their number, ``host(run)`` the host's microseconds per call; ``runs``
    is a list of zero-argument calls over different input copies, taken in turn."""

    def __init__(self, torch):
        self.torch = torch

    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def single(self, runs, repeats: int = REPEATS) -> float:
        times = []
        for i in range(repeats):
            start, end = self._event(), self._event()
            run = runs[i % len(runs)]
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def back_to_back(self, runs, calls: int = BACK_TO_BACK) -> float:
        start, end = self._event(), self._event()
        start.record()
        for i in range(calls):
            runs[i % len(runs)]()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls

    def host(self, run, calls: int = HOST_CALLS) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6


def interleaved(sides: dict, measure, rounds: int = ROUNDS) -> dict:
    """``{side: {"median": m, "rounds": [...]}}`` of ``measure(run)`` for each side's run, the
    sides taken in turn within each round."""
    got = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            got[name].append(measure(run))
    return {name: {"median": statistics.median(v), "rounds": v} for name, v in got.items()}


def copies(bytes_one: int, l2_bytes: int, limit: int = 8) -> int:
    """Input copies to rotate among: together at least ``L2_MULTIPLE`` x the L2."""
    return max(1, min(limit, math.ceil(L2_MULTIPLE * l2_bytes / max(1, bytes_one))))


def _sdpa(torch):
    return torch.nn.functional.scaled_dot_product_attention


def cudnn_only(torch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)


def randn_cuda(torch, shape, dtype, gen):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


# -- host time -------------------------------------------------------------------------------


def host_inputs(torch):
    """The host rows' inputs at ``HOST_SHAPE`` (fp16): ``(gen, q, k, v, dO, O, lse, qg, kg, vg,
    O_s)``, the forward's ``O`` and ``lse`` of q, k, v, leaf copies ``qg, kg, vg`` that require
    grad, and SDPA's output ``O_s`` of those (a graph to call the backward on); ``gen`` the
    generator, for more inputs."""

    gen = torch.Generator(device="cuda").manual_seed(0)
    B, H, N, d = HOST_SHAPE
    q, k, v, dO = (randn_cuda(torch, (B, H, N, d), torch.float16, gen) for _ in range(4))
    O, lse = fg.flash_attention(q, k, v, return_lse=True)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    return gen, q, k, v, dO, O, lse, qg, kg, vg, _sdpa(torch)(qg, kg, vg)


def host_times(torch, timer) -> list[dict]:
    """Host microseconds per call of each entry point beside SDPA's equivalent."""
    import flashref.torch as ft

    sdpa = _sdpa(torch)
    gen, q, k, v, dO, O, lse, qg, kg, vg, O_s = host_inputs(torch)
    B, H, N, d = HOST_SHAPE
    rows = []

    def row(what, flashref_run, baselines, note=""):
        sides = {"flashref": flashref_run, **baselines}
        for run in sides.values():
            run()  # compiled, allocator warm
        res = interleaved(sides, timer.host)
        base = min(res[b]["median"] for b in baselines) if baselines else None
        rows.append(
            {
                "call": what,
                "note": note,
                **{f"{s}_us": r["median"] for s, r in res.items()},
                "rounds_us": {s: r["rounds"] for s, r in res.items()},
                "ratio": None if base is None else res["flashref"]["median"] / base,
            }
        )

    shape = f"({B}, {H}, {N}, {d}) fp16"
    row(
        f"forward {shape}",
        lambda: fg.flash_attention(q, k, v),
        {"sdpa": lambda: sdpa(q, k, v)},
        "flash_attention(q, k, v) vs SDPA(q, k, v)",
    )
    import cupy as cp

    qc, kc, vc = (cp.asarray(x) for x in (q, k, v))  # CuPy copies (the conversion not timed)
    row(
        f"forward {shape}, CuPy arrays",
        lambda: fg.flash_attention(qc, kc, vc),
        {},
        "no baseline: SDPA takes torch tensors",
    )
    row(
        f"backward {shape}",
        lambda: fg.flash_attention_backward(q, k, v, O, lse, dO),
        {"sdpa": lambda: torch.autograd.grad(O_s, (qg, kg, vg), dO, retain_graph=True)},
        "flash_attention_backward vs autograd.grad of SDPA's output (graph retained)",
    )

    def adapter():
        return torch.autograd.grad(ft.attention(qg, kg, vg), (qg, kg, vg), dO)

    def sdpa_step():
        return torch.autograd.grad(sdpa(qg, kg, vg), (qg, kg, vg), dO)

    row(
        f"flashref.torch.attention forward + backward {shape}",
        adapter,
        {"sdpa": sdpa_step},
        "autograd.grad of each output, as a training step asks",
    )
    # where the adapter's time goes: its forward with grad enabled (the graph built), its
    # backward through the autograd engine on a retained graph, and the same step through
    # the custom operators (what torch.compile traces) instead of the autograd.Function
    row(
        f"flashref.torch.attention forward, grad enabled {shape}",
        lambda: ft.attention(qg, kg, vg),
        {"sdpa": lambda: sdpa(qg, kg, vg)},
        "the forward alone, building the autograd graph",
    )
    O_a = ft.attention(qg, kg, vg)
    row(
        f"flashref.torch.attention backward through autograd.grad {shape}",
        lambda: torch.autograd.grad(O_a, (qg, kg, vg), dO, retain_graph=True),
        {"sdpa": lambda: torch.autograd.grad(O_s, (qg, kg, vg), dO, retain_graph=True)},
        "the backward alone, graph retained: the engine around each side's backward",
    )
    row(
        f"the custom operators' forward + backward, eager {shape}",
        lambda: torch.autograd.grad(ft.attention_op(qg, kg, vg), (qg, kg, vg), dO),
        {"sdpa": sdpa_step},
        "flashref.torch.attention_op: the operators torch.compile traces, called eagerly",
    )
    Bd, Hq, Hkv, Nk, dd = DECODE_HOST
    qd = randn_cuda(torch, (Bd, Hq, 1, dd), torch.float16, gen)
    kd, vd = (randn_cuda(torch, (Bd, Hkv, Nk, dd), torch.float16, gen) for _ in range(2))
    row(
        f"decode_attention B {Bd}, Hq {Hq}, Hkv {Hkv}, Nk {Nk}, d {dd}",
        lambda: fg.decode_attention(qd, kd, vd),
        {"sdpa": lambda: sdpa(qd, kd, vd, enable_gqa=True)},
        "SDPA with enable_gqa=True",
    )
    return rows


# -- the forward, one call and back to back ---------------------------------------------------


def forward_times(torch, timer, l2_bytes: int) -> list[dict]:
    sdpa = _sdpa(torch)
    rows = []
    for dtype in ("float16", "bfloat16"):
        for d in (64, 128):
            for causal in (False, True):
                for N in FORWARD_NS:
                    B, H = max(1, 2 * 16384 // N), 16
                    tdt = getattr(torch, dtype)
                    gen = torch.Generator(device="cuda").manual_seed(N + d)
                    one = 3 * B * H * N * d * 2
                    sets = [
                        tuple(randn_cuda(torch, (B, H, N, d), tdt, gen) for _ in range(3))
                        for _ in range(copies(one, l2_bytes))
                    ]
                    fl = [lambda s=s, c=causal: fg.flash_attention(*s, causal=c) for s in sets]
                    sd = [lambda s=s, c=causal: sdpa(*s, is_causal=c) for s in sets]
                    row = {
                        "dtype": dtype,
                        "d": d,
                        "causal": causal,
                        "N": N,
                        "B": B,
                        "H": H,
                        "copies": len(sets),
                    }
                    with cudnn_only(torch):  # entered once, outside every timed region
                        for runs in (fl, sd):
                            runs[0]()
                        for how, measure in (
                            ("single", timer.single),
                            ("back_to_back", timer.back_to_back),
                        ):
                            res = interleaved({"flashref": fl, "cudnn": sd}, measure)
                            flops = 4 * B * H * N * N * d / (2 if causal else 1)
                            for side, r in res.items():
                                row[f"{how}_{side}_ms"] = r["median"]
                                row[f"{how}_{side}_tflops"] = flops / (r["median"] * 1e-3) / 1e12
                            row[f"{how}_ratio"] = res["cudnn"]["median"] / res["flashref"]["median"]
                    rows.append(row)
                    del sets, fl, sd
    return rows


# -- a training-like step ----------------------------------------------------------------------


def training_times(torch, timer) -> list[dict]:
    import flashref.torch as ft

    sdpa = _sdpa(torch)
    rows = []
    for B, H, N, d in TRAINING_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(N)
        q, k, v, dO = (randn_cuda(torch, (B, H, N, d), torch.bfloat16, gen) for _ in range(4))
        leaves = [x.requires_grad_() for x in (q, k, v)]

        def step(fn, leaves=leaves, dO=dO):
            return torch.autograd.grad(fn(*leaves, is_causal=True), leaves, dO)

        sides = {"flashref": [lambda: step(ft.attention)], "cudnn": [lambda: step(sdpa)]}
        with cudnn_only(torch):
            for runs in sides.values():
                runs[0]()
            res = interleaved(sides, timer.back_to_back)
        rows.append(
            {
                "B": B,
                "H": H,
                "N": N,
                "d": d,
                "dtype": "bfloat16",
                "causal": True,
                "flashref_ms": res["flashref"]["median"],
                "cudnn_ms": res["cudnn"]["median"],
                "ratio": res["flashref"]["median"] / res["cudnn"]["median"],
                "rounds_ms": {s: r["rounds"] for s, r in res.items()},
            }
        )
    return rows


# -- decode in a plain Python loop --------------------------------------------------------------


def decode_times(torch, timer, l2_bytes: int) -> list[dict]:
    sdpa = _sdpa(torch)
    rows = []
    for B in DECODE_BATCHES:
        for Hkv in DECODE_KV_HEADS:
            for Nk in DECODE_CONTEXTS:
                kv = 2 * B * Hkv * Nk * DECODE_D * 2
                row = {"B": B, "Hq": DECODE_HQ, "Hkv": Hkv, "Nk": Nk, "d": DECODE_D, "kv_bytes": kv}
                n = copies(kv, l2_bytes, limit=4)
                if kv * n > MAX_DECODE_BYTES:
                    n = 1
                if kv > MAX_DECODE_BYTES:
                    row["skipped"] = (
                        f"K/V of one call is {kv / 1e9:.0f} GB (> {MAX_DECODE_BYTES / 1e9:.0f})"
                    )
                    rows.append(row)
                    continue
                gen = torch.Generator(device="cuda").manual_seed(B * Nk + Hkv)
                sets = [
                    (
                        randn_cuda(torch, (B, DECODE_HQ, 1, DECODE_D), torch.float16, gen),
                        randn_cuda(torch, (B, Hkv, Nk, DECODE_D), torch.float16, gen),
                        randn_cuda(torch, (B, Hkv, Nk, DECODE_D), torch.float16, gen),
                    )
                    for _ in range(n)
                ]
                fl = [lambda s=s: fg.decode_attention(*s) for s in sets]
                sd = [lambda s=s: sdpa(*s, enable_gqa=True) for s in sets]
                with cudnn_only(torch):
                    note = None
                    try:
                        sd[0]()
                    except Exception as exc:  # cuDNN may refuse a shape: its own choice then
                        note = f"cuDNN refused ({type(exc).__name__}); SDPA's own choice timed"
                        sd = None
                if sd is None:
                    sd = [lambda s=s: sdpa(*s, enable_gqa=True) for s in sets]
                    ctx = contextlib.nullcontext()
                else:
                    ctx = cudnn_only(torch)
                fl[0]()
                with ctx:
                    res = interleaved(
                        {"flashref": fl, "sdpa": sd},
                        lambda runs: timer.back_to_back(runs, DECODE_LOOP),
                    )
                row.update(
                    {
                        "copies": n,
                        "note": note,
                        "flashref_us": res["flashref"]["median"] * 1e3,
                        "sdpa_us": res["sdpa"]["median"] * 1e3,
                        "flashref_gbps": kv / (res["flashref"]["median"] * 1e-3) / 1e9,
                        "sdpa_gbps": kv / (res["sdpa"]["median"] * 1e-3) / 1e9,
                        "ratio": res["sdpa"]["median"] / res["flashref"]["median"],
                    }
                )
                rows.append(row)
                del sets, fl, sd
                torch.cuda.empty_cache()
    return rows


# -- graph capture and torch.compile --------------------------------------------------------------


def _capture(torch, fn) -> dict:
    """Capture ``fn()`` in ``torch.cuda.graph`` (default mode) after one eager warm-up call;
    replay; whether the replay's outputs equal the eager call's."""
    try:
        want = fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = fn()
        g.replay()
        torch.cuda.synchronize()
        want, got = _as_tuple(want), _as_tuple(got)
        equal = all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        return {"captured": True, "replay_equals_eager": equal}
    except Exception as exc:
        return {
            "captured": False,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
        }


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def capture_outcomes(torch) -> dict:
    import flashref.torch as ft

    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, dO = (randn_cuda(torch, (2, 8, 300, 64), torch.float16, gen) for _ in range(4))
    O, lse = fg.flash_attention(q, k, v, causal=True, return_lse=True)
    qd = randn_cuda(torch, (4, 16, 1, 128), torch.bfloat16, gen)
    kd, vd = (randn_cuda(torch, (4, 4, 1000, 128), torch.bfloat16, gen) for _ in range(2))
    lengths = torch.tensor([1000, 1, 517, 64], dtype=torch.int32, device="cuda")
    pages = 4 * 16
    kp, vp = (randn_cuda(torch, (pages, 4, PAGE_SIZE, 128), torch.bfloat16, gen) for _ in range(2))
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(4, 16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def adapter_step():
        return torch.autograd.grad(ft.attention(*leaves, is_causal=True), leaves, dO)

    calls = {
        "flash_attention": lambda: fg.flash_attention(q, k, v, causal=True),
        "flash_attention_backward": lambda: fg.flash_attention_backward(
            q, k, v, O, lse, dO, causal=True
        ),
        "decode_attention (device lengths)": lambda: fg.decode_attention(
            qd, kd, vd, lengths=lengths
        ),
        "paged_decode_attention (device tables)": lambda: fg.paged_decode_attention(
            qd, kp, vp, table, lengths
        ),
        "flashref.torch.attention forward": lambda: ft.attention(q, k, v, is_causal=True),
        "flashref.torch.attention forward + backward": adapter_step,
    }
    return {name: _capture(torch, fn) for name, fn in calls.items()}


def compile_outcomes(torch) -> dict:
    """A small attention block compiled with ``fullgraph=True`` (default and reduce-overhead
    modes), run forward and backward, compared with the eager block."""
    import flashref.torch as ft

    class Block(torch.nn.Module):
        def __init__(self, width=256, heads=4):
            super().__init__()
            self.heads, self.qkv = heads, torch.nn.Linear(width, 3 * width)
            self.out = torch.nn.Linear(width, width)

        def forward(self, x):
            B, N, W = x.shape
            q, k, v = self.qkv(x).view(B, N, 3, self.heads, W // self.heads).unbind(2)
            y = ft.attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            return self.out(y.transpose(1, 2).reshape(B, N, W))

    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    x = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16)
    want = block(x)
    want.float().square().mean().backward()
    grad_want = block.qkv.weight.grad.clone()
    out = {}
    for mode in ("default", "reduce-overhead"):
        block.zero_grad()
        try:
            torch._dynamo.reset()
            fn = torch.compile(block, fullgraph=True, mode=mode)
            for _ in range(3):  # reduce-overhead records its graph after warm-up runs
                block.zero_grad()
                got = fn(x)
                got.float().square().mean().backward()
            torch.cuda.synchronize()
            out[mode] = {
                "compiled": True,
                "max_abs_diff_forward": float((got - want).abs().max()),
                "max_abs_diff_grad": float((block.qkv.weight.grad - grad_want).abs().max()),
            }
        except Exception as exc:
            out[mode] = {
                "compiled": False,
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
            }
    return out


def default_versions(cc) -> tuple[list[int], list[int], list[int]]:
    """The forward, backward and decode versions that ``version=None`` runs on a GPU of
    compute capability ``cc`` at the shapes these benchmarks call (what their files name)."""

    dtypes, dims, masks = ("float16", "bfloat16"), (64, 128), (False, True)
    fwd = {default_forward_version(t, d, c, cc) for t in dtypes for d in dims for c in masks}
    bwd = {default_bwd_version(t, d, True, cc) for t in dtypes for d in dims}
    dec = {default_decode_version(cc, None), default_decode_version(cc, PAGE_SIZE)}
    return sorted(fwd), sorted(bwd), sorted(dec)


def main(argv=None) -> int:
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--out", type=Path, default=Path("results/gpu_calls.json"))
    p.add_argument(
        "--only",
        nargs="*",
        default=None,
        choices=("host", "forward", "training", "decode", "capture", "compile"),
        help="sections to run (default: all)",
    )
    args = p.parse_args(argv)
    cp = _runtime.require_gpu()
    try:
        import torch
    except ImportError:
        from .cli import missing

        return missing(PROG, "torch is not installed: the baselines are torch's SDPA")

    facts = device_facts(cp)
    cc = tuple(int(x) for x in facts["compute_capability"].split("."))
    fwd, bwd, dec = default_versions(cc)
    timer = CallTimer(torch)
    sections = {
        "host": lambda: host_times(torch, timer),
        "forward": lambda: forward_times(torch, timer, facts["l2_bytes"]),
        "training": lambda: training_times(torch, timer),
        "decode": lambda: decode_times(torch, timer, facts["l2_bytes"]),
        "capture": lambda: capture_outcomes(torch),
        "compile": lambda: compile_outcomes(torch),
    }
    wanted = args.only or list(sections)
    record = {
        "meta": {
            **provenance(cp, torch, forward=fwd, backward=bwd, decode=dec),
            "sm_count": facts["sm_count"],
            "l2_bytes": facts["l2_bytes"],
            "defaults": {"forward": fwd, "backward": bwd, "decode": dec},
            "rounds": ROUNDS,
            "repeats": REPEATS,
            "back_to_back": BACK_TO_BACK,
            "host_calls": HOST_CALLS,
            "decode_loop": DECODE_LOOP,
        }
    }
    with ClockSampler() as clocks:
        for name in wanted:
            t0 = time.perf_counter()
            try:
                record[name] = sections[name]()
            except Exception:
                record[name] = {"error": traceback.format_exc(limit=4)}
            print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
            print(json.dumps(record[name], indent=1)[:4000], flush=True)
    record["meta"]["sm_clock"] = clocks.summary()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(record, args.out)
    print(f"wrote {args.out}")
    return 0
