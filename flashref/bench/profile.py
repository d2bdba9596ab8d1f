"""Nsight Compute counters for every kernel version, and the bytes attention really moves.

    python -m flashref.bench profile [--out results/gpu_profile.json]
                                     [--io-out results/gpu_io.json] [--quick]
    python -m flashref.bench profile --backward [--out results/gpu_backward_profile.json]
    python -m flashref.bench profile --decode [--out results/gpu_decode_profile.json]

Runs ``ncu`` (Nsight Compute) over ``python -m flashref.bench.ncu_target`` twice:

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
``flashref.bench.profile_decode`` (which says what is collected and why); with ``--hopper``,
the Hopper versions' wgmma-pipe counters (``flashref.bench.profile_hopper``).

Clocks are not locked (``--clock-control none``): the counters are read at the clocks the
GPU chooses, the same as in the benchmark. Without ``ncu`` on PATH this says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats")
NCU_METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "smsp__inst_executed_op_ldsm.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__grid_size",
    "sm__cycles_elapsed.avg.per_second",
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
# summed over the kernels of one call (a naive or SDPA call launches several)
ADDITIVE = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "lts__t_bytes.sum", "smsp__inst_executed.sum")  # fmt: skip
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
PROFILE_SHAPE = {"B": 8, "H": 16, "N": 4096}
IO_NS = (1024, 2048, 4096, 8192, 16384)
IO_FLASH_VERSIONS = (10, 14)
PAPER_SHAPE = {"B": 64, "H": 16, "N": 1024, "d": 64}


def version_plan(quick: bool = False, only=None) -> list[dict]:
    from ..gpu import VERSIONS

    plan = []
    for d in (64,) if quick else (64, 128):
        for ver in VERSIONS.values():
            if d in ver.head_dims and (not only or ver.number in only):
                plan.append({"impl": f"v{ver.number}", "d": d, "causal": False,
                             "dtype": ver.dtype, **PROFILE_SHAPE})  # fmt: skip
    return plan


def backward_plan(only=None) -> list[dict]:
    """Every backward version (or those in ``only``) at PROFILE_SHAPE, d = 64 and 128, fp16."""
    from ..gpu import BWD_VERSIONS

    return [{"impl": f"bwd{ver.number}", "d": d, "causal": False, "dtype": "float16",
             **PROFILE_SHAPE}
            for d in (64, 128) for ver in BWD_VERSIONS.values()
            if d in ver.head_dims and (not only or ver.number in only)]  # fmt: skip


def available_metrics(wanted, listing: str) -> tuple[list[str], list[str]]:
    """Split ``wanted`` into the names whose base (before the first '.') is a metric in
    ``listing`` (the text ``ncu --query-metrics`` prints, one metric a line) and the rest."""
    known = {ln.split()[0] for ln in listing.splitlines() if re.match(r"[a-z0-9]+__\w+\s", ln)}
    have = [m for m in wanted if m.split(".")[0] in known]
    return have, [m for m in wanted if m not in have]


def io_plan(quick: bool = False) -> list[dict]:
    plan = []
    for N in (4096,) if quick else IO_NS:
        base = {"d": 64, "causal": False, "dtype": "float16", "N": N, "B": 2 * 16384 // N, "H": 16}
        impls = ["naive_cupy", *(f"v{n}" for n in IO_FLASH_VERSIONS), "sdpa_flash"]
        plan += [{"impl": impl, **base} for impl in impls]
    paper = {"causal": False, "dtype": "float16", **PAPER_SHAPE}
    plan += [{"impl": impl, "paper_shape": True, **paper}
             for impl in ("naive_cupy", f"v{IO_FLASH_VERSIONS[-1]}", "sdpa_flash")]  # fmt: skip
    return plan


def _number(text: str):
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return text or None


def run_ncu(plan: list[dict], workdir: Path, metrics=NCU_METRICS, sections=NCU_SECTIONS):
    """Profile ``plan``; return one dict of metrics per kernel, in launch order."""
    plan_path, log = workdir / "plan.json", workdir / "ncu.csv"
    plan_path.write_text(json.dumps(plan))
    cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--csv",
           "--page", "raw", "--print-units", "base", "--log-file", str(log),
           *(a for s in sections for a in ("--section", s)),
           "--metrics", ",".join(metrics),
           sys.executable, "-m", "flashref.bench.ncu_target", str(plan_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise RuntimeError(f"ncu failed ({proc.returncode}):\n{tail}")
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    header, body = rows[0], rows[2:]  # rows[1] holds the units
    return [{h: _number(v) for h, v in zip(header, r, strict=False)} for r in body]


def group_by_case(kernels: list[dict], n_cases: int) -> list[list[dict]]:
    """Split the kernels at the marker kernels; the marker's grid size names the case."""
    groups: list[list[dict]] = [[] for _ in range(n_cases)]
    current = None
    for kern in kernels:
        if "flashref_marker" in str(kern.get("Kernel Name", "")):
            current = int(kern["launch__grid_size"]) - 1
            continue
        if current is None:
            raise RuntimeError("a kernel was profiled before the first marker")
        groups[current].append(kern)
    return groups


