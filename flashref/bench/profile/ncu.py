"""Running Nsight Compute over ``flashref.bench.profile.ncu_target`` and reading its counters:
what every ``python -m flashref.bench profile`` mode shares (``main``, ``decode``, ``hopper``,
``source``)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .._common import write_result
from ..provenance import provenance

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


# summed over the kernels of one call (a naive or SDPA call launches several)
ADDITIVE = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "smsp__inst_executed.sum",
)


STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


PROFILE_SHAPE = {"B": 8, "H": 16, "N": 4096}


def available_metrics(wanted, listing: str) -> tuple[list[str], list[str]]:
    """Split ``wanted`` into the names whose base (before the first '.') is a metric in
    ``listing`` (the text ``ncu --query-metrics`` prints, one metric a line) and the rest."""
    known = {ln.split()[0] for ln in listing.splitlines() if re.match(r"[a-z0-9]+__\w+\s", ln)}
    have = [m for m in wanted if m.split(".")[0] in known]
    return have, [m for m in wanted if m not in have]


def ncu_number(text: str):
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return text or None


def run_ncu(plan: list[dict], workdir: Path, metrics=NCU_METRICS, sections=NCU_SECTIONS):
    """Profile ``plan``; return one dict of metrics per kernel, in launch order."""
    plan_path, log = workdir / "plan.json", workdir / "ncu.csv"
    plan_path.write_text(json.dumps(plan))
    cmd = [
        "ncu",
        "--profile-from-start",
        "off",
        "--clock-control",
        "none",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--log-file",
        str(log),
        *(a for s in sections for a in ("--section", s)),
        "--metrics",
        ",".join(metrics),
        sys.executable,
        "-m",
        "flashref.bench.profile.ncu_target",
        str(plan_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise RuntimeError(f"ncu failed ({proc.returncode}):\n{tail}")
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    header, body = rows[0], rows[2:]  # rows[1] holds the units
    return [{h: ncu_number(v) for h, v in zip(header, r, strict=False)} for r in body]


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


def run_meta(cp, forward=(), backward=(), decode=()) -> dict:
    """Where the profile ran (GPU, driver, ncu, versions, date) and the commit and source hashes
    of the kernel versions it measured (``provenance.tree``: ``"all"`` for a whole family), so
    that editing a kernel the run did not measure leaves its file valid."""
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip()
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        import torch
    except ImportError:
        torch = None
    props = cp.cuda.runtime.getDeviceProperties(0)
    return provenance(cp, torch, forward=forward, backward=backward, decode=decode) | {
        "nvidia_smi": smi,
        "l2_cache_bytes": int(props["l2CacheSize"]),
        "ncu": version.splitlines()[-1] if version else None,
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
        print(
            f"  {c['impl']:12s} d={c['d']:3d} N={c['N']:5d} B={c['B']:3d}: "
            f"{c['kernels']} kernel(s), DRAM {dram:9.1f} MB, L2 {l2:7.2f} GB, "
            f"tensor pipe {tp if tp is None else round(tp, 1)}%"
            + ("" if red is None else f", L2 red sectors {red / 1e6:.1f} M")
        )


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
    write_result({"meta": meta, "rows": cases}, out)
    print(f"wrote {out} ({len(cases)} cases); not in this ncu: {missing or 'none'}")
    return cases
