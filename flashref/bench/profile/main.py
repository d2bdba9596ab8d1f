"""Nsight Compute counters for every kernel version, and the bytes attention really moves.

    python -m flashref.bench profile [--out results/gpu_profile.json]
                                     [--io-out results/gpu_io.json] [--quick]
    python -m flashref.bench profile --backward [--out results/gpu_backward_profile.json]
    python -m flashref.bench profile --decode [--out results/gpu_decode_profile.json]

Runs ``ncu`` (Nsight Compute) over ``python -m flashref.bench.profile.ncu_target`` twice:

1. **Versions**: every flashref version once at a fixed shape, (B, H, N) = (8, 16, 4096),
   d = 64 and 128, fp16 (fp32 for versions 1-2), not causal. Written to ``--out``: DRAM bytes
   read and written, L2 bytes, tensor-pipe activity, shared-memory bank conflicts, ldmatrix
   and mma instruction counts, issued instructions and issue-slot use, achieved occupancy,
   registers, shared memory per block, the warp stall reasons, and the SM clock during the
   kernel (``sm__cycles_elapsed.avg.per_second``).
2. **IO**: naive CuPy (which writes and reads the score matrix), the fastest flashref versions
   and SDPA's FLASH backend at N = 1k to 16k (d = 64, H = 16, B = 2 * 16384 / N), and the
   shape of the FlashAttention paper's Figure 2 (N = 1024, d = 64, H = 16, B = 64). Written
   to ``--io-out``: DRAM and L2 bytes and kernel time summed over all kernels of one call.

3. **Backward** (``--backward``, instead of 1 and 2): every backward version once at the same
   shape, d = 64 and 128, fp16, not causal, into ``--out`` (``results/gpu_backward_profile.json``
   by default): the counters of 1 plus those that say what dQ's atomics cost (reduction
   sectors at L2, reduction requests and instructions at L1) and how many warps each scheduler
   holds and finds eligible. ``ncu --query-metrics`` is asked first; a name it does not list
   is left out of the run and named under ``meta.metrics_missing``.

With ``--decode``, instead: each decode kernel version at the shapes of
``flashref.bench.profile.decode`` (which says what is collected and why); with ``--hopper``,
the Hopper versions' wgmma-pipe counters (``flashref.bench.profile.hopper``).

Clocks are not locked (``--clock-control none``): the counters are read at the clocks the
GPU chooses, the same as in the benchmark. Without ``ncu`` on PATH this says so and exits 0.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ...gpu import BWD_VERSIONS, VERSIONS, _runtime
from ...gpu.decode.versions import VERSIONS as DECODE_VERSIONS
from .. import cli
from .._common import write_result
from ..cli import ArgumentParser
from .ncu import (
    PROFILE_SHAPE,
    print_cases,
    profile,
    profile_with_extras,
    run_meta,
)

# the backward's extra counters: dQ's float32 reductions (red.global) at L2 and L1, and the
# warps per scheduler (active, eligible); filtered by what this ncu lists (available_metrics)
BWD_METRICS = (
    # the tensor pipe with wgmma (HGMMA) counted, and wgmma instructions: backward version 8
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "lts__t_sectors_op_red.sum",
    "lts__t_requests_op_red.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum",
    "smsp__inst_executed_op_global_red.sum",
    "smsp__warps_active.avg.per_cycle_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
)


IO_NS = (1024, 2048, 4096, 8192, 16384)


IO_FLASH_VERSIONS = (10, 14)


PAPER_SHAPE = {"B": 64, "H": 16, "N": 1024, "d": 64}


PROG = "python -m flashref.bench profile"


def version_plan(quick: bool = False, only=None) -> list[dict]:
    plan = []
    for d in (64,) if quick else (64, 128):
        for ver in VERSIONS.values():
            if d in ver.head_dims and (not only or ver.number in only):
                plan.append(
                    {
                        "impl": f"v{ver.number}",
                        "d": d,
                        "causal": False,
                        "dtype": ver.dtype,
                        **PROFILE_SHAPE,
                    }
                )
    return plan


def backward_plan(only=None) -> list[dict]:
    """Every backward version (or those in ``only``) at PROFILE_SHAPE, d = 64 and 128, fp16."""

    return [
        {"impl": f"bwd{ver.number}", "d": d, "causal": False, "dtype": "float16", **PROFILE_SHAPE}
        for d in (64, 128)
        for ver in BWD_VERSIONS.values()
        if d in ver.head_dims and (not only or ver.number in only)
    ]


def io_plan(quick: bool = False) -> list[dict]:
    plan = []
    for N in (4096,) if quick else IO_NS:
        base = {"d": 64, "causal": False, "dtype": "float16", "N": N, "B": 2 * 16384 // N, "H": 16}
        impls = ["naive_cupy", *(f"v{n}" for n in IO_FLASH_VERSIONS), "sdpa_flash"]
        plan += [{"impl": impl, **base} for impl in impls]
    paper = {"causal": False, "dtype": "float16", **PAPER_SHAPE}
    plan += [
        {"impl": impl, "paper_shape": True, **paper}
        for impl in ("naive_cupy", f"v{IO_FLASH_VERSIONS[-1]}", "sdpa_flash")
    ]
    return plan


IO_LABELS = {
    "naive_cupy": "naive CuPy fp16 (matmul, softmax, matmul)",
    "sdpa_flash": "SDPA FLASH (FlashAttention-2)",
}


def io_row(case: dict) -> dict:
    """A case of the IO plan in the schema of results/gpu_io.json (see flashref.io_model)."""
    label = IO_LABELS.get(case["impl"], f"flashref {case['impl']}")
    ms = case.get("gpu__time_duration.sum")
    return {
        "impl": case["impl"],
        "label": label,
        "paper_shape": case.get("paper_shape", False),
        **{k: case[k] for k in ("N", "B", "H", "d", "causal", "dtype", "kernels")},
        "dram_read_bytes": case.get("dram__bytes_read.sum"),
        "dram_write_bytes": case.get("dram__bytes_write.sum"),
        "l2_bytes": case.get("lts__t_bytes.sum"),
        "ms": ms / 1e6 if ms else None,
    }


def measured_families(args) -> dict:
    """The kernel families (and versions) a profile run measures, for its provenance: the
    backward's, the decode's or the forward's; ``--source N`` measures version N alone. The
    default run profiles every forward version (and, for the IO table, versions
    ``IO_FLASH_VERSIONS``); ``--hopper`` the sm_90a forward versions beside v14."""
    family = "backward" if args.backward else "decode" if args.decode else "forward"
    if args.source is not None:
        return {family: [args.source]}
    if not args.versions:
        return {family: "all"}
    extra = set()
    if args.hopper:
        extra = {14}
    elif family == "forward" and not args.skip_io:
        extra = set(IO_FLASH_VERSIONS)
    return {family: sorted(set(args.versions) | extra)}


def profiled_versions(args) -> list[int]:
    """The versions a run of these flags can profile: the backward's (``--backward``), the
    decode kernels' (``--decode``), the sm_90a forward versions and v14 (``--hopper``), or
    every forward version."""
    if args.backward:
        return sorted(BWD_VERSIONS)
    if args.decode:
        return sorted(DECODE_VERSIONS)
    if args.hopper:
        return sorted(n for n, v in VERSIONS.items() if v.arch or n == 14)
    return sorted(VERSIONS)


def backward_main(args, meta: dict) -> int:
    """``--backward``: every backward version's counters into ``args.out``."""
    out = args.out or Path("results/gpu_backward_profile.json")
    print_cases(profile_with_extras(backward_plan(args.versions), BWD_METRICS, meta, out))
    return 0


