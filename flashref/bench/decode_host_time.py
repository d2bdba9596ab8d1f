"""Host time of one decode call beside its kernels' time, per version, and SDPA cuDNN's.

    python flashref/bench/decode_host_time.py [--versions 3 5 6] [--calls 200]

For each shape (fp16, Hq = 32, Nq = 1, d = 128) and version: the host time of
``flashref.gpu.decode_attention`` (the public API) and of ``flashref.gpu.decode.launch``
alone (checked CuPy inputs, a plan made beforehand), and the GPU time of the call's kernels;
then the same two times for SDPA cuDNN through torch. Host time: the median over ``--calls``
calls of ``perf_counter`` around one call, the device synchronised after each; kernel time:
``torch.profiler``'s kernel durations per call (``flashref.bench.timing.call_time``). A short call
is bound by the first of these whenever it is longer than the second.
"""

from __future__ import annotations

import math

from flashref.gpu import decode_attention, decode_plan
from flashref.gpu._runtime import require_gpu
from flashref.gpu.decode.launch import launch

from .cli import ArgumentParser, at_least
from .timing.call_time import host_us, kernel_us

SHAPES = ((1, 32, 4096), (1, 8, 4096), (1, 8, 32768), (8, 32, 4096))  # (B, Hkv, Nk)
HQ, D = 32, 128


PROG = "python -m flashref.bench decode_host_time"


def shape_rows(cp, torch, B, Hkv, Nk, versions, calls) -> None:
    """Print one shape's rows: each version, then SDPA cuDNN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    sync = cp.cuda.runtime.deviceSynchronize
    rng = cp.random.default_rng(B + Hkv + Nk)
    q = rng.standard_normal((B, HQ, 1, D), dtype=cp.float32).astype(cp.float16)
    k, v = (
        rng.standard_normal((B, Hkv, Nk, D), dtype=cp.float32).astype(cp.float16) for _ in range(2)
    )
    for version in versions:
        plan = decode_plan(B, HQ, Hkv, 1, Nk, D, sms, version=version)

        def api(version=version):
            return decode_attention(q, k, v, version=version)

        def bare(plan=plan):
            return launch(
                cp,
                q,
                k,
                v,
                None,
                None,
                Hkv=Hkv,
                page_size=Nk,
                max_pages=1,
                causal=False,
                scale=1 / math.sqrt(D),
                plan=plan,
            )

        api(), bare(), sync()  # compiled and warm
        a, b = host_us(api, sync, calls), host_us(bare, sync, calls)
        kern = kernel_us(torch, api)
        print(f"{B:3d}{Hkv:5d}{Nk:7d}  {f'v{version}':10s}{a:9.1f}{b:11.1f}{_us(kern)}")
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, enable_gqa=Hkv != HQ
            )

    cudnn(), torch.cuda.synchronize()
    a = host_us(cudnn, torch.cuda.synchronize, calls)
    kern = kernel_us(torch, cudnn)
    print(f"{B:3d}{Hkv:5d}{Nk:7d}  {'cudnn':10s}{a:9.1f}{'-':>11s}{_us(kern)}")


def _us(x) -> str:
    return f"{x:12.1f}" if x is not None else f"{'-':>12s}"  # None: the profiler saw no kernel


def main(argv=None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, nargs="+", default=[3, 5, 6])
    parser.add_argument("--calls", type=at_least(1), default=200)
    args = parser.parse_args(argv)

    import torch

    cp = require_gpu()
    print(
        f"{'B':>3s}{'Hkv':>5s}{'Nk':>7s}  {'impl':10s}{'API us':>9s}{'launch us':>11s}"
        f"{'kernels us':>12s}"
    )
    for B, Hkv, Nk in SHAPES:
        shape_rows(cp, torch, B, Hkv, Nk, args.versions, args.calls)
    return 0
