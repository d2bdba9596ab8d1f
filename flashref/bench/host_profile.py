"""Where the host time of a public call goes: ``python -m flashref.bench host_profile``.

For each public call at ``bench calls``' tiny shapes (the kernels take microseconds, so the
GPU waits for the host): the host's microseconds per call over ``--calls`` calls without a
sync (``CallTimer.host``, as ``bench calls`` times them), SDPA's equivalent beside it, and
``cProfile``'s functions with the most own time over those calls. For the adapter's step
(``flashref.torch.attention`` forward + ``torch.autograd.grad``) also ``torch.profiler``'s CPU
ranges, which show the autograd engine's work around each side's backward. Then what a loop
of calls adds (``loops``): the decode loop of ``bench calls`` with one input set and four,
with its kernels' GPU time, and the adapter's step with the garbage collector off and with
the backward run on the calling thread (``torch.autograd.set_multithreading_enabled``). Last, the
pieces every call is built from, each timed alone: one kernel launch through CuPy and through
the driver's ``cuLaunchKernel`` (``flashref.gpu._driver.Launcher``), one ``torch.empty``, one
stream query. A study of the host path, not a speed claim: ``bench calls`` makes those.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import types
from pathlib import Path

import flashref.gpu as fg

from ..gpu import _driver, _runtime
from ._common import write_result
from .calls import default_versions
from .cli import ArgumentParser, at_least
from .provenance import provenance
from .roofs import device_facts
from .timing.call_time import kernel_us

PROG = "python -m flashref.bench host_profile"
TOP = 18  # functions listed per call


def _host_us(torch, run, calls: int, tries: int = 3) -> float:
    """The least of ``tries`` host times per call (``CallTimer.host``, as ``bench calls``)."""
    from .calls import CallTimer

    timer = CallTimer(torch)
    return min(timer.host(run, calls) for _ in range(tries))


def _profile(run, calls: int) -> list[dict]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        run()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_, ncalls, tt, ct, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({name})",
                "calls_per_call": ncalls / calls,
                "own_us": tt / calls * 1e6,
                "cum_us": ct / calls * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:TOP]


def _torch_ranges(torch, run, calls: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    rows = [
        {
            "name": e.key,
            "count_per_call": e.count / calls,
            "self_cpu_us": e.self_cpu_time_total / calls,
            "cpu_us": e.cpu_time_total / calls,
        }
        for e in prof.key_averages()
    ]
    rows.sort(key=lambda r: -r["cpu_us"])
    return rows[:30]


def calls(torch, n: int) -> dict:
    import flashref.torch as ft

    from .calls import DECODE_HOST, host_inputs, randn_cuda

    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen, q, k, v, dO, O, lse, qg, kg, vg, O_s = host_inputs(torch)
    O_a = ft.attention(qg, kg, vg)
    Bd, Hq, Hkv, Nk, dd = DECODE_HOST
    decode = {}
    for Bx in (1, Bd):
        qd = randn_cuda(torch, (Bx, Hq, 1, dd), torch.float16, gen)
        kd, vd = (randn_cuda(torch, (Bx, Hkv, Nk, dd), torch.float16, gen) for _ in range(2))
        decode[Bx] = (qd, kd, vd)

    def grads(out, retain=False):
        return torch.autograd.grad(out, (qg, kg, vg), dO, retain_graph=retain)

    pairs = {
        "forward": (lambda: fg.flash_attention(q, k, v), lambda: sdpa(q, k, v)),
        "backward": (
            lambda: fg.flash_attention_backward(q, k, v, O, lse, dO),
            lambda: grads(O_s, True),
        ),
        "adapter forward + backward": (
            lambda: grads(ft.attention(qg, kg, vg)),
            lambda: grads(sdpa(qg, kg, vg)),
        ),
        "adapter forward, grad enabled": (
            lambda: ft.attention(qg, kg, vg),
            lambda: sdpa(qg, kg, vg),
        ),
        "adapter backward, retained graph": (lambda: grads(O_a, True), lambda: grads(O_s, True)),
        **{
            f"decode B {Bx}": (
                lambda t=t: fg.decode_attention(*t),
                lambda t=t: sdpa(*t, enable_gqa=True),
            )
            for Bx, t in decode.items()
        },
    }
    out = {}
    for name, (mine, theirs) in pairs.items():
        mine(), theirs()  # compiled, allocators warm
        row = {
            "flashref_us": _host_us(torch, mine, n),
            "sdpa_us": _host_us(torch, theirs, n),
            "flashref_functions": _profile(mine, n),
        }
        out[name] = row
        print(
            f"{name:34s} flashref {row['flashref_us']:7.1f} us   SDPA {row['sdpa_us']:7.1f} us",
            flush=True,
        )
    # torch.profiler last: once it has run, torch's own operators cost more host time in the
    # process (the rows timed after it would hold that for SDPA's side)
    mine, theirs = pairs["adapter forward + backward"]
    out["adapter forward + backward"]["flashref_ranges"] = _torch_ranges(torch, mine, n)
    out["adapter forward + backward"]["sdpa_ranges"] = _torch_ranges(torch, theirs, n)
    return out


def pieces(torch, n: int) -> dict:
    """One launch through CuPy and through the driver, one torch.empty, one stream query."""
    import cupy as cp
    import numpy as np

    src = (
        'extern "C" __global__ void nothing(const void* a, const void* b, const void* c,'
        " void* o, void* l, int n, int m, float s, int c2) {}"
    )
    fn = cp.RawModule(code=src).get_function("nothing")
    stream = types.SimpleNamespace(ptr=torch.cuda.current_stream().cuda_stream)  # CuPy's stream=
    ints = (np.int32(1), np.int32(2), np.float32(0.5), np.int32(0))
    x = torch.empty(1024, device="cuda")
    p = x.data_ptr()
    out = {}

    def cupy_launch():
        fn((1,), (32,), (p, p, p, p, p, *ints), stream=stream)

    launcher = _driver.Launcher(fn, "pppppiifi")

    def driver_launch():
        launcher((1, 1, 1), (32, 1, 1), 0, stream.ptr, (p, p, p, p, p, 1, 2, 0.5, 0))

    for name, run in (
        ("CuPy RawKernel launch, 9 arguments", cupy_launch),
        ("cuLaunchKernel through Launcher, 9 arguments", driver_launch),
        (
            "torch.empty((1, 8, 128, 64), float16)",
            lambda: torch.empty((1, 8, 128, 64), dtype=torch.float16, device="cuda"),
        ),
        ("torch current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
    ):
        run()
        out[name] = _host_us(torch, run, n)
        print(f"{name:46s} {out[name]:7.2f} us", flush=True)
    return out


def loops(torch, n: int = 50) -> dict:
    """What a loop of calls costs beyond one call's host time: the decode loop of ``bench
    calls`` (B 1, Hq 32, Hkv 8, Nk 4096, d 128) with one input set and with four rotated,
    each call's kernels' GPU time in that loop (``torch.profiler``), and the adapter's
    training-like step with Python's garbage collector on and off, and with the autograd
    engine running the backward on the calling thread."""
    import gc

    import flashref.torch as ft

    from .calls import HOST_SHAPE, CallTimer, cudnn_only, randn_cuda

    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator(device="cuda").manual_seed(1)
    sets = [
        (
            randn_cuda(torch, (1, 32, 1, 128), torch.float16, gen),
            *(randn_cuda(torch, (1, 8, 4096, 128), torch.float16, gen) for _ in range(2)),
        )
        for _ in range(4)
    ]
    timer, out = CallTimer(torch), {}
    sides = (
        ("flashref", fg.decode_attention, contextlib.nullcontext),
        ("sdpa cuDNN", lambda q, k, v: sdpa(q, k, v, enable_gqa=True), lambda: cudnn_only(torch)),
    )
    for name, fn, ctx in sides:
        with ctx():
            for copies in (1, 4):
                runs = [lambda s=s, fn=fn: fn(*s) for s in sets[:copies]]
                runs[0]()
                loop = min(timer.back_to_back(runs, n) for _ in range(5)) * 1e3
                out[f"decode loop, {name}, {copies} input sets, us per call"] = loop
            out[f"decode loop, {name}, kernels' GPU us per call"] = kernel_us(torch, runs[0], 20)
    B, H, N, d = HOST_SHAPE
    q, k, v, dO = (randn_cuda(torch, (B, H, N, d), torch.float16, gen) for _ in range(4))
    leaves = [x.requires_grad_() for x in (q, k, v)]
    for name, fn in (("flashref", ft.attention), ("sdpa", sdpa)):

        def step(fn=fn):
            return torch.autograd.grad(fn(*leaves), leaves, dO)

        step()
        for collect in (True, False):
            (gc.enable if collect else gc.disable)()
            key = f"adapter step, {name}, gc {'on' if collect else 'off'}, host us"
            out[key] = _host_us(torch, step, 200)
        gc.enable()
        # the backward on the calling thread instead of the autograd engine's device thread
        with torch.autograd.set_multithreading_enabled(False):
            step()
            key = f"adapter step, {name}, backward on the calling thread, host us"
            out[key] = _host_us(torch, step, 200)
    for key, value in out.items():
        print(f"{key:58s} {value:8.1f}", flush=True)
    return out


def main(argv=None) -> int:
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--calls", type=at_least(1), default=200)
    p.add_argument("--out", type=Path, default=Path("results/gpu_host_profile.json"))
    args = p.parse_args(argv)

    cp = _runtime.require_gpu()
    import torch

    cc = tuple(int(x) for x in device_facts(cp)["compute_capability"].split("."))
    fwd, bwd, dec = default_versions(cc)
    meta = {
        **provenance(cp, torch, forward=fwd, backward=bwd, decode=dec),
        "calls": args.calls,
        "defaults": {"forward": fwd, "backward": bwd, "decode": dec},
    }
    # loops first: once torch.profiler has run in a process, torch's own operators (SDPA's)
    # cost more host time there (seen: SDPA's step 135 us before, 211 us after)
    record = {
        "meta": meta,
        "pieces": pieces(torch, args.calls * 5),
        "loops": loops(torch),
        "calls": calls(torch, args.calls),
    }
    for name, row in record["calls"].items():
        buf = io.StringIO()
        us = f"flashref {row['flashref_us']:.1f} us, SDPA {row['sdpa_us']:.1f} us"
        print(f"\n{name}: {us}", file=buf)
        for f in row["flashref_functions"]:
            print(
                f"  {f['own_us']:7.2f} own {f['cum_us']:8.2f} cum {f['calls_per_call']:5.1f}x  "
                f"{f['function']}",
                file=buf,
            )
        for side in ("flashref_ranges", "sdpa_ranges"):
            for r in row.get(side, [])[:14]:
                print(
                    f"  [{side[:5]}] {r['cpu_us']:8.1f} cpu {r['self_cpu_us']:8.1f} self "
                    f"{r['count_per_call']:4.1f}x {r['name']}",
                    file=buf,
                )
        print(buf.getvalue(), end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(record, args.out)
    print(f"wrote {args.out}")
    return 0