def build_parser() -> ArgumentParser:
    """The command line of ``python -m flashref.bench profile``."""
    parser = ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        help="default results/gpu_profile.json, or results/gpu_backward_profile.json with "
        "--backward, results/gpu_decode_profile.json with --decode, "
        "results/gpu_hopper_profile.json with --hopper",
    )
    parser.add_argument(
        "--backward",
        action="store_true",
        help="instead: every backward version (--versions: only these)",
    )
    parser.add_argument("--io-out", type=Path, default=Path("results/gpu_io.json"))
    parser.add_argument("--quick", action="store_true", help="d = 64 and N = 4096 only")
    parser.add_argument("--skip-io", action="store_true", help="only the versions' profile")
    parser.add_argument("--versions", type=int, nargs="+", help="profile only these versions")
    parser.add_argument(
        "--source",
        type=int,
        metavar="VERSION",
        help="instead: where the warps of VERSION stall, instruction by instruction "
        "(d = 64 and 128), summarised by opcode into --source-out; with --backward, "
        "backward version VERSION's main kernel",
    )
    parser.add_argument("--source-out", type=Path, default=Path("results/gpu_stall_sampling.json"))
    parser.add_argument(
        "--decode",
        action="store_true",
        help="instead: the decode kernel versions (flashref.bench.profile.decode)",
    )
    parser.add_argument(
        "--hopper",
        action="store_true",
        help="instead: the sm_90a versions, v14 and SDPA cuDNN (flashref.bench.profile.hopper)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backward + args.decode + args.hopper > 1:
        parser.error("--backward, --decode and --hopper each profile on their own: give one")
    if args.versions:  # each a version this run can profile: else it would profile nothing
        known = profiled_versions(args)
        unknown = sorted(set(args.versions) - set(known))
        if unknown:
            parser.error(
                f"--versions {' '.join(map(str, unknown))}: not among the versions this run "
                f"profiles ({', '.join(map(str, known))})"
            )
    if args.source is not None:  # a version of its family, at the head dims it takes
        from ...gpu import BWD_VERSIONS, VERSIONS

        family = BWD_VERSIONS if args.backward else VERSIONS
        if args.source not in family:
            parser.error(f"--source must be among {sorted(family)}, got {args.source}")
        dims = [d for d in (128, 64) if d in family[args.source].head_dims]
    if args.out is None:
        part = next((f"_{k}" for k in ("backward", "decode", "hopper") if getattr(args, k)), "")
        args.out = Path(f"results/gpu{part}_profile.json")
    if shutil.which("ncu") is None:
        what = "ncu (Nsight Compute) is not on PATH: nothing profiled; it ships with the CUDA"
        return cli.missing(PROG, f"{what} toolkit (nsight-compute): put its folder on PATH")

    cp = _runtime.require_gpu()  # looked up at the call: tests stand a GPU in for it
    meta = run_meta(cp, **measured_families(args))
    env_note = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in os.environ}
    meta.update(env_note)
    if args.source is not None:  # with --backward: backward version N's main kernel
        impl = f"bwd{args.source}" if args.backward else f"v{args.source}"
        plan = [
            {"impl": impl, "d": d, "causal": False, "dtype": "float16", **PROFILE_SHAPE}
            for d in dims
        ]
        from .source import SOURCE_SECTIONS, source_profile

        kernel = f"regex:^flash_bwd{args.source}$" if args.backward else "regex:^flash_v"
        with tempfile.TemporaryDirectory(prefix="flashref-ncu-") as tmp:
            kernels = source_profile(plan, Path(tmp), kernel)
        rows = [{**case, **k} for case, k in zip(plan, kernels, strict=True)]
        meta["sections"] = list(SOURCE_SECTIONS)
        args.source_out.parent.mkdir(parents=True, exist_ok=True)
        write_result({"meta": meta, "rows": rows}, args.source_out)
        print(f"wrote {args.source_out}")
        return 0
    if args.backward:
        return backward_main(args, meta)
    if args.decode:
        from .decode import run_decode

        return run_decode(meta, args.out, args.versions)
    if args.hopper:
        from .hopper import run_hopper

        return run_hopper(meta, args.out, args.versions)
    for path, plan in (
        (args.out, version_plan(args.quick, args.versions)),
        (None if args.skip_io else args.io_out, io_plan(args.quick)),
    ):
        if path is None:
            continue
        cases = profile(plan)
        rows = cases if path is args.out else [io_row(c) for c in cases]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_result({"meta": meta, "rows": rows}, path)
        print(f"wrote {path} ({len(cases)} cases)")
        print_cases(cases)
    return 0
