"""Where a block of the chunked prefill's kernel spends its time: clock64 stamps per block.

    python -m flashref.bench prefill_stamps [--out results/gpu_prefill_stamps.json]

A chunk's kernel (``flashref/kernels/decode/paged_prefill.cu``) gives each block a few key
tiles, so what a block does before its first product and after its last is a good part of
the kernel. Nsight Compute sums over the kernel; this tool says when, inside each block, the
steps happen. It compiles a copy of the kernel's source with stamps pasted in at fixed
points (``STAMPS``: the producer thread's and the first consumer thread's), each writing the
SM's ``clock64`` (and ``%globaltimer`` at the block's start and end) into a device array,
runs ``flashref.gpu.paged_prefill_attention`` through it (one split, fp16, pages of 128 in a
random order, as the serving benchmark's chunked prefill) at three chunks: one query block on
one key tile (Nq = L = 128), the prompt's first chunk of 512 and its last (L = 4096), for
(H, d) = (32, 128) and (16, 64). It prints, per chunk, the median over blocks of each step's
time from the block's start, and with ``--out`` writes them as JSON with the run's
provenance (the commit and the hash of the kernel's source as it is in the tree, without the
stamps). The stamps change the code a little: the times are a study of the kernel, not its
speed (``results/gpu_serving.json`` has that).

``stamped_source()`` needs no GPU: ``tests/bench/test_prefill_stamps.py`` checks that every
stamp still finds its place in the kernel's source.
"""

from __future__ import annotations

from pathlib import Path

from flashref.bench.provenance import provenance, source_hash
from flashref.bench.serving import paged_pool
from flashref.gpu.decode import prefill
from flashref.gpu.registry import DTYPE_DEFINES, KERNEL_DIR, paste_includes

from ._common import write_result
from .cli import ArgumentParser

# (name, anchor, where, condition): the stamp goes on its own line after the first line of the
# anchor (or before it), which is once in the source; the condition picks the thread and the block's
# first work tile. Each writes clock64 (cycles) into its slot; the block's start and end also
# write %globaltimer (ns) into slots len(STAMPS) and len(STAMPS) + 1.
Q_ASKED = "load_q(Qs, &qmap, bh, Nq, q_block, qbar);\n                }\n                if (!"
# fmt: off
STAMPS = (
    ("start", "empty0 = qbar + 16 + 8 * KV_STAGES;", "after", "threadIdx.x == 0"),
    ("q_asked", Q_ASKED, "after", "threadIdx.x == 0 && n == 0"),  # split 0's Q, before L
    ("length_read", "const int* bt = block_table + (size_t)b_seq * max_pages;", "after",
     "threadIdx.x == 0 && n == 0"),
    ("tile0_asked", "row, full0 + 8 * st);", "after", "threadIdx.x == 0 && n == 0"),
    ("consumer_ready", "setmaxnreg_inc<CONSUMER_REGS>();", "after", "threadIdx.x == 128"),
    ("q_landed", "mbar_wait(qbar, n & 1);", "after", "threadIdx.x == 128 && n == 0"),
    ("tile0_landed", "mbar_wait(full0 + 8 * st, ph);  // tile 0: S_0 alone", "after",
     "threadIdx.x == 128 && n == 0"),
    ("tile0_done", "pack_p(p, s);  // P_0", "after", "threadIdx.x == 128 && n == 0"),
    ("loop_done", "// finish: the row sum over the quad", "before", "threadIdx.x == 128 && n == 0"),
    ("end", "        n++;\n    }\n}", "before", "threadIdx.x == 128 && n == 0"),
)
# fmt: on
SLOTS = 16
CHUNKS = ((128, 128), (512, 512), (512, 4096))  # (Nq, L)
SHAPES = ((32, 128), (16, 64))  # (H, d)
PAGE = 128


def _timer(slot: int) -> str:
    return (
        '{unsigned long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); '
        f"stamps_[blockIdx.x][{slot}] = t_;}}"
    )


def stamped_source(text: str) -> str:
    """The kernel's source (includes pasted in) with the stamps: ``stamps_[block][slot]``,
    slot i for ``STAMPS[i]``, and the block's start and end in %globaltimer at slots
    ``len(STAMPS)`` and ``len(STAMPS) + 1``. Raises ValueError naming a stamp whose anchor is
    not found exactly once."""
    for slot, (name, anchor, where, cond) in enumerate(STAMPS):
        if text.count(anchor) != 1:
            raise ValueError(
                f"stamp {name!r}: its anchor {anchor!r} is in the source "
                f"{text.count(anchor)} times, not once"
            )
        code = f"stamps_[blockIdx.x][{slot}] = clock64();"
        if name == "start":
            code += _timer(len(STAMPS))
        if name == "end":
            code += _timer(len(STAMPS) + 1)
        line = f"if ({cond}) {{{code}}}\n"
        if where == "after":
            i = text.index("\n", text.index(anchor)) + 1  # after the anchor's first line
        else:
            i = text.rindex("\n", 0, text.index(anchor)) + 1
        text = text[:i] + line + text[i:]
    head = 'extern "C" __global__ void __launch_bounds__(NTHREADS, 1)\npaged_prefill('
    if text.count(head) != 1:
        raise ValueError("the kernel's declaration is not where the stamps expect it")
    return text.replace(head, f"__device__ unsigned long long stamps_[1024][{SLOTS}];\n" + head)


