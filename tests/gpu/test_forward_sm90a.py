"""The sm_90a versions (wgmma, TMA, mbarriers; 19 and after) against float64, in child processes.

The cases of tests/gpu/test_forward.py (its shapes, inputs, float64 reference, same-precision naive
baseline and 2x-naive tolerance, NaN-poisoned outputs, lse, bitwise repeatability), for fp16
and bf16 at each of d = 64 and 128 that the version offers, causal and not, for every version
whose ``arch`` is sm_90a. An
illegal instruction poisons the CUDA context of a process and a barrier waited on with the wrong
parity hangs, so each (version, dtype, d) runs in its own process with a timeout
(``python tests/gpu/test_forward_sm90a.py NUMBER DTYPE D``), printing one JSON line per case as it
finishes; a case whose line never came names the one that crashed or hung. The children of
the selected tests are started together (the first test that needs a result starts them all;
``-k v24`` starts only version 24's) and each has its own timeout. Skipped unless the GPU has
compute capability 9.0.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

# Every test of this file reads the results of the same children (started once per process):
# under pytest-xdist run it with --dist loadgroup, so that one worker starts them, not each.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("sm90a")]

TIMEOUT_S = 90  # per child; the children run at the same time on one GPU
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: flashref without an install
from flashref.gpu.forward_versions import VERSIONS  # noqa: E402  (no CuPy needed)

NUMBERS = [n for n, v in VERSIONS.items() if v.arch == "sm_90a"]
GROUPS = [
    (n, dt, d)
    for n in NUMBERS
    for dt in ("float16", "bfloat16")
    for d in (64, 128)
    if d in VERSIONS[n].head_dims
]
GROUP_IDS = [f"v{n}-{dt}-d{d}" for n, dt, d in GROUPS]
REPEAT = ((2, 3), 1000, 1000, True)  # (lead, Nq, Nk, causal) launched twice
# A persistent version (v27-v30) runs every case a second time on at most FEW_BLOCKS blocks, so
# that each block walks many work tiles (of several heads, causal ones of every length): with
# the SM count alone every block of these small shapes would take one work tile.
FEW_BLOCKS = 3
PERSISTENT = [g for g in GROUPS if VERSIONS[g[0]].persistent]
# and one case with more work tiles than SMs, ragged, whose causal order at d = 128 runs in two
# sections of heads (flashref.hardware.work_tiles.section_heads(1100, 128, 64) = 55)
SECTIONS = ((4, 16), 1000, 1100, True)


def _shapes():
    sys.path.insert(0, str(HERE))
    import test_forward

    return test_forward.SHAPES


CASES = [(lead, Nq, Nk, c) for lead, Nq, Nk in _shapes() for c in (False, True)]


# ------------------------------------------------------------------ the child process


def _worst(out, ref) -> dict:
    """The element with the largest absolute error (NaN first), for the failure message."""
    diff = np.abs(out.astype(np.float64) - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return {"index": [int(x) for x in i], "got": float(out[i]), "want": float(ref[i])}


def _check_case(cp, ver, dtype, d, lead, Nq, Nk, causal) -> dict:
    import test_forward as base

    from flashref.gpu.tolerances import LSE_TOL, tolerance

    q, k, v, ref, ref_lse = base._case(dtype, tuple(lead), Nq, Nk, d, causal)
    O, lse = base._run(cp, ver, q, k, v, causal)
    out, got_lse = cp.asnumpy(O), cp.asnumpy(lse)
    naive = base._naive_same_precision(cp, cp.asarray(q), cp.asarray(k), cp.asarray(v), causal)
    naive_err = base._rel_err(cp.asnumpy(naive), ref)
    lse_err = np.abs(got_lse.astype(np.float64) - ref_lse) / (1 + np.abs(ref_lse))
    lse_err = np.where(np.isnan(lse_err), np.inf, lse_err)
    j = np.unravel_index(int(np.argmax(lse_err)), lse_err.shape)
    return {
        "O_nan": int(np.isnan(out).sum()),
        "lse_nan": int(np.isnan(got_lse).sum()),
        "err": base._rel_err(out, ref),
        "naive_err": naive_err,
        "tol": tolerance(dtype, naive_err),
        "worst": _worst(out, ref),
        "lse_err": float(lse_err.max()),
        "lse_tol": LSE_TOL,
        "lse_worst": {
            "index": [int(x) for x in j],
            "got": float(got_lse[j]),
            "want": float(ref_lse[j]),
        },
    }


def _child(number: int, dtype: str, d: int) -> None:
    sys.path.insert(0, str(HERE))
    import test_forward as base

    from flashref.gpu import VERSIONS
    from flashref.gpu._runtime import require_gpu

    cp = require_gpu()
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: F401
    from flashref.gpu import _launch

    ver = VERSIONS[number]
    for few in (False, True) if ver.persistent else (False,):
        _launch.MAX_PERSISTENT_BLOCKS = FEW_BLOCKS if few else None
        tag = ["few_blocks"] if few else []
        for lead, Nq, Nk, causal in CASES + ([SECTIONS] if ver.persistent else []):
            res = _check_case(cp, ver, dtype, d, lead, Nq, Nk, causal)
            print(json.dumps({"case": [*tag, list(lead), Nq, Nk, causal], **res}), flush=True)
        lead, Nq, Nk, causal = REPEAT
        q, k, v, _, _ = base._case(dtype, lead, Nq, Nk, d, causal)
        (O1, lse1), (O2, lse2) = (base._run(cp, ver, q, k, v, causal) for _ in range(2))
        O1, O2 = cp.asnumpy(O1), cp.asnumpy(O2)
        same_lse = cp.asnumpy(lse1).tobytes() == cp.asnumpy(lse2).tobytes()
        differ = int((O1.view(np.uint16) != O2.view(np.uint16)).sum())
        print(
            json.dumps(
                {"case": "_".join(["repeat", *tag]), "O_bits_differ": differ, "lse_same": same_lse}
            ),
            flush=True,
        )
    _launch.MAX_PERSISTENT_BLOCKS = None
    print(json.dumps({"case": "api", **_check_api(cp, number, dtype, d)}), flush=True)


def _check_api(cp, number: int, dtype: str, d: int) -> dict:
    """flash_attention(version=number): q transposed (not contiguous), a negative scale, Nk = 0."""
    from flashref import naive_attention
    from flashref.gpu import flash_attention
    from flashref.gpu.tolerances import host_dtype

    x = np.random.default_rng(d).standard_normal((2, 50, 3, d)).astype(np.float32)
    x = x.astype(host_dtype(dtype))  # (B, N, H, d)
    q = cp.asarray(x).transpose(0, 2, 1, 3)  # (B, H, N, d), not contiguous
    x64 = x.astype(np.float64).transpose(0, 2, 1, 3)
    errs = {}
    for scale in (-0.3, 0.05):
        O = flash_attention(q, q, q, scale=scale, version=number)
        ref = naive_attention(x64, x64, x64, scale=scale)
        errs[str(scale)] = float(
            np.linalg.norm(cp.asnumpy(O).astype(np.float64) - ref) / np.linalg.norm(ref)
        )
    empty = cp.zeros((2, 3, 0, d), dtype=q.dtype)
    O, lse = flash_attention(q, empty, empty, version=number, return_lse=True)
    no_keys = bool((cp.asnumpy(O) == 0).all() and np.isneginf(cp.asnumpy(lse)).all())
    return {"errs": errs, "no_keys_zeros_and_neg_inf": no_keys}


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def hopper(request) -> frozenset:
    """The (number, dtype, d) groups of the tests pytest will run here (``-k v24``: only v24's)."""
    from flashref.gpu._runtime import require_gpu

    cp = require_gpu()
    cc = cp.cuda.Device().compute_capability
    if cc != "90":
        pytest.skip(f"versions {NUMBERS} need compute capability 9.0 (sm_90a); this GPU is {cc}")
    here = Path(__file__).resolve()
    params = [
        it.callspec.params
        for it in request.session.items
        if Path(it.path).resolve() == here and hasattr(it, "callspec")
    ]
    return frozenset((p["number"], p["dtype"], p["d"]) for p in params if "number" in p)


def _run_child(number: int, dtype: str, d: int) -> tuple[dict, str]:
    """{case key: result} of one child process, and what went wrong with it ('' if nothing)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(number), dtype, str(d)]
    timeout = TIMEOUT_S * (2 if VERSIONS[number].persistent else 1)  # its cases run twice
    return run_child(cmd, timeout)


def run_child(cmd: list[str], timeout: float) -> tuple[dict, str]:
    """Run ``cmd`` (a child printing one JSON line per case, its key under "case") with a
    timeout: {case key: result}, and what went wrong ('' if nothing).
    tests/backward/test_backward_sm90a.py runs the sm_90a backward versions through it too."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE.parents[1]
        )
        out, err, trouble = (
            proc.stdout,
            proc.stderr,
            "" if proc.returncode == 0 else (f"child exited with {proc.returncode}"),
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        trouble = f"child timed out after {timeout} s (a hang: an mbarrier never completed?)"
    results = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[json.dumps(row.pop("case"))] = row
    if trouble:
        trouble += f"; stderr tail:\n{err[-3000:]}"
    return results, trouble


@functools.cache
def _groups(selected: frozenset) -> dict:
    """The selected children's (results, trouble), keyed by (number, dtype, d); all started
    at once."""
    groups = [g for g in GROUPS if g in selected]
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        done = pool.map(lambda g: _run_child(*g), groups)
        return dict(zip(groups, done, strict=True))


def _result(selected, number, dtype, d, key):
    results, trouble = _groups(selected)[(number, dtype, d)]
    if key not in results:
        pytest.fail(f"v{number} {dtype} d={d}: no result for case {key}: {trouble or 'missing'}")
    return results[key]


def _check_result(r, what: str, dtype: str) -> None:
    """A child's result for one case: nothing left NaN, O and lse within their tolerances."""
    assert r["O_nan"] == 0, (
        f"{what}: {r['O_nan']} elements of O are NaN (unwritten?), e.g. {r['worst']}"
    )
    assert r["lse_nan"] == 0, f"{what}: {r['lse_nan']} rows of lse are NaN, e.g. {r['lse_worst']}"
    assert r["err"] <= r["tol"], (
        f"{what}: rel err {r['err']:.3e} > tol {r['tol']:.3e} (naive {dtype}: "
        f"{r['naive_err']:.3e}); largest error at {r['worst']}"
    )
    assert r["lse_err"] <= r["lse_tol"], (
        f"{what}: lse rel err {r['lse_err']:.3e} > {r['lse_tol']:.1e} at {r['lse_worst']}"
    )


@pytest.mark.parametrize(
    "lead,Nq,Nk,causal", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-causal{c[3]}" for c in CASES]
)
@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_sm90a_matches_float64(hopper, number, dtype, d, lead, Nq, Nk, causal):
    r = _result(hopper, number, dtype, d, json.dumps([list(lead), Nq, Nk, causal]))
    what = f"v{number} {dtype} d={d} q{(*lead, Nq, d)} k{(*lead, Nk, d)} causal={causal}"
    _check_result(r, what, dtype)


@pytest.mark.parametrize(
    "lead,Nq,Nk,causal", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-causal{c[3]}" for c in CASES]
)
@pytest.mark.parametrize(
    "number,dtype,d", PERSISTENT, ids=[f"v{n}-{dt}-d{d}" for n, dt, d in PERSISTENT]
)
def test_sm90a_persistent_few_blocks(hopper, number, dtype, d, lead, Nq, Nk, causal):
    """The same case on at most FEW_BLOCKS blocks: each walks many work tiles."""
    r = _result(hopper, number, dtype, d, json.dumps(["few_blocks", list(lead), Nq, Nk, causal]))
    Tr = -(-Nq // VERSIONS[number].Br)
    what = (
        f"v{number} {dtype} d={d} q{(*lead, Nq, d)} k{(*lead, Nk, d)} causal={causal} on "
        f"{FEW_BLOCKS} blocks ({Tr * int(np.prod(lead))} work tiles)"
    )
    _check_result(r, what, dtype)
    rep = _result(hopper, number, dtype, d, json.dumps("repeat_few_blocks"))
    assert rep["O_bits_differ"] == 0 and rep["lse_same"], (
        f"v{number} {FEW_BLOCKS} blocks {REPEAT}: {rep}"
    )


@pytest.mark.parametrize("few", [False, True], ids=["all_sms", "few_blocks"])
@pytest.mark.parametrize(
    "number,dtype,d", PERSISTENT, ids=[f"v{n}-{dt}-d{d}" for n, dt, d in PERSISTENT]
)
def test_sm90a_persistent_sections(hopper, number, dtype, d, few):
    """More work tiles than SMs (several per block on every SM), causal in sections of heads."""
    lead, Nq, Nk, causal = SECTIONS
    r = _result(
        hopper,
        number,
        dtype,
        d,
        json.dumps([*(["few_blocks"] if few else []), list(lead), Nq, Nk, causal]),
    )
    what = (
        f"v{number} {dtype} d={d} q{(*lead, Nq, d)} k{(*lead, Nk, d)} causal={causal} "
        f"({'at most ' + str(FEW_BLOCKS) if few else 'one per SM,'} blocks)"
    )
    _check_result(r, what, dtype)


@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_sm90a_same_inputs_same_bits(hopper, number, dtype, d):
    r = _result(hopper, number, dtype, d, json.dumps("repeat"))
    assert r["O_bits_differ"] == 0 and r["lse_same"], f"v{number} {dtype} d={d} {REPEAT}: {r}"


@pytest.mark.parametrize("number,dtype,d", GROUPS, ids=GROUP_IDS)
def test_sm90a_public_api(hopper, number, dtype, d):
    from flashref.gpu.tolerances import CEILING

    r = _result(hopper, number, dtype, d, json.dumps("api"))
    for scale, err in r["errs"].items():
        assert err <= CEILING[dtype], (
            f"v{number} {dtype} d={d} q (2, 3, 50, {d}) transposed, scale {scale}: "
            f"rel err {err:.3e} > ceiling {CEILING[dtype]:.1e}"
        )
    assert r["no_keys_zeros_and_neg_inf"], f"v{number} {dtype} d={d} Nk = 0: {r}"


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