def summarise(kernels: list[dict], metrics=NCU_METRICS) -> dict:
    """One case's counters: additive ones summed; the rest from its longest kernel."""
    if not kernels:
        return {"kernels": 0}
    main = max(kernels, key=lambda k: k.get("gpu__time_duration.sum") or 0)
    names = [str(k.get("Kernel Name"))[:80] for k in kernels]
    out = {"kernels": len(kernels), "kernel_names": names}
    for name in metrics:
        if name in ADDITIVE:
            out[name] = sum(float(k.get(name) or 0) for k in kernels)
        elif isinstance(main.get(name), float):
            out[name] = main[name]
    out["stalls_per_issue"] = {
        m.group(1): main[col]
        for col in main
        if (m := STALL.match(col)) and isinstance(main[col], float)
    }
    return out


IO_LABELS = {
    "naive_cupy": "naive CuPy fp16 (matmul, softmax, matmul)",
    "sdpa_flash": "SDPA FLASH (FlashAttention-2)",
}


def io_row(case: dict) -> dict:
    """A case of the IO plan in the schema of results/gpu_io.json (see flashref.io_model)."""
    label = IO_LABELS.get(case["impl"], f"flashref {case['impl']}")
    ms = case.get("gpu__time_duration.sum")
    return {"impl": case["impl"], "label": label, "paper_shape": case.get("paper_shape", False),
            **{k: case[k] for k in ("N", "B", "H", "d", "causal", "dtype", "kernels")},
            "dram_read_bytes": case.get("dram__bytes_read.sum"),
            "dram_write_bytes": case.get("dram__bytes_write.sum"),
            "l2_bytes": case.get("lts__t_bytes.sum"),
            "ms": ms / 1e6 if ms else None}  # fmt: skip


def _meta(cp) -> dict:
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip()
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    props = cp.cuda.runtime.getDeviceProperties(0)
    return {
        "gpu": props["name"].decode(),
        "nvidia_smi": smi,
        "driver": smi.split(",")[-1].strip() if smi else None,
        "torch": torch_version,
        "l2_cache_bytes": int(props["l2CacheSize"]),
        "ncu": version.splitlines()[-1] if version else None,
        "cupy": cp.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "clock_control": "none (clocks as the GPU sets them)",
        "metrics": list(NCU_METRICS),
        "sections": list(NCU_SECTIONS),
    }


def profile(plan: list[dict], metrics=NCU_METRICS, sections=NCU_SECTIONS) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="flashref-ncu-") as tmp:
        kernels = run_ncu(plan, Path(tmp), metrics, sections)
    groups = group_by_case(kernels, len(plan))
    return [{**case, **summarise(g, metrics)} for case, g in zip(plan, groups, strict=True)]


def print_cases(cases: list[dict]) -> None:
    for c in cases:
        dram = (c.get("dram__bytes_read.sum", 0) + c.get("dram__bytes_write.sum", 0)) / 1e6
        l2 = c.get("lts__t_bytes.sum", 0) / 1e9
        tp = c.get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")
        red = c.get("lts__t_sectors_op_red.sum")
        print(f"  {c['impl']:12s} d={c['d']:3d} N={c['N']:5d} B={c['B']:3d}: "
              f"{c['kernels']} kernel(s), DRAM {dram:9.1f} MB, L2 {l2:7.2f} GB, "
              f"tensor pipe {tp if tp is None else round(tp, 1)}%"
              + ("" if red is None else f", L2 red sectors {red / 1e6:.1f} M"))  # fmt: skip


