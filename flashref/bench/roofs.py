"""The GPU's ceilings, measured here rather than typed in: the roofs of the roofline.

    python -m flashref.bench roofs [--out PATH]

- ``mma_sync_tflops``: the peak rate of ``mma.sync.m16n8k16`` (fp16 in, fp32 accumulate), the
  instruction of versions 3 and later; ``mma_sync_clock_ghz`` is the SM clock during it.
- ``wgmma_tflops``: the peak rate of Hopper's ``wgmma.mma_async m64n256k16`` (fp16, fp32
  accumulate), only on compute capability 9.0 (it needs ``sm_90a``).
- ``l2_read_tbps``: L2 read bandwidth, a 16 MiB buffer read again and again with ``ld.cg``.
- ``hbm_copy_tbps``: a 2 GiB device-to-device copy, bytes read + written.
- the hardware facts a chapter quotes: SMs, L2 size, shared memory per block and per SM,
  registers per SM, from CuPy's device attributes.

Each rate is the median of several timed launches (CUDA events) after a warm-up; the kernels
are in ``flashref/kernels/roofs/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..gpu._runtime import require_gpu
from ..gpu.registry import KERNEL_DIR, paste_includes
from ._common import median_ms, write_result
from .cli import ArgumentParser

ROOF_DIR = KERNEL_DIR / "probes"  # the ceilings' microbenchmarks, beside the layout probes
REPEATS = 7


PROG = "python -m flashref.bench roofs"


def _source(name: str) -> str:
    return paste_includes(ROOF_DIR / name)


def time_ms(cp, launch, repeats: int = REPEATS) -> float:
    """The median of ``repeats`` launches timed by CUDA events, after one warm-up launch
    (``flashref.bench._common.median_ms``, the benchmarks' one timing median)."""
    return median_ms(launch, cp.cuda.Event, repeats, warmup=1)


def device_facts(cp) -> dict:
    """What the chapters quote about the GPU, read from the device attributes."""
    dev = cp.cuda.Device()
    attrs = dev.attributes
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    return {
        "gpu": props["name"].decode(),
        "compute_capability": f"{dev.compute_capability[:-1]}.{dev.compute_capability[-1]}",
        "sm_count": int(attrs["MultiProcessorCount"]),
        "l2_bytes": int(attrs["L2CacheSize"]),
        "smem_per_block_optin_bytes": int(attrs["MaxSharedMemoryPerBlockOptin"]),
        "smem_per_sm_bytes": int(attrs["MaxSharedMemoryPerMultiprocessor"]),
        "registers_per_sm": int(attrs["MaxRegistersPerMultiprocessor"]),
        "max_threads_per_sm": int(attrs["MaxThreadsPerMultiProcessor"]),
        "memory_bytes": int(props["totalGlobalMem"]),
        "memory_bus_bits": int(attrs["GlobalMemoryBusWidth"]),
        "max_sm_clock_mhz": int(attrs["ClockRate"]) / 1000,
    }


def mma_sync_roof(cp, sm_count: int) -> dict:
    module = cp.RawModule(code=_source("roof_mma.cu"), options=("--std=c++17",))
    fn = module.get_function("roof_mma")
    rng = np.random.default_rng(0)
    halves = rng.standard_normal(6 * 32 * 2).astype(np.float16)
    regs = cp.asarray(halves.view(np.uint32))  # (192,) two halves per register
    blocks, iters, chains = sm_count * 8, 4096, 8
    out = cp.empty(blocks * 128, dtype=cp.float32)
    clocks = cp.zeros(2, dtype=cp.int64)
    ms = time_ms(cp, lambda: fn((blocks,), (128,), (regs, out, clocks, np.int32(iters))))
    flops = blocks * 4 * iters * chains * 2 * 16 * 8 * 16
    cycles, ns = (int(x) for x in cp.asnumpy(clocks))
    return {"mma_sync_tflops": flops / (ms * 1e-3) / 1e12, "mma_sync_clock_ghz": cycles / ns}


def wgmma_roof(cp, sm_count: int) -> dict:
    if cp.cuda.Device().compute_capability != "90":
        return {"wgmma_tflops": None, "wgmma_note": "wgmma needs compute capability 9.0"}
    module = cp.RawModule(
        code=(ROOF_DIR / "roof_wgmma.cu").read_text(), options=("--std=c++17", "-arch=sm_90a")
    )
    fn = module.get_function("roof_wgmma")
    rng = np.random.default_rng(1)
    tiles = cp.asarray(rng.standard_normal(4096 + 16384).astype(np.float16))
    blocks, iters = sm_count, 2048
    out = cp.empty(blocks * 256, dtype=cp.float32)
    ms = time_ms(cp, lambda: fn((blocks,), (256,), (tiles, out, np.int32(iters))))
    flops = blocks * 2 * iters * 4 * 2 * 64 * 256 * 16
    return {"wgmma_tflops": flops / (ms * 1e-3) / 1e12}


def l2_roof(cp, sm_count: int) -> dict:
    module = cp.RawModule(code=(ROOF_DIR / "roof_l2.cu").read_text(), options=("--std=c++17",))
    fn = module.get_function("roof_l2")
    n_bytes, passes = 16 * 2**20, 64
    buf = cp.random.default_rng(2).integers(0, 2**31, n_bytes // 4, dtype=cp.int32)
    out = cp.empty(4, dtype=cp.uint32)
    n16 = n_bytes // 16
    args = (buf, np.int64(n16), np.int32(passes), out)
    ms = time_ms(cp, lambda: fn((sm_count * 4,), (256,), args))
    return {"l2_read_tbps": n_bytes * passes / (ms * 1e-3) / 1e12, "l2_buffer_bytes": n_bytes}


def hbm_roof(cp) -> dict:
    n = 2 * 1024**3
    a = cp.random.default_rng(3).integers(0, 255, n, dtype=cp.uint8)
    b = cp.empty_like(a)
    kind = cp.cuda.runtime.memcpyDeviceToDevice

    def run():
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, kind, 0)

    ms = time_ms(cp, run)
    return {"hbm_copy_tbps": 2 * n / (ms * 1e-3) / 1e12}


def measure(cp) -> dict:
    """Every ceiling and fact above, in one dict."""
    facts = device_facts(cp)
    sms = facts["sm_count"]
    roofs = {**mma_sync_roof(cp, sms), **wgmma_roof(cp, sms), **l2_roof(cp, sms), **hbm_roof(cp)}
    return {"device": facts, "roofs": roofs, "timing": f"median of {REPEATS} CUDA-event timings"}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = parser.parse_args(argv)

    cp = require_gpu()
    result = measure(cp)
    for k, v in {**result["device"], **result["roofs"]}.items():
        print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(result, args.out)
    return 0
