"""The sm_90a backward versions (wgmma, TMA, mbarriers; bwd8) against float64, in child processes.

The cases of tests/backward/test_backward_kernels.py (its shapes, inputs, float64 reference,
same-precision naive baseline and tolerance, dQ's allowance for float32 atomics, NaN-poisoned dq,
dk, dv, bitwise repeatable dK and dV) for fp16 and bf16 at each of d = 64 and 128 the version
offers, causal and not, for every backward version whose ``arch`` is sm_90a, plus the public call
(transposed views, a negative scale, grouped K/V heads, Nk = 0 and Nq = 0). As for the forward
(tests/gpu/test_forward_sm90a.py, whose ``run_child`` starts them): an illegal instruction poisons
the CUDA context and a wrong mbarrier parity hangs, so each (version, dtype, d) runs in its own
process with a timeout (``python tests/backward/test_backward_sm90a.py NUMBER DTYPE D``), printing
one JSON line per case; a case whose line never came names the one that crashed or hung. Skipped
unless the GPU has compute capability 9.0.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("sm90a_bwd")]

TIMEOUT_S = 200  # per child; the children run at the same time on one GPU (and share it, and
# the CPUs, with every other worker of a parallel run: 100 s ran out there under 16 workers)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: flashref without an install
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "gpu"))  # test_forward_sm90a's run_child
import test_backward_kernels as base  # noqa: E402  (no CuPy needed to import)
from test_forward_sm90a import run_child  # noqa: E402

from flashref.gpu.backward_versions import BWD_VERSIONS  # noqa: E402

NUMBERS = [n for n, v in BWD_VERSIONS.items() if v.arch == "sm_90a"]
GROUPS = [
    (n, dt, d)
    for n in NUMBERS
    for dt in base.DTYPES
    for d in (64, 128)
    if d in BWD_VERSIONS[n].head_dims
]
GROUP_IDS = [f"bwd{n}-{dt}-d{d}" for n, dt, d in GROUPS]
CASES = [(lead, Nq, Nk, c) for lead, Nq, Nk in base.SHAPES for c in (False, True)]
REPEAT = ((2, 3), 1000, 1000, True)  # (lead, Nq, Nk, causal) launched twice, as test_repeatable
NAMES = ("dq", "dk", "dv")


# ------------------------------------------------------------------ the child process


def _check_case(cp, ver, dtype, d, lead, Nq, Nk, causal) -> dict:
    from flashref.gpu.tolerances import backward_tolerance

    scale = 1.0 / math.sqrt(d)
    inputs, ref = base._case(dtype, tuple(lead), Nq, Nk, d, causal)
    got = base._run(cp, ver, inputs, causal, scale)  # into NaN-poisoned buffers
    errs = base._rel_errs(got, ref)
    q, k, v, o, _, do = (cp.asarray(x) for x in inputs)
    naive = base._rel_errs(base._naive_same_precision(cp, q, k, v, o, do, causal, scale), ref)
    adds = ver.dq_adds(Nk)  # float32 atomic additions into each dQ element (2 per key tile)
    tols = [
        backward_tolerance(dtype, naive[i], adds if name == "dq" else 0)
        for i, name in enumerate(NAMES)
    ]
    return {
        "nan": [int(np.isnan(np.asarray(x, np.float32)).sum()) for x in got],
        "errs": errs,
        "naive": naive,
        "tols": tols,
        "worst": [base._worst(x, r) for x, r in zip(got, ref, strict=True)],
    }


def _check_repeat(cp, ver, dtype, d) -> dict:
    lead, Nq, Nk, causal = REPEAT
    inputs, _ = base._case(dtype, lead, Nq, Nk, d, causal)
    a = base._run(cp, ver, inputs, causal, 1.0 / math.sqrt(d))
    b = base._run(cp, ver, inputs, causal, 1.0 / math.sqrt(d))
    x, y = a[0].astype(np.float64), b[0].astype(np.float64)
    unit = (2.0**-10 if dtype == "float16" else 2.0**-7) * float(np.abs(x).max())
    return {
        "dk_bits_differ": int((a[1].view(np.uint16) != b[1].view(np.uint16)).sum()),
        "dv_bits_differ": int((a[2].view(np.uint16) != b[2].view(np.uint16)).sum()),
        "dq_max_diff": float(np.abs(x - y).max()),
        "dq_unit": unit,
    }


def _check_api(cp, number: int, dtype: str, d: int) -> dict:
    """flash_attention_backward(version=number): transposed views and a negative scale, grouped
    K/V heads, Nk = 0 and Nq = 0; relative errors against float64."""
    from flashref import naive_attention, naive_attention_backward
    from flashref.gpu import flash_attention_backward

    out = {}
    inputs, ref = base._case(dtype, (2, 3), 50, 70, d, True, -0.3)
    views = [
        cp.asarray(np.ascontiguousarray(np.swapaxes(x, 0, -2))).swapaxes(0, -2)
        if x.ndim == 4
        else cp.asarray(x)
        for x in inputs
    ]
    got = flash_attention_backward(*views, causal=True, scale=-0.3, version=number)
    out["views_negative_scale"] = base._rel_errs([cp.asnumpy(x) for x in got], ref)

    rng = np.random.default_rng(d)  # grouped heads: Hq = 4 query heads on Hkv = 2 K/V heads
    dt = base._host(dtype)
    q, do = (rng.standard_normal((2, 4, 130, d)).astype(np.float32).astype(dt) for _ in "qo")
    k, v = (rng.standard_normal((2, 2, 200, d)).astype(np.float32).astype(dt) for _ in "kv")
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    o, lse = naive_attention(*f64[:3], return_lse=True)
    o, lse = o.astype(dt), lse.astype(np.float32)
    ref = naive_attention_backward(*f64[:3], o.astype(np.float64), lse.astype(np.float64), f64[3])
    got = flash_attention_backward(*(cp.asarray(x) for x in (q, k, v, o, lse, do)), version=number)
    out["grouped"] = base._rel_errs([cp.asnumpy(x) for x in got], ref)

    q, k, v, o, lse, do = (cp.asarray(x) for x in inputs)
    empty = cp.zeros((2, 3, 0, d), dtype=q.dtype)
    dq, dk, dv = flash_attention_backward(q, empty, empty, o, lse, do, version=number)
    out["no_keys_zero_dq"] = bool((cp.asnumpy(dq) == 0).all()) and dk.shape == (2, 3, 0, d)
    dq, dk, dv = flash_attention_backward(empty, k, v, empty, lse[..., :0], empty, version=number)
    out["no_queries_zero_dk_dv"] = bool((cp.asnumpy(dk) == 0).all() and (cp.asnumpy(dv) == 0).all())
    return out


def _child(number: int, dtype: str, d: int) -> None:
    from flashref.gpu._runtime import require_gpu

    cp = require_gpu()
    ver = BWD_VERSIONS[number]
    jobs = [
        ([list(case[0]), *case[1:]], lambda a=case: _check_case(cp, ver, dtype, d, *a))
        for case in CASES
    ]
    jobs += [
        ("repeat", lambda: _check_repeat(cp, ver, dtype, d)),
        ("api", lambda: _check_api(cp, number, dtype, d)),
    ]
    for key, job in jobs:
        try:
            res = job()
        except Exception as exc:  # the case's own failure, named; a CUDA error ends the child
            print(
                json.dumps({"case": key, "error": f"{type(exc).__name__}: {exc}"[:2000]}),
                flush=True,
            )
            if "cuda" in type(exc).__module__:  # cupy.cuda..., cupy_backends.cuda...
                raise
            continue
        print(json.dumps({"case": key, **res}), flush=True)


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def hopper(request) -> frozenset:
    """The (number, dtype, d) groups of the tests pytest will run here (``-k bf16``: fewer)."""
    from flashref.gpu._runtime import require_gpu

    cp = require_gpu()
    cc = cp.cuda.Device().compute_capability
    if cc != "90":
        pytest.skip(
            f"backward versions {NUMBERS} need compute capability 9.0 (sm_90a); this GPU is {cc}"
        )
    here = Path(__file__).resolve()
    params = [
        it.callspec.params
        for it in request.session.items
        if Path(it.path).resolve() == here and hasattr(it, "callspec")
    ]
    return frozenset((p["number"], p["dtype"], p["d"]) for p in params if "number" in p)


@functools.cache
def _groups(selected: frozenset) -> dict:
    """The selected children's (results, trouble), keyed by (number, dtype, d); started at once."""
    groups = [g for g in GROUPS if g in selected]
    script = str(Path(__file__).resolve())
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        done = pool.map(
            lambda g: run_child([sys.executable, script, *map(str, g)], TIMEOUT_S), groups
        )
        return dict(zip(groups, done, strict=True))


