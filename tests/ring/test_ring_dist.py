"""Ring attention across real processes (flashref.ring.dist, flashref.bench.ring).

The CPU tests start 1-3 processes that talk over gloo, the same ``ring_forward`` the GPUs
run over NCCL, and compare with the one-process simulation ``flashref.ring_attention``
(including its ``RingSchedule.pairs``) and with ``naive_attention``, in float64. The GPU
tests (marker ``gpu``) run ``--gpus 1`` and a gloo ring whose local attention is flashref's
kernel on GPU 0. torch is needed for all of them; without it they are skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from flashref import naive_attention, ring_attention

torch = pytest.importorskip(
    "torch", reason="torch is not installed: ring_dist runs under torch.distributed"
)

from reference import assert_close, attention_naive_lowp  # noqa: E402

from flashref.bench import ring as ring_cli  # noqa: E402
from flashref.bench.ring_check import rel  # noqa: E402
from flashref.ring import dist as ring_dist  # noqa: E402

RTOL64 = 1e-12  # float64, as tests/ring/test_ring.py says why


def _qkv(shape, dv=None, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape)
    k = rng.standard_normal(shape)
    v = rng.standard_normal(shape[:-1] + (dv or shape[-1],))
    return (x.astype(dtype) for x in (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [2, 3])
def test_gloo_ring_equals_simulation_and_naive(W, layout, causal):
    N = 2 * W * 7  # 7 positions per zigzag chunk: not a power of two
    q, k, v = _qkv((2, 3, N, 12), dv=10, seed=W)
    O, lse, pairs = ring_cli.ring_attention_gloo(
        q, k, v, world_size=W, causal=causal, layout=layout
    )
    O_sim, lse_sim, schedule = ring_attention(
        q, k, v, world_size=W, causal=causal, layout=layout, return_lse=True, return_schedule=True
    )
    O_naive, lse_naive = naive_attention(q, k, v, causal=causal, return_lse=True)
    assert_close(O, O_sim, RTOL64, "O vs ring_attention")
    assert_close(lse, lse_sim, RTOL64, "lse vs ring_attention")
    assert_close(O, O_naive, RTOL64, "O vs naive_attention")
    assert_close(lse, lse_naive, RTOL64, "lse vs naive_attention")
    np.testing.assert_array_equal(pairs, schedule.pairs, err_msg="pairs (step, rank) per step")


def test_gloo_ring_one_process_and_scale():
    q, k, v = _qkv((1, 2, 10, 8))
    O, lse, pairs = ring_cli.ring_attention_gloo(
        q, k, v, world_size=1, causal=True, layout="zigzag", scale=-0.7
    )
    O_ref, lse_ref = naive_attention(q, k, v, causal=True, scale=-0.7, return_lse=True)
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")
    assert pairs.tolist() == [[55]]  # 10 * 11 / 2: the diagonal of one block


def test_gloo_ring_propagates_nan():
    q, k, v = _qkv((1, 1, 8, 4))
    q[0, 0, 5, 1] = np.nan  # query 5's scores are NaN at every step; no other query's are
    O, lse, _ = ring_cli.ring_attention_gloo(q, k, v, world_size=2, causal=True, layout="zigzag")
    assert np.isnan(O[0, 0, 5]).all() and np.isnan(lse[0, 0, 5])
    others = [0, 1, 2, 3, 4, 6, 7]
    assert np.isfinite(O[0, 0, others]).all() and np.isfinite(lse[0, 0, others]).all()


def test_errors_before_any_process_starts():
    q, k, v = _qkv((1, 2, 12, 8))
    with pytest.raises(ValueError, match="multiple of 10"):
        ring_cli.ring_attention_gloo(q, k, v, world_size=5, layout="zigzag")
    with pytest.raises(ValueError, match="world_size"):
        ring_cli.ring_attention_gloo(q, k, v, world_size=0)
    with pytest.raises(ValueError, match="one sequence"):
        ring_cli.ring_attention_gloo(q, k[..., :6, :], v[..., :6, :], world_size=2)
    with pytest.raises(ValueError, match="attend must be one of"):
        ring_cli.ring_attention_gloo(q, k, v, world_size=2, attend="gpu")
    with pytest.raises(TypeError, match="takes float16"):
        ring_cli.ring_attention_gloo(q, k, v, world_size=2, attend="flash")
    with pytest.raises(TypeError, match="causal"):
        ring_cli.ring_attention_gloo(q, k, v, world_size=2, causal=1)


def test_merge_follows_merge_states():
    from flashref import SoftmaxState, merge_states

    rng = np.random.default_rng(3)
    O_a, O_b = rng.standard_normal((2, 5, 4))  # (n, dv) each
    lse_a, lse_b = rng.standard_normal((2, 5)) * 30
    lse_a[1] = lse_b[1] = -np.inf  # both empty: zeros, -inf
    lse_a[2] = -np.inf  # one empty: the other unchanged
    lse_b[3] = np.nan  # NaN in: NaN out
    want = merge_states(SoftmaxState.from_output(O_a, lse_a), SoftmaxState.from_output(O_b, lse_b))
    O, lse = ring_dist.merge(*(torch.from_numpy(x) for x in (O_a, lse_a, O_b, lse_b)))
    with np.errstate(invalid="ignore"):
        assert_close(O.numpy(), want.result(), RTOL64, "O")
        assert_close(lse.numpy(), want.lse(), RTOL64, "lse")
    assert (O[1] == 0).all() and lse[1] == -np.inf
    assert np.array_equal(O[2].numpy(), O_b[2]) and lse[2] == lse_b[2]
    assert torch.isnan(O[3]).all() and torch.isnan(lse[3])


@pytest.mark.parametrize("causal", [False, True])
def test_reference_attend(causal):
    q, k, v = _qkv((2, 9, 5), dv=3)
    O, lse = ring_dist.reference_attend(*map(torch.from_numpy, (q, k, v)), causal=causal, scale=0.4)
    O_ref, lse_ref = naive_attention(q, k, v, causal=causal, scale=0.4, return_lse=True)
    assert_close(O.numpy(), O_ref, RTOL64, "O")
    assert_close(lse.numpy(), lse_ref, RTOL64, "lse")


def test_runs_and_pair_masks():
    from flashref import shard_positions

    P = shard_positions(24, 3, "zigzag")  # chunks of 4: device 0 holds chunks 0 and 5
    assert ring_dist.runs(P[0]) == [(0, 4, slice(0, 4)), (20, 4, slice(4, 8))]
    assert ring_dist.runs(P[2]) == [(8, 8, slice(0, 8))]  # chunks 2 and 3 touch: one run
    assert ring_dist.pair_mask(20, 4, 0, 4) == "full"
    assert ring_dist.pair_mask(0, 4, 20, 4) == "none"
    assert ring_dist.pair_mask(8, 8, 8, 8) == "diagonal"
    assert ring_dist.pair_mask(4, 4, 0, 5) == "full"  # key 4 is visible to query 4: j <= i
    with pytest.raises(ValueError, match="overlap"):
        ring_dist.pair_mask(0, 8, 4, 8)


def test_zigzag_step_is_at_most_two_unmasked_calls():
    from flashref import shard_positions

    W = 4
    R = [ring_dist.runs(P) for P in shard_positions(8 * W, W, "zigzag")]
    for r in range(W):
        own = ring_dist._calls(R[r], R[r], True, own=True)
        assert own == [(slice(None), slice(None), "diagonal")], f"rank {r}'s own block: {own}"
        for b in set(range(W)) - {r}:
            calls = ring_dist._calls(R[r], R[b], True, own=False)
            want = 2 if b < r and len(R[r]) == 2 else 1  # rank W - 1: chunks W - 1, W touch
            assert len(calls) == want, f"rank {r}, block {b}: {calls}"
            assert all(m == "full" for *_, m in calls), f"rank {r}, block {b}: {calls}"


def test_import_flashref_does_not_import_torch():
    code = (
        "import sys, flashref; print('torch' in sys.modules, 'flashref.ring.dist' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_ring_in_a_group_of_a_larger_world():
    """The ring as one dimension of a mesh: 3 ranks of a world of 5 (ranks 2, 3, 4), the
    group's ranks and peers, the same result as the simulation."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 24, 5)) for _ in range(3))
    O, lse, pairs = ring_cli.ring_attention_gloo(
        q, k, v, world_size=3, causal=True, layout="zigzag", spare=2
    )
    want, want_lse, schedule = ring_attention(
        q, k, v, world_size=3, causal=True, layout="zigzag", return_lse=True, return_schedule=True
    )
    assert rel(O, want) <= RTOL64 and rel(lse, want_lse) <= RTOL64
    assert pairs.tolist() == schedule.pairs.tolist()