def profile_with_extras(plan: list[dict], wanted, meta: dict, out: Path) -> list[dict]:
    """Profile ``plan`` with the forward's counters and those of ``wanted`` that this ncu
    lists (``ncu --query-metrics``; a failed query lists nothing), once more without them if
    ncu refuses one anyway; write ``{"meta", "rows"}`` to ``out`` with the counters asked for
    and those left out (``meta.metrics``, ``meta.metrics_missing``); return the cases."""
    query = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True)
    extra, missing = available_metrics(wanted, query.stdout if query.returncode == 0 else "")
    metrics = (*NCU_METRICS, *extra)
    try:
        cases = profile(plan, metrics)
    except RuntimeError as err:  # ncu refused a listed name: once more with the forward's set
        print(f"ncu failed with the extra counters, again without them:\n{err}")
        missing, metrics = list(wanted), NCU_METRICS
        cases = profile(plan, metrics)
    meta.update(metrics=list(metrics), metrics_missing=missing)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": cases}, indent=1) + "\n")
    print(f"wrote {out} ({len(cases)} cases); not in this ncu: {missing or 'none'}")
    return cases


def backward_main(args, meta: dict) -> int:
    """``--backward``: every backward version's counters into ``args.out``."""
    out = args.out or Path("results/gpu_backward_profile.json")
    print_cases(profile_with_extras(backward_plan(args.versions), BWD_METRICS, meta, out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashref.bench profile", description=__doc__)
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
        "--source", type=int, metavar="VERSION",
        help="instead: where the warps of VERSION stall, instruction by instruction "
        "(d = 64 and 128), summarised by opcode into --source-out",
    )  # fmt: skip
    parser.add_argument("--source-out", type=Path, default=Path("results/gpu_stall_sampling.json"))
    parser.add_argument(
        "--decode",
        action="store_true",
        help="instead: the decode kernel versions (flashref.bench.profile_decode)",
    )
    parser.add_argument(
        "--hopper",
        action="store_true",
        help="instead: the sm_90a versions, v14 and SDPA cuDNN (flashref.bench.profile_hopper)",
    )
    args = parser.parse_args(argv)
    if args.backward + args.decode + args.hopper > 1:
        parser.error("--backward, --decode and --hopper each profile on their own: give one")
    if args.out is None:
        part = next((f"_{k}" for k in ("backward", "decode", "hopper") if getattr(args, k)), "")
        args.out = Path(f"results/gpu{part}_profile.json")
    if shutil.which("ncu") is None:
        print("ncu (Nsight Compute) is not on PATH: nothing profiled. It ships with the CUDA "
              "toolkit (nsight-compute); put its folder on PATH and run again.")  # fmt: skip
        return 0
    from ..gpu import _require_gpu

    cp = _require_gpu()
    meta = _meta(cp)
    env_note = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in os.environ}
    meta.update(env_note)
    if args.backward:
        return backward_main(args, meta)
    if args.decode:
        from .profile_decode import run_decode

        return run_decode(meta, args.out, args.versions)
    if args.hopper:
        from .profile_hopper import run_hopper

        return run_hopper(meta, args.out, args.versions)
    if args.source is not None:
        plan = [{"impl": f"v{args.source}", "d": d, "causal": False, "dtype": "float16",
                 **PROFILE_SHAPE} for d in (128, 64)]  # fmt: skip
        from .profile_source import SOURCE_SECTIONS, source_profile

        with tempfile.TemporaryDirectory(prefix="flashref-ncu-") as tmp:
            kernels = source_profile(plan, Path(tmp))
        rows = [{**case, **k} for case, k in zip(plan, kernels, strict=True)]
        meta["sections"] = list(SOURCE_SECTIONS)
        args.source_out.parent.mkdir(parents=True, exist_ok=True)
        args.source_out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.source_out}")
        return 0
    for path, plan in ((args.out, version_plan(args.quick, args.versions)),
                       (None if args.skip_io else args.io_out, io_plan(args.quick))):  # fmt: skip
        if path is None:
            continue
        cases = profile(plan)
        rows = cases if path is args.out else [io_row(c) for c in cases]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {path} ({len(cases)} cases)")
        print_cases(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