def _result(selected, number, dtype, d, key):
    results, trouble = _groups(selected)[(number, dtype, d)]
    if key not in results:
        pytest.fail(f"bwd{number} {dtype} d={d}: no result for case {key}: {trouble or 'missing'}")
    if "error" in results[key]:
        pytest.fail(f"bwd{number} {dtype} d={d} case {key} raised {results[key]['error']}")
    return results[key]


@pytest.mark.parametrize(
    "lead,Nq,Nk,causal", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-causal{c[3]}" for c in CASES]
)
@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_bwd_sm90a_matches_float64(hopper, number, dtype, d, lead, Nq, Nk, causal):
    r = _result(hopper, number, dtype, d, json.dumps([list(lead), Nq, Nk, causal]))
    what = f"bwd{number} {dtype} d={d} q{(*lead, Nq, d)} k{(*lead, Nk, d)} causal={causal}"
    problems = []
    for i, name in enumerate(NAMES):
        if r["nan"][i]:
            problems.append(f"{name}: {r['nan'][i]} NaN elements (unwritten?); {r['worst'][i]}")
        elif not r["errs"][i] <= r["tols"][i]:  # NaN fails
            problems.append(
                f"{name}: rel err {r['errs'][i]:.3e} > tol {r['tols'][i]:.3e} "
                f"(naive {dtype} {r['naive'][i]:.3e}); {r['worst'][i]}"
            )
    assert not problems, f"{what}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_bwd_sm90a_repeatable(hopper, number, dtype, d):
    """dK and dV the same bits on every call; dQ (float32 atomics) within one unit in the last
    place of its largest element (test_gpu_backward.test_repeatable says why)."""
    r = _result(hopper, number, dtype, d, json.dumps("repeat"))
    what = f"bwd{number} {dtype} d={d} {REPEAT}"
    assert r["dk_bits_differ"] == 0, f"{what}: {r['dk_bits_differ']} elements of dk differ"
    assert r["dv_bits_differ"] == 0, f"{what}: {r['dv_bits_differ']} elements of dv differ"
    assert r["dq_max_diff"] <= r["dq_unit"], (
        f"{what}: dq runs differ by {r['dq_max_diff']:.3e} > {r['dq_unit']:.3e}"
    )


@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_bwd_sm90a_public_api(hopper, number, dtype, d):
    from flashref.gpu.tolerances import BWD_CEILING

    r = _result(hopper, number, dtype, d, json.dumps("api"))
    for case in ("views_negative_scale", "grouped"):
        for name, err in zip(NAMES, r[case], strict=True):
            assert err <= BWD_CEILING[dtype], (
                f"bwd{number} {dtype} d={d} {case}: {name} rel err {err:.3e} > ceiling "
                f"{BWD_CEILING[dtype]:.1e}"
            )
    assert r["no_keys_zero_dq"], f"bwd{number} {dtype} d={d} Nk = 0: {r}"
    assert r["no_queries_zero_dk_dv"], f"bwd{number} {dtype} d={d} Nq = 0: {r}"


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