def _medians(a, mhz: float) -> dict:
    """Each stamp's median over blocks, in us from the block's start (clock64 at slot 0)."""
    import numpy as np

    out = {}
    for slot, (name, *_) in enumerate(STAMPS):
        if slot == 0:
            continue
        got = a[:, slot] > 0
        out[name] = float(np.median((a[got, slot] - a[got, 0]) / mhz)) if got.any() else None
    return out


def run() -> dict:
    import cupy as cp
    import numpy as np
    import torch

    from flashref.gpu._launch import NVRTC_OPTIONS

    source = paste_includes(KERNEL_DIR / "decode" / "paged_prefill.cu")
    stamped = stamped_source(source)
    modules = {}

    def function(cp_, d, dtype):  # replaces prefill.kernels: the stamped build
        opts = (*NVRTC_OPTIONS, "-arch=sm_90a", f"-DHEAD_DIM={d}", *DTYPE_DEFINES[dtype])
        module = modules[d] = cp.RawModule(code=stamped, options=opts)
        fn = module.get_function(prefill.KERNEL)
        fn.max_dynamic_shared_size_bytes = prefill.smem_bytes(d)
        return fn, module.get_function(prefill.COMBINE)

    prefill.kernels = function  # before the first call: every plan takes the stamped build
    rows = []
    for H, d in SHAPES:
        gen = torch.Generator().manual_seed(H + d)
        q, k, v = (torch.randn((1, H, 4096, d), generator=gen).half().cuda() for _ in range(3))
        kp, table = paged_pool(torch, k, PAGE, torch.Generator().manual_seed(5))
        vp, _ = paged_pool(torch, v, PAGE, torch.Generator().manual_seed(5))
        for Nq, L in CHUNKS:
            x = q[:, :, L - Nq : L].contiguous()
            n = torch.tensor([L], dtype=torch.int32, device="cuda")
            for _ in range(3):  # compile, then warm
                prefill.paged_prefill_attention(x, kp, vp, table, n, splits=1)
            torch.cuda.synchronize()
            ptr = modules[d].get_global("stamps_")
            stamps = cp.ndarray((1024, SLOTS), dtype=cp.uint64, memptr=ptr)
            stamps[...] = 0
            prefill.paged_prefill_attention(x, kp, vp, table, n, splits=1)
            torch.cuda.synchronize()
            a = cp.asnumpy(stamps).astype(np.int64)
            a = a[a[:, len(STAMPS)] > 0]
            t0, t1 = a[:, len(STAMPS)], a[:, len(STAMPS) + 1]
            wall = (t1 - t0) / 1e3  # us
            end = len(STAMPS) - 1  # the last stamp: the end, in cycles
            mhz = float(np.median((a[:, end] - a[:, 0]) / np.maximum(wall, 1e-3)))
            row = {
                "H": H,
                "d": d,
                "Nq": Nq,
                "L": L,
                "blocks": int(len(a)),
                "key_tiles_longest": -(-L // 128),
                "sm_mhz": mhz,
                "block_us_median": float(np.median(wall)),
                "start_spread_us": float((t0.max() - t0.min()) / 1e3),
                "last_end_us": float((t1.max() - t0.min()) / 1e3),
                "stamps_us": _medians(a, mhz),
            }
            rows.append(row)
            s = row["stamps_us"]
            print(
                f"H {H} d {d} Nq {Nq} L {L}: {len(a)} blocks, block {row['block_us_median']:.2f} "
                "us; " + ", ".join(f"{k} {v:.2f}" for k, v in s.items() if v is not None),
                flush=True,
            )
    meta = {
        **provenance(cp, torch),
        "other_sources": {"decode/paged_prefill.cu": source_hash(source)},
        "rule": (
            "median over the blocks of the first work tile of each block: clock64 "
            "stamps from the block's start (its producer thread's first stamp), in us "
            "at the SM clock the block's own stamps and %globaltimer give; one split, "
            "fp16, pages of 128 in a random order, B = 1"
        ),
        "stamps": [name for name, *_ in STAMPS[1:]],
    }
    return {"meta": meta, "rows": rows}


PROG = "python -m flashref.bench prefill_stamps"


def main(argv=None) -> int:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="where the JSON goes (default: print only)")
    args = p.parse_args(argv)
    result = run()
    if args.out:
        write_result(result, args.out)
        print(f"wrote {args.out}")
    return 0
