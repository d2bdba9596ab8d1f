"""Nsight Compute counters of the decode kernel versions: why one streams K/V faster.

    python -m flashref.bench profile --decode [--out results/gpu_decode_profile.json]
                                              [--versions 1 2 3]

Every decode version (``flashref.gpu.decode.VERSIONS``, or ``--versions``) at the shapes of
``DECODE_SHAPES``: one new query per sequence, Hq = 32, d = 128, fp16, Nk = 32k keys, where
the benchmark (``python -m flashref.bench decode``) found the gaps:

* B = 1, Hkv = 8: 8 (sequence, K/V head) pairs, so the keys are cut into about 32 splits
  and a combine kernel merges them; each block streams only 1024 keys.
* B = 8, Hkv = 32: 256 blocks of one split each, every block streaming all 32k keys.
* the same through a block table (pages of ``flashref.bench.decode.PAGE_SIZE`` keys).
* B = 32, Hkv = 32, Nk = 4k: 1024 blocks of one split each, 4096 keys each, the shape
  where the graph-replayed benchmark has the Hopper versions furthest below cuDNN.

At every contiguous shape SDPA cuDNN's kernels are profiled too (``decode_sdpa_cudnn``), so
the counters of the two stand side by side.

For each case the counters of every kernel of the call (the split kernel, and the combine
kernel where there are splits): DRAM bytes read and DRAM throughput (share of peak), the
duration, achieved occupancy and active warps, issue activity, the L2 hit rate, and the warp
stall reasons (cycles stalled per issued instruction, ``WarpStateStats``), from which the
top ones are printed. A kernel that keeps more bytes in flight shows a higher DRAM
throughput for the same bytes read, and fewer cycles stalled at a barrier (``barrier``)
or waiting on its copies (``long_scoreboard``, ``lg_throttle``).
"""

from __future__ import annotations

from pathlib import Path

from ...gpu.decode import VERSIONS
from .._common import write_result
from .ncu import STALL, group_by_case, run_ncu, summarise

DECODE_SECTIONS = ("LaunchStats", "Occupancy", "WarpStateStats")
DECODE_METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.per_cycle_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "lts__t_sector_hit_rate.pct",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__grid_size",
    "launch__occupancy_limit_shared_mem",
    "sm__cycles_elapsed.avg.per_second",
)
# (B, Hkv, Nk, paged) with Hq = 32, d = 128, fp16, one query per sequence
DECODE_SHAPES = (
    (1, 8, 32768, False),
    (8, 32, 32768, False),
    (8, 32, 32768, True),
    (32, 32, 4096, False),
)
CUDNN = "decode_sdpa_cudnn"  # the baseline's case at each contiguous shape
TOP_STALLS = 4


def decode_plan(versions=None, cudnn: bool = True) -> list[dict]:
    """One ncu_target case per (version, shape), then SDPA cuDNN's at each contiguous shape
    (``version`` None) unless ``cudnn`` is False."""

    chosen = sorted(VERSIONS) if not versions else [v for v in VERSIONS if v in versions]
    impls = [(f"decode_v{v}", v) for v in chosen] + ([(CUDNN, None)] if cudnn else [])
    return [
        {
            "impl": impl,
            "version": v,
            "B": B,
            "Hq": 32,
            "Hkv": Hkv,
            "Nk": Nk,
            "d": 128,
            "dtype": "float16",
            "paged": paged,
            "causal": False,
        }
        for B, Hkv, Nk, paged in DECODE_SHAPES
        for impl, v in impls
        if not (paged and v is None)
    ]


def kernel_rows(kernels: list[dict]) -> list[dict]:
    """Each kernel of one call: its name, duration (us), DRAM read, throughput and top stalls."""
    rows = []
    for k in kernels:
        stalls = {m.group(1): k[c] for c in k if (m := STALL.match(c)) and isinstance(k[c], float)}
        top = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS])
        rows.append(
            {
                "kernel": str(k.get("Kernel Name"))[:60],
                "us": (k.get("gpu__time_duration.sum") or 0) / 1e3,
                "dram_read_mb": (k.get("dram__bytes_read.sum") or 0) / 1e6,
                "dram_pct": k.get("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
                "warps_active_pct": k.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                "issue_active_pct": k.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                "l2_hit_pct": k.get("lts__t_sector_hit_rate.pct"),
                "top_stalls": top,
            }
        )
    return rows


def print_rows(cases: list[dict]) -> None:
    print(
        "# decode versions under ncu: per kernel, us, DRAM MB read, DRAM % of peak, "
        "warps active %, issue active %, L2 hit %, top stalls (cycles per issue)"
    )
    for c in cases:
        where = f"B={c['B']} Hkv={c['Hkv']} Nk={c['Nk']}{' paged' if c['paged'] else ''}"
        for k in c.get("per_kernel", []):
            stalls = ", ".join(f"{n} {v:.1f}" for n, v in k["top_stalls"].items())

            def f(x):
                return "-" if x is None else f"{x:.1f}"

            who = "cuDNN" if c["version"] is None else f"v{c['version']}"
            print(
                f"  {who:5s} {where:24s} {k['kernel'][:22]:22s} {k['us']:8.1f} us "
                f"{k['dram_read_mb']:8.1f} MB dram {f(k['dram_pct'])}% warps "
                f"{f(k['warps_active_pct'])}% issue {f(k['issue_active_pct'])}% L2 hit "
                f"{f(k['l2_hit_pct'])}%: {stalls}"
            )


def run_decode(meta: dict, out: Path, versions=None) -> int:
    """Profile the decode plan, write ``out``, print one line per kernel."""
    import tempfile

    plan = decode_plan(versions)
    with tempfile.TemporaryDirectory(prefix="flashref-ncu-") as tmp:
        kernels = run_ncu(plan, Path(tmp), DECODE_METRICS, DECODE_SECTIONS)
    groups = group_by_case(kernels, len(plan))
    cases = [
        {**case, **summarise(g, DECODE_METRICS), "per_kernel": kernel_rows(g)}
        for case, g in zip(plan, groups, strict=True)
    ]
    meta = {
        **meta,
        "metrics": list(DECODE_METRICS),
        "sections": list(DECODE_SECTIONS),
        "shapes": "Hq = 32, d = 128, fp16, Nq = 1; (B, Hkv, Nk, paged) as in rows",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result({"meta": meta, "rows": cases}, out)
    print(f"wrote {out} ({len(cases)} cases)")
    print_rows(cases)
    return 0