def test_the_ring_sets_no_environment():
    """The library leaves NCCL's environment to the user: no variable set, none refused."""
    import inspect

    source = inspect.getsource(ring_dist)
    assert "os.environ" not in source and "NCCL_" not in source.replace("NCCL_NVLS_ENABLE=0", "")


def test_no_multicast_is_the_launchers_option(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(RuntimeError, match="NCCL_NVLS_ENABLE is set to '1' and --no-multicast"):
        ring_cli.multicast_off()
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    for name in ring_cli.MULTICAST_OFF:
        monkeypatch.delenv(name, raising=False)
    ring_cli.multicast_off()
    import os

    assert {n: os.environ[n] for n in ring_cli.MULTICAST_OFF} == ring_cli.MULTICAST_OFF


def test_torchrun_ranks_read_its_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert ring_cli.torchrun_ranks() is None
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert ring_cli.torchrun_ranks() == (3, 4, 1)


def test_cli_under_torchrun(tmp_path):
    """``torchrun --nproc-per-node 2 -m flashref.bench ring --cpu 2``: each process is one
    rank (env:// rendezvous), rank 0 checks and writes the result."""
    import os

    out = tmp_path / "ring.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "flashref.bench",
        "ring",
    ]
    cmd = [
        *torchrun,
        "--cpu",
        "2",
        "--seq",
        "16",
        "--heads",
        "2",
        "--head-dim",
        "4",
        "--causal",
        "--check",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["check"]["passed"] and result["provenance"]["processes"] == 2
    with_three = [*torchrun, "--cpu", "3", "--seq", "18"]
    proc = subprocess.run(with_three, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "torchrun started 2 processes but --cpu asks for 3" in (
        proc.stdout + proc.stderr
    )


def test_cli_cpu_check_writes_json(tmp_path, capsys):
    out = tmp_path / "ring.json"
    argv = [
        "--cpu",
        "3",
        "--seq",
        "42",
        "--heads",
        "2",
        "--head-dim",
        "6",
        "--layout",
        "zigzag",
        "--causal",
        "--check",
        "--out",
        str(out),
    ]
    assert ring_cli.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["check"]["passed"] and result["check"]["rel_err"] <= RTOL64
    import os

    env = {n: os.environ.get(n) for n in ring_cli.MULTICAST_OFF}
    assert result["provenance"]["env"] == env  # the caller's: without --no-multicast none set
    q = k = v = np.zeros((1, 1, 42, 1))
    _, schedule = ring_attention(
        q, k, v, world_size=3, causal=True, layout="zigzag", return_schedule=True
    )
    assert result["pairs"] == schedule.pairs.tolist()
    assert "check: passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--cpu", "2", "--seq", "6", "--layout", "zigzag"], "must be a multiple of 4"),
        (["--cpu", "0", "--seq", "6"], "--cpu must be >= 1"),
        (["--seq", "6"], "one of the arguments --gpus --cpu is required"),
        (["--cpu", "2", "--gpus", "2", "--seq", "8"], "not allowed with"),
    ],
)
def test_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        ring_cli.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_cli_refuses_a_conflicting_nvls_and_missing_gpus(monkeypatch, capsys):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the user's choice, refused only against the flag
    with pytest.raises(SystemExit):
        ring_cli.main(["--cpu", "2", "--seq", "8", "--no-multicast"])
    assert "NCCL_NVLS_ENABLE is set to '1' and --no-multicast" in capsys.readouterr().err
    assert ring_cli.parse(["--cpu", "2", "--seq", "8"]).no_multicast is False
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(SystemExit):
        ring_cli.main(["--gpus", str(have + 1), "--seq", "64"])
    assert f"torch sees {have} CUDA GPU(s)" in capsys.readouterr().err


