"""Nsight Compute counters of the Hopper versions beside version 14 and SDPA cuDNN.

    python -m flashref.bench profile --hopper [--out results/gpu_hopper_profile.json]
                                              [--versions 19 20 21]

Nsight Compute's tensor-pipe counter, ``sm__pipe_tensor_op_hmma_cycles_active``, counts the
cycles of ``mma.sync`` (HMMA) and of ``wgmma`` (HGMMA) alike (``ncu --query-metrics`` says so
in its description), so version 14 and version 21 can be set side by side on it. What the
forward's profile lacks is the rest of the Hopper picture. Every version with an sm_90a
target (or those in ``--versions``), version 14 (the fastest ``mma.sync`` kernel) and SDPA's
cuDNN backend, at (B, H, N) = (8, 16, 4096), d = 64 and 128, fp16, causal and not; beside the
forward's counters:

* ``sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active``: the floating-point matrix
  ops alone (HMMA, HGMMA, QGMMA), the share of cycles that says how close a kernel is to the
  tensor-core roof;
* ``sm__inst_executed_pipe_tensor_op_gmma``: wgmma instructions issued, and
  ``sm__ops_path_tensor_op_hgmma_src_fp16``: the matrix work they did;
* warps active and eligible per scheduler per cycle;
* the warp stall reasons (``WarpStateStats``), among them ``gmma`` (a warp waiting for its
  warpgroup's wgmma), beside ``barrier`` / ``membar`` / ``long_scoreboard`` (waits on an
  mbarrier, a named barrier or a load).

A name that ``ncu --query-metrics`` does not list is left out and named in
``meta.metrics_missing``. Clocks are not locked, as in the benchmark.
"""

from __future__ import annotations

from pathlib import Path

from ...gpu import VERSIONS
from .ncu import PROFILE_SHAPE, print_cases, profile_with_extras

HOPPER_METRICS = (
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sm__ops_path_tensor_op_hgmma_src_fp16.sum",
    "smsp__warps_active.avg.per_cycle_active",
    "smsp__warps_eligible.avg.per_cycle_active",
)
GMMA = HOPPER_METRICS[0]
TOP_STALLS = 4


def hopper_plan(versions=None) -> list[dict]:
    """v14, the sm_90a versions (or ``versions``) and SDPA cuDNN, d = 64 and 128, fp16; each
    version at the head dims it offers."""

    chosen = [
        v
        for v in VERSIONS.values()
        if (v.arch or v.number == 14) and (not versions or v.number in versions)
    ]
    impls = {
        d: [f"v{v.number}" for v in chosen if d in v.head_dims] + ["sdpa_cudnn"] for d in (64, 128)
    }
    return [
        {"impl": impl, "d": d, "causal": causal, "dtype": "float16", **PROFILE_SHAPE}
        for d in (64, 128)
        for causal in (False, True)
        for impl in impls[d]
    ]


def print_hopper(cases: list[dict]) -> None:
    print_cases(cases)
    for c in cases:
        tp = c.get(GMMA)
        tp = "-" if tp is None else f"{tp:.1f}%"
        stalls = sorted(c.get("stalls_per_issue", {}).items(), key=lambda kv: -kv[1])
        top = ", ".join(f"{k} {v:.2f}" for k, v in stalls[:TOP_STALLS])
        print(
            f"  {c['impl']:10s} d={c['d']:3d} causal={c['causal']!s:5s} "
            f"tensor pipe (matrix ops) {tp}; stalls/issue: {top}"
        )


def run_hopper(meta: dict, out: Path, versions=None) -> int:
    print_hopper(profile_with_extras(hopper_plan(versions), HOPPER_METRICS, meta, out))
    return 0
