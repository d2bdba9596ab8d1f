"""The Hopper wrappers of hopper_common.cuh on the GPU, stage by stage (needs compute 9.0).

Each stage of ``flashref/kernels/probes/probe_wgmma.cu`` runs in its own process
(``python -m flashref.bench hopper_probe STAGE``) with a timeout: an illegal wgmma poisons
the CUDA context for the rest of a process, and an mbarrier that never completes hangs.
The stages are ordered so that the first failing one names the piece that is wrong:

  tma      TMA + mbarrier alone: the shared-memory image against the swizzle model
  pipeline five tiles through two buffers whose mbarriers are re-armed: phase parities
  ss_hand  wgmma from tiles the threads swizzled by hand: descriptors, k-steps, C fragments
  ss_tma   the same fed by TMA: the two layouts agree
  rs       P from the accumulators as A registers, V MN-major through its descriptor

On failure each check prints its first mismatching elements (row, column, expected, got)
and which alternative layout (hypothesis) the result equals. ``-s`` shows every check.
With ``$OUT`` set, each stage's JSON result is also written there (hopper_probe_*.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

TIMEOUT_S = 60
DTYPES = ("float16", "bfloat16")
STAGES = ("tma", "pipeline", "ss_hand", "ss_tma", "rs")
CASES = [
    (s, dt, n)
    for s in STAGES
    for dt in DTYPES
    for n in (64, 128)
    if not (s == "pipeline" and n == 128)
]


@pytest.fixture(scope="module")
def hopper():
    from flashref.gpu._runtime import require_gpu

    cp = require_gpu()
    cc = cp.cuda.Device().compute_capability
    if cc != "90":
        pytest.skip(f"needs compute capability 9.0 (Hopper, sm_90a); this GPU is {cc}")
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"cuda-bindings is missing ({exc}): pip install -e '.[cuda12]' or '[cuda13]'")


def run_stage(stage: str, dtype: str, n: int, *extra: str) -> dict:
    """The JSON result of one stage in a fresh process; pytest.fail on a hang or a crash."""
    cmd = [
        sys.executable,
        "-m",
        "flashref.bench",
        "hopper_probe",
        stage,
        "--dtype",
        dtype,
        "--n",
        str(n),
        *extra,
    ]
    what = f"{stage} {dtype} n={n} {' '.join(extra)}".strip()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{what}: no answer in {TIMEOUT_S} s, the kernel hangs: an mbarrier phase that never "
            f"completes (expect_tx bytes != bytes the TMA boxes deliver, or a wrong parity)"
        )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        pytest.fail(f"{what}: the process failed (rc {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(result: dict) -> str:
    head = f"{result['stage']} {result['dtype']} n={result['n']}"
    lines = [
        f"{'PASS' if ok else 'FAIL'} {head} | {name}: {detail}"
        for name, ok, detail in result["checks"]
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("stage,dtype,n", CASES, ids=[f"{s}-{dt}-n{n}" for s, dt, n in CASES])
def test_probe_stage(hopper, stage, dtype, n):
    result = run_stage(stage, dtype, n)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / f"hopper_probe_{stage}_{dtype}_n{n}.json"
        path.write_text(json.dumps(result, indent=1))
    text = report(result)
    print("\n" + text)
    if stage == "rs" and not result["ok"]:  # is it LBO and SBO of V the other way round?
        swapped = run_stage(stage, dtype, n, "--lbo", "1024", "--sbo", str(64 * 64 * 2))
        extra = "with V's LBO and SBO swapped:\n" + report(swapped)
        print(extra)
        text += "\n" + extra
    assert result["ok"], text