# --- on a GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize(
    "layout,causal", [("contiguous", True), ("zigzag", True), ("zigzag", False)]
)
def test_gloo_ring_with_the_kernel(W, layout, causal):
    """The pairs a ring hands the kernel (full blocks, half blocks, diagonals), on one GPU."""
    N = 2 * W * 96  # chunks of 96: not a multiple of the kernels' tiles
    q, k, v = _qkv((1, 2, N, 64), seed=10 + W, dtype=np.float16)
    O, lse, _ = ring_cli.ring_attention_gloo(
        q, k, v, world_size=W, causal=causal, layout=layout, attend="flash"
    )
    from flashref.gpu.tolerances import LSE_TOL, tolerance

    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    O_ref, lse_ref = naive_attention(q64, k64, v64, causal=causal, return_lse=True)
    O_low, _ = attention_naive_lowp(q, k, v, np.float16, causal=causal)
    err, naive_err = rel(O, O_ref), rel(O_low, O_ref)  # normwise, as tests/gpu/test_forward.py
    tol = tolerance("float16", naive_err)
    diff = np.abs(O.astype(np.float64) - O_ref)
    worst = np.unravel_index(np.argmax(np.where(np.isnan(diff), np.inf, diff)), diff.shape)
    assert err <= tol, (
        f"W={W} {layout} causal={causal} N={N}: rel err {err:.3e} > {tol:.3e} (naive fp16 "
        f"{naive_err:.3e}); worst element (B, H, row, d) {tuple(map(int, worst))}: "
        f"{O[worst]} vs {O_ref[worst]:.5f}"
    )
    lse_err = np.abs(lse - lse_ref) / (1 + np.abs(lse_ref))
    assert lse_err.max() <= LSE_TOL, (
        f"lse rel err {lse_err.max():.3e} > {LSE_TOL} at (B, H, row) "
        f"{np.unravel_index(lse_err.argmax(), lse_err.shape)}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize(
    "flags",
    [
        ["--layout", "zigzag", "--causal"],
        ["--layout", "contiguous", "--causal", "--dtype", "fp16"],
        ["--layout", "zigzag"],
    ],
    ids=["zigzag-causal-bf16", "contiguous-causal-fp16", "zigzag-bf16"],
)
def test_cli_gpus(gpus, flags, tmp_path):
    """The launcher on 1 GPU (no transfer) or 2 (NCCL), against one-GPU attention."""
    have = torch.cuda.device_count()
    if have < gpus:
        pytest.skip(f"needs {gpus} GPUs; torch sees {have}")
    out = tmp_path / "ring.json"
    argv = [
        "--gpus",
        str(gpus),
        "--seq",
        "4096",
        "--heads",
        "4",
        "--head-dim",
        "128",
        "--check",
        "--warmup",
        "1",
        "--reps",
        "2",
        "--out",
        str(out),
        *flags,
    ]
    code = ring_cli.main(argv)
    result = json.loads(out.read_text())
    what = f"--gpus {gpus} {' '.join(flags)}"
    assert code == 0 and result["check"]["passed"], f"{what}: {json.dumps(result['check'])}"
    layout, causal = flags[1], "--causal" in flags
    x = np.zeros((1, 1, 4096, 1))
    _, schedule = ring_attention(
        x, x, x, world_size=gpus, causal=causal, layout=layout, return_schedule=True
    )
    assert result["pairs"] == schedule.pairs.tolist(), f"{what}: pairs per (step, rank)"
    assert result["ring_ms"] > 0 and result["single_ms"] > 0, what
    for rank, steps in enumerate(result["steps"]):
        assert len(steps) == gpus, f"{what}: rank {rank} timed {len(steps)} steps"
        for i, step in enumerate(steps):
            assert ("comm_ms" in step) == (i < gpus - 1), f"{what}: rank {rank} step {i}: {step}"
            assert step.get("hidden", 0) >= 0 and step.get("hidden", 1) <= 1, f"{what}: {step}"
