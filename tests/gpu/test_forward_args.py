"""flashref.gpu on a machine without CuPy or without a GPU: clear errors, no crash on import.

These run everywhere (no marker): CuPy's absence is simulated by making its
import fail, and a missing GPU by a CuPy whose device query raises.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from reference import causal_refusal

import flashref.gpu as fg
from flashref import tiled_attention


@pytest.fixture
def cupy_without_gpu(monkeypatch):
    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    runtime = types.SimpleNamespace(getDeviceCount=no_device)
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", fake)


def test_missing_nvrtc_is_named_before_any_compile(monkeypatch):
    def no_nvrtc():
        raise OSError("libnvrtc.so.13: cannot open shared object file")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
        nvrtc=types.SimpleNamespace(getVersion=no_nvrtc),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    reason = fg.gpu_unavailable_reason()
    assert "CuPy cannot load NVRTC" in reason and "libnvrtc.so.13" in reason, reason
    assert "pip install -e '.[cuda13]'" in reason and "cupy-cuda13x" in reason
    with pytest.raises(fg.GPUUnavailableError, match="NVRTC"):
        fg.flash_attention(*_inputs())
    fake.cuda.nvrtc.getVersion = lambda: (13, 0)  # present: the GPU is usable
    assert fg.gpu_unavailable_reason() is None


def _inputs(dtype="float16", shape=(1, 2, 16, 64)):
    x = np.zeros(shape, dtype=dtype)
    return x, x, x


def test_import_needs_no_cupy():
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.split('.')[0] == 'cupy': raise ImportError('no cupy')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "import flashref, flashref.gpu\n"
        "assert 'cupy' not in sys.modules\n"
        "print(flashref.gpu.available())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_cupy_says_what_and_how(no_cupy):
    reason = fg.gpu_unavailable_reason()
    assert "CuPy is not installed" in reason
    assert "pip install -e '.[cuda12]'" in reason and "'.[cuda13]'" in reason
    assert "cupy-cuda12x" in reason and "cupy-cuda13x" in reason  # packages that exist
    assert not fg.available()
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed") as info:
        fg.flash_attention(*_inputs())
    assert "pip install" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_missing_gpu_says_what_and_how(cupy_without_gpu, monkeypatch):
    monkeypatch.setattr(fg._runtime, "driver_library", lambda: "libcuda.so.1")
    reason = fg.gpu_unavailable_reason()
    assert "cannot reach a CUDA GPU" in reason and "cudaErrorNoDevice" in reason
    with pytest.raises(fg.GPUUnavailableError, match=r"pip install -e '\.\[cuda1[23]\]'"):
        fg.flash_attention(*_inputs(), causal=True)


def test_no_driver_is_said_as_such(cupy_without_gpu, monkeypatch):
    """Without the driver's library, CUDA's runtime says the driver is "insufficient": the
    reason says there is no driver instead."""
    monkeypatch.setattr(fg._runtime, "driver_library", lambda: None)
    reason = fg.gpu_unavailable_reason()
    assert reason.startswith("no NVIDIA driver on this machine (none of libcuda.so.1"), reason
    assert "insufficient" not in reason


def test_selfcheck_and_bench_report_missing_gpu(no_cupy, monkeypatch, tmp_path):
    selfcheck = importlib.import_module("flashref.bench.selfcheck")
    with pytest.raises(fg.GPUUnavailableError):
        selfcheck.main(["--small"])
    bench = importlib.import_module("flashref.bench.forward")
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))  # the bench points it elsewhere
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        bench.main(["--quick", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


# Argument errors are raised before the GPU is looked for, so they read the same everywhere.
@pytest.mark.parametrize(
    "kwargs,inputs,error,match",
    [
        ({"version": 99}, _inputs(), ValueError, "version must be one of"),
        ({"version": "3"}, _inputs(), TypeError, "version must be an int"),
        ({"version": 3}, _inputs("float32"), ValueError, "version 3 .* takes float16"),
        ({"version": 1}, _inputs("float16"), ValueError, "takes float32"),
        ({"version": 5}, _inputs(shape=(1, 2, 16, 96)), ValueError, "head dim d=96"),
        ({}, _inputs(shape=(1, 2, 16, 80)), ValueError, "head dim d=80"),
        ({}, _inputs(shape=(1, 2, 16, 256), dtype="float32"), ValueError, "head dim d=256"),
        ({}, _inputs("float64"), TypeError, "supports float16, bfloat16, float32"),
        ({"causal": 1}, _inputs(), TypeError, "causal must be False, True, 'top_left' or"),
        ({"scale": 0.0}, _inputs(), ValueError, "scale must be finite and nonzero"),
        ({"scale": float("nan")}, _inputs(), ValueError, "scale must be finite"),
        ({"scale": "1"}, _inputs(), TypeError, "scale must be a real number"),
    ],
)
def test_argument_errors(no_cupy, kwargs, inputs, error, match):
    with pytest.raises(error, match=match):
        fg.flash_attention(*inputs, **kwargs)


# causal, return_lse and scale: the same rules, and the same messages, as the NumPy functions.
NOT_BOOLS = ["False", None, 0, 1, 1.0, np.int64(1)]


@pytest.mark.parametrize("flag", ["causal", "return_lse"])
@pytest.mark.parametrize("bad", NOT_BOOLS, ids=repr)
def test_flags_follow_the_cpu_rule(no_cupy, flag, bad):
    q = _inputs()[0]
    if flag == "causal":  # the causal spellings: bools, "top_left", "bottom_right"
        error, want = causal_refusal(bad)
    else:
        error, want = TypeError, f"{flag} must be a bool, got {type(bad).__name__}"
    with pytest.raises(error) as cpu:
        tiled_attention(q, q, q, **{flag: bad})
    with pytest.raises(error) as gpu:
        fg.flash_attention(q, q, q, **{flag: bad})
    assert str(gpu.value) == str(cpu.value) == want


def test_numpy_bools_pass_the_argument_checks(no_cupy):
    q = _inputs()[0]
    with pytest.raises(fg.GPUUnavailableError):  # what stops the call is the missing GPU
        fg.flash_attention(q, q, q, causal=np.True_, return_lse=np.False_)


@pytest.mark.parametrize(
    "bad", [np.inf, np.nan, 0.0, 1e300, -1e39, 1e-50, 10**400, "0.5", True, np.True_], ids=repr
)
def test_scale_follows_the_cpu_rule(no_cupy, bad):
    q = _inputs("float16")[0]  # float16: accumulated in float32 on the CPU and on the GPU
    with pytest.raises((TypeError, ValueError)) as cpu:
        tiled_attention(q, q, q, scale=bad)
    with pytest.raises(type(cpu.value)) as gpu:
        fg.flash_attention(q, q, q, scale=bad)
    assert type(gpu.value) is type(cpu.value) and str(gpu.value) == str(cpu.value)
    assert "scale" in str(gpu.value)


def test_scales_the_kernels_take(no_cupy):
    q = _inputs("float16")[0]
    for scale in (-0.5, 3, np.float16(0.25), 1e30):  # negative included: the kernels fold it
        with pytest.raises(fg.GPUUnavailableError):
            fg.flash_attention(q, q, q, scale=scale)


def test_shape_errors_name_the_argument(no_cupy):
    q = np.zeros((2, 3, 16, 64), np.float16)
    with pytest.raises(ValueError, match="k has shape .* but q has head dim 64"):
        fg.flash_attention(q, np.zeros((2, 3, 16, 32), np.float16), q)
    with pytest.raises(ValueError, match="v has shape .* but k has 16 keys"):
        fg.flash_attention(q, q, np.zeros((2, 3, 8, 64), np.float16))
    with pytest.raises(ValueError, match="v has shape .* head dim equal to q's"):
        fg.flash_attention(q, q, np.zeros((2, 3, 16, 32), np.float16))
    with pytest.raises(ValueError, match="leading .* dimensions must be equal"):
        fg.flash_attention(q, np.zeros((2, 4, 16, 64), np.float16), q)
    with pytest.raises(ValueError, match="q has shape"):
        fg.flash_attention(np.zeros(64, np.float16), q, q)
    with pytest.raises(TypeError, match="share one dtype"):
        fg.flash_attention(q, q.astype(np.float32), q)
    with pytest.raises(TypeError, match="q must be a cupy.ndarray"):
        fg.flash_attention([[1.0]], q, q)


def test_grouped_kv_heads_pass_the_checks(no_cupy):
    # Hq = G * Hkv is taken as the NumPy functions take it (the decode kernel for Nq <= 16,
    # otherwise a version once per group member): the checks pass and the GPU check comes next.
    q = np.zeros((2, 8, 17, 64), np.float16)
    kv = np.zeros((2, 2, 17, 64), np.float16)
    q16, kv16 = q[:, :, :16], np.zeros((2, 2, 100, 64), np.float16)
    for args, kw in [
        ((q, kv, kv), {}),
        ((q16, kv16, kv16), {"causal": True}),
        ((q16, kv16, kv16), {"version": 14}),
        (tuple(x.astype(np.float32) for x in (q16, kv16, kv16)), {}),
    ]:
        with pytest.raises(fg.GPUUnavailableError):
            fg.flash_attention(*args, **kw)
    with pytest.raises(ValueError, match="q has 8 heads but k has 3"):  # not a multiple
        fg.flash_attention(q, kv[:, :1].repeat(3, axis=1), kv[:, :1].repeat(3, axis=1))


def test_versions_table_is_complete():
    from flashref.gpu.forward_versions import base_of

    assert min(fg.VERSIONS) == 1
    for number, ver in fg.VERSIONS.items():
        assert ver.number == number and ver.path.is_file(), ver.file
        text = ver.path.read_text()  # the kernel's name, or a file it includes named so
        assert f"flash_v{number}(" in text or f"#define FLASH_KERNEL flash_v{number}\n" in text
        assert ver.path.read_text().startswith(f"// version {number}:")
        if number > 1:  # each version builds on an earlier one in the table
            assert base_of(number) in fg.VERSIONS and base_of(number) < number, number
        assert ver.dtypes in (("float32",), ("float16", "bfloat16"))
        # both head dims, or d = 64 alone where the summary says so
        assert {64, 128} <= set(ver.head_dims) or (
            ver.head_dims == (64,) and "d = 64 only" in ver.summary
        ), (number, ver.head_dims)
        # the H100/H200 per-block opt-in limit
        assert ver.smem_bytes(max(ver.head_dims)) <= 227 * 1024
        assert '#include "' not in ver.source()  # headers pasted in, as NVRTC is given it


def test_default_version_follows_the_table():
    for (dtype, d, causal), number in fg.PREFERENCE.items():
        assert dtype in fg.VERSIONS[number].dtypes
        got = fg.forward.resolve_version(None, dtype, d if d is not None else 40, causal)
        assert got.number == number
    for dtype in ("float16", "bfloat16"):
        for d in (64, 128):
            for causal in (False, True):
                assert (dtype, d, causal) in fg.PREFERENCE
    assert fg.forward.resolve_version(None, "float32", 40).number == 2


def test_capability_is_checked_before_compiling():
    class OldGPU:  # what CuPy says of a GPU of compute capability 7.5 (a T4)
        compute_capability = "75"
        id = 0

    cuda = types.SimpleNamespace(
        Device=lambda *a: OldGPU(),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"Tesla T4"}),
    )
    fake_cp = types.SimpleNamespace(cuda=cuda)
    with pytest.raises(
        RuntimeError,
        match=r"version 14 .* needs compute capability 8\.0 .*"
        r"\(Tesla T4\) has 7\.5",
    ):
        fg._runtime.check_capability(fake_cp, fg.VERSIONS[14])
    fg._runtime.check_capability(fake_cp, fg.VERSIONS[1])  # plain CUDA: any GPU CuPy supports


def test_hopper_version_runs_on_compute_9_0_only():
    v19 = fg.VERSIONS[19]
    assert v19.arch == "sm_90a" and v19.nvrtc_options() == ("-arch=sm_90a",)
    assert fg.VERSIONS[14].nvrtc_options() == ()  # the other versions: CuPy's own -arch only
    assert v19.runs_on((9, 0)) and not v19.runs_on((10, 0)) and not v19.runs_on((8, 9))
    assert fg.VERSIONS[14].runs_on((10, 0))

    class Blackwell:  # sm_90a code does not run on compute capability 10.0
        compute_capability = "100"
        id = 0

    cuda = types.SimpleNamespace(
        Device=lambda *a: Blackwell(),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"B200"}),
    )
    with pytest.raises(
        RuntimeError,
        match=r"version 19 .* built for sm_90a .* capability 9\.0 "
        r"exactly; this GPU \(B200\) has 10\.0",
    ):
        fg._runtime.check_capability(types.SimpleNamespace(cuda=cuda), v19)
    # Q (128, d), K and V (2 stages, Bc, d) of 16-bit elements, unpadded, + 1024 for alignment
    assert v19.smem_bytes(64) == 2 * (128 + 4 * 128) * 64 + 1024
    assert v19.smem_bytes(128) == 2 * (128 + 4 * 64) * 128 + 1024


def test_warp_specialised_versions_registry():
    """Versions 20 and 21: a producer warpgroup beside two consumers, a ring of three stages."""
    for number in (20, 21):
        ver = fg.VERSIONS[number]
        assert ver.arch == "sm_90a" and ver.tma and ver.runs_on((9, 0)) and not ver.runs_on((10, 0))
        assert ver.threads == 3 * 128 and ver.Br == 128 and ver.kv_buffers == 3
        assert ver.smem_bytes(64) == 2 * (128 + 6 * 128) * 64 + 1024
        assert ver.smem_bytes(128) == 2 * (128 + 6 * 64) * 128 + 1024
        text = ver.path.read_text()
        assert "#define KV_STAGES 3" in text and "setmaxnreg_dec<PRODUCER_REGS>" in text
    from flashref.gpu.forward_versions import base_of

    assert base_of(20) == 19 and base_of(21) == 20


@pytest.mark.parametrize("number", [22, 23])
def test_bc128_version_registry(number):
    """Versions 22 and 23: Bc = 128 at both head dims, two K/V stages at d = 128."""
    ver = fg.VERSIONS[number]
    assert ver.arch == "sm_90a" and ver.tma and ver.threads == 3 * 128 and ver.Br == 128
    assert (ver.Bc(64), ver.Bc(128), ver.stages(64), ver.stages(128)) == (128, 128, 3, 2)
    # Q (128, d), K and V (stages, 128, d) of 16-bit elements, unpadded, + 1024 for alignment
    assert ver.smem_bytes(64) == 2 * (128 + 6 * 128) * 64 + 1024
    assert ver.smem_bytes(128) == 2 * (128 + 4 * 128) * 128 + 1024 == 164864
    assert ver.smem_bytes(128) + 64 <= 227 * 1024  # + the barriers: the sm_90 opt-in maximum
    text = ver.path.read_text()
    assert "#define Bc 128" in text and "#define KV_STAGES (D > 64 ? 2 : 3)" in text
    from flashref.gpu.forward_versions import base_of

    assert base_of(number) == number - 1


def test_pingpong_turns():
    """Version 23: the two consumer warpgroups pass the turn on named barriers 1 and 2 (0 is
    __syncthreads's), both with all 256 consumer threads, through the header's wrappers."""
    text = fg.VERSIONS[23].path.read_text()
    assert "#define PINGPONG_BAR 1" in text
    assert "named_bar_sync(PINGPONG_BAR + cw, NCONSUMERS)" in text
    assert "named_bar_arrive(PINGPONG_BAR + 1 - cw, NCONSUMERS)" in text


def test_three_consumer_version_registry():
    """Version 24: three consumer warpgroups and the producer (Br = 192), d = 64 only."""
    from flashref.gpu.forward_versions import base_of

    ver = fg.VERSIONS[24]
    assert ver.arch == "sm_90a" and ver.tma and ver.runs_on((9, 0)) and not ver.runs_on((10, 0))
    assert ver.threads == 4 * 128 and ver.Br == 3 * 64 and ver.Bc(64) == 128
    assert ver.head_dims == (64,) and ver.kv_buffers == 3 and base_of(24) == 21
    # Q (192, 64), K and V (3 stages, 128, 64) of 16-bit elements, + 1024 for alignment
    assert ver.smem_bytes(64) == 2 * (192 + 6 * 128) * 64 + 1024
    text = ver.path.read_text()
    assert "#define NWG 3" in text and "#define KV_STAGES 3" in text
    for dtype in ver.dtypes:  # d = 128 is refused by name before any GPU work
        with pytest.raises(ValueError, match=r"head dim d=128; version 24 supports d in \(64,\)"):
            fg.forward.resolve_version(24, dtype, 128)
        assert fg.forward.resolve_version(24, dtype, 64) is ver


def _recorded_tflops(name: str) -> dict:
    """reporting.forward_tflops of results/<name>."""
    import json
    from pathlib import Path

    from flashref.recorded.defaults import forward_tflops

    doc = json.loads((Path(__file__).resolve().parents[2] / "results" / name).read_text())
    return forward_tflops(doc["rows"])


def test_default_versions_follow_the_rule_on_the_recorded_run():
    """PREFERENCE says what results/gpu_bench.json says under the book's rule: per (dtype, d,
    causal), the version with the highest worst-case ratio to the fastest over the sequence
    lengths (flashref.recorded.defaults.best_worst_case)."""
    from flashref.recorded.defaults import best_worst_case

    recorded = _recorded_tflops("gpu_bench.json")
    assert recorded, "the recorded run has no 16-bit flashref rows"
    for key, by_version in recorded.items():
        assert fg.PREFERENCE[key] == best_worst_case(by_version), (key, by_version)


def test_hopper_defaults_follow_the_rule_on_the_recorded_hopper_run():
    """HOPPER_PREFERENCE says what results/gpu_hopper.json says under the same rule, every
    version that run measured."""
    from flashref.recorded.defaults import best_worst_case

    recorded = _recorded_tflops("gpu_hopper.json")
    assert set(recorded) == set(fg.HOPPER_PREFERENCE), "the run and the table cover other cases"
    for key, by_version in recorded.items():
        assert fg.HOPPER_PREFERENCE[key] == best_worst_case(by_version), (key, by_version)


def test_default_version_depends_on_the_compute_capability():
    """version=None: HOPPER_PREFERENCE on 9.0 only; PREFERENCE on 8.x and on later GPUs, where
    the sm_90a code cannot run; float32 takes version 2 everywhere."""
    for (dtype, d, causal), number in fg.HOPPER_PREFERENCE.items():
        ver = fg.forward.resolve_version(None, dtype, d, causal, (9, 0))
        assert ver.number == number and ver.runs_on((9, 0)) and ver.arch == "sm_90a"
        for cc in ((8, 0), (8, 9), (10, 0), None):
            other = fg.forward.resolve_version(None, dtype, d, causal, cc)
            assert other.number == fg.PREFERENCE[dtype, d, causal]
            assert cc is None or other.runs_on(cc)
    for causal in (False, True):
        assert fg.forward.resolve_version(None, "float32", 40, causal, (9, 0)).number == 2
    with pytest.raises(ValueError, match="head dim d=96"):
        fg.forward.resolve_version(None, "float16", 96, False, (9, 0))


def test_kernel_diff_shows_only_what_a_version_changed():
    from flashref.gpu.forward_versions import base_of, kernel_diff

    assert base_of(4) == 3 and base_of(9) == 6 and base_of(17) == 14
    diff = kernel_diff(14, 17).splitlines()
    assert diff[:2] == ["--- v14_lazy_rescale.cu", "+++ v17_causal_skip.cu"]
    changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("---", "+++"))]
    assert any("c0 > q0 + wrow0" in line for line in changed)  # the change itself
    assert len(changed) <= 6  # the re-indented block in between is not a change
    assert "LDS (D + 8)" in kernel_diff(3, 4)


def test_persistent_version_registry_and_grid():
    """Version 27: versions 23 / 26's tiles (Bc = 128, three stages at both head dims), launched
    on min(work tiles, SMs) blocks; every other version on one block per work tile."""
    from flashref.gpu.forward_versions import base_of

    ver = fg.VERSIONS[27]
    assert ver.persistent and ver.arch == "sm_90a" and ver.tma and base_of(27) == 26
    assert ver.threads == 3 * 128 and ver.Br == 128 and ver.head_dims == (64, 128)
    assert (ver.Bc(64), ver.Bc(128), ver.stages(64), ver.stages(128)) == (128, 128, 3, 3)
    assert (
        ver.smem_bytes(128) == fg.VERSIONS[26].smem_bytes(128) == 2 * (128 + 6 * 128) * 128 + 1024
    )
    assert ver.smem_bytes(128) + 80 <= 227 * 1024  # + Q, q_empty and 2 x 3 stage barriers
    assert {n for n, v in fg.VERSIONS.items() if v.persistent} == {27, 28, 29, 30}
    assert ver.grid(1024, 512, 132) == (132, 1)  # 8 x 512 work tiles on 132 SMs
    assert ver.grid(1, 3, 132) == (3, 1)  # fewer work tiles than SMs: one block each
    assert ver.grid(129, 1, 132) == (2, 1)
    assert fg.VERSIONS[26].grid(1000, 6, 132) == (8, 6)
    for bad, match in [
        ((0, 3, 132), "Nq must be an int >= 1, got 0"),
        ((5, 3, 0), "sm_count must be an int >= 1, got 0"),
        ((5, 3.0, 132), "BH must be an int >= 1, got 3.0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            ver.grid(*bad)
    text = ver.path.read_text()
    assert "#define KV_STAGES 3" in text and "#define Bc 128" in text
    assert "int BH)" in text  # the extra argument launch() passes to a persistent version


def test_persistent_three_consumer_version_registry_and_grid():
    """Version 28: version 24's block (three consumer warpgroups, Br = 192, d = 64 only) on
    min(work tiles, SMs) blocks."""
    from flashref.gpu.forward_versions import HOPPER_PREFERENCE, PREFERENCE, base_of

    ver, v24 = fg.VERSIONS[28], fg.VERSIONS[24]
    assert ver.persistent and ver.arch == "sm_90a" and ver.tma and base_of(28) == 24
    assert ver.runs_on((9, 0)) and not ver.runs_on((10, 0)) and ver.min_cc == (9, 0)
    assert ver.dtypes == ("float16", "bfloat16") and ver.head_dims == (64,)
    assert (ver.threads, ver.Br, ver.Bc(64), ver.stages(64)) == (4 * 128, 192, 128, 3)
    assert ver.smem_bytes(64) == v24.smem_bytes(64) == 2 * (192 + 6 * 128) * 64 + 1024
    assert ver.grid(1024, 512, 132) == (132, 1)  # 6 x 512 work tiles on 132 SMs
    assert ver.grid(4097, 1, 132) == (22, 1)  # ceil(4097 / 192) work tiles: one block each
    assert ver.grid(1, 3, 132) == (3, 1) and ver.grid(193, 1, 132) == (2, 1)
    assert v24.grid(4097, 8, 132) == (22, 8)
    for dtype in ver.dtypes:  # d = 128 is refused by name before any GPU work, as for v24
        with pytest.raises(ValueError, match=r"head dim d=128; version 28 supports d in \(64,\)"):
            fg.forward.resolve_version(28, dtype, 128)
        assert fg.forward.resolve_version(28, dtype, 64) is ver
    assert 28 not in PREFERENCE.values() and 28 not in HOPPER_PREFERENCE.values()
    text = ver.path.read_text()
    assert "int BH)" in text and "flash_v28(" in text and "#define CONSUMER_REGS 160" in text


def test_lean_loop_version_registry_and_source():
    """Version 29: version 27's block, tiles, grid and schedule; the consumer's descriptors made
    once per block (each use adds a constant), the stage as a running counter, the row max as a
    tree, four row-sum chains, P packed before the turn, the producer's waits with a sleep."""
    from flashref.gpu.forward_versions import PREFERENCE, base_of

    ver, v27 = fg.VERSIONS[29], fg.VERSIONS[27]
    assert ver.persistent and ver.arch == "sm_90a" and ver.tma and base_of(29) == 27
    assert (ver.dtypes, ver.head_dims, ver.threads, ver.Br) == (v27.dtypes, v27.head_dims, 384, 128)
    for d in (64, 128):
        assert (ver.Bc(d), ver.stages(d), ver.smem_bytes(d)) == (
            v27.Bc(d),
            v27.stages(d),
            v27.smem_bytes(d),
        )
    assert ver.grid(1024, 512, 132) == v27.grid(1024, 512, 132) == (132, 1)
    assert 29 not in PREFERENCE.values()  # sm_90a only: not for other GPUs
    text = ver.source()  # with its headers (consumer_loop.cuh, tile_scheduler.cuh) pasted in
    kernel = text.split('extern "C" __global__')[1]
    assert "flash_v29(" in text and "int BH)" in text
    issue = text.split("__device__ __forceinline__ void qk_issue")[1].split("// P's A fragments")[0]
    issue += text.split("__device__ __forceinline__ void pv_issue")[1].split("// the maximum")[0]
    assert "desc_kmajor_sw128" not in issue and "desc_mnmajor_sw128" not in issue
    assert issue.count("+ desc_step(") == 3  # Q, K and V: base + a compile-time step
    consumer = text.split("setmaxnreg_inc<CONSUMER_REGS>")[1].split("// finish:")[0]
    before_loop, loop = consumer.split("for (int item", 1)
    assert before_loop.count("desc_kmajor_sw128(") == 2 and "desc_mnmajor_sw128(" in before_loop
    assert "desc_" not in loop.replace("DESC_STAGE", "")  # no descriptor built per tile
    assert "__shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0)" in text  # a uniform warpgroup
    assert "max_tree<Bc / 8>(v)" in text and "part[i % 4]" in text
    # P is packed right after the softmax of S_0 and after each wait for the previous P V,
    # never between the wait for a stage and the turn's products
    assert loop.count("pack_p(p, s);") == 2
    turn = loop.split("for (int it = 1; it < n_mine; it++) {")[1].split("wgmma_wait<0>();")[0]
    assert "pack_p" not in turn
    assert kernel.count("mbar_wait_suspend(") == 2 and "mbar_wait(empty0" not in kernel
    header = fg.VERSIONS[29].path.read_text().split("#ifndef HEAD_DIM")[0]
    assert "What changes from version 27" in header and not re.search(r"\d+(\.\d+)?x\b", header)


def test_lean3_version_registry_and_source():
    """Version 30: version 28's block, tiles, grid, registers and schedule, with version 29's
    five changes: descriptors made once per block (each use adds a constant), the stage as a
    running counter, the row max as a tree and four row-sum chains, P packed right after the
    wait for the previous P V, the producer's waits with a sleep."""
    from flashref.gpu.forward_versions import PREFERENCE, base_of

    ver, v28 = fg.VERSIONS[30], fg.VERSIONS[28]
    assert ver.persistent and ver.arch == "sm_90a" and ver.tma and base_of(30) == 28
    assert (ver.dtypes, ver.head_dims, ver.threads, ver.Br) == (v28.dtypes, (64,), 512, 192)
    assert (ver.Bc(64), ver.stages(64), ver.smem_bytes(64)) == (
        v28.Bc(64),
        v28.stages(64),
        v28.smem_bytes(64),
    )
    for args in ((1024, 512, 132), (4097, 1, 132), (1, 3, 132)):
        assert ver.grid(*args) == v28.grid(*args), args
    for dtype in ver.dtypes:  # d = 128 is refused by name before any GPU work, as for v28
        with pytest.raises(ValueError, match=r"head dim d=128; version 30 supports d in \(64,\)"):
            fg.forward.resolve_version(30, dtype, 128)
    assert 30 not in PREFERENCE.values()  # sm_90a only: not for other GPUs
    text = ver.source()  # with its headers (consumer_loop.cuh, tile_scheduler.cuh) pasted in
    kernel = text.split('extern "C" __global__')[1]
    assert "flash_v30(" in text and "int BH)" in text
    assert "#define NWG 3" in text and "#define CONSUMER_REGS 160" in text
    assert "#define PRODUCER_REGS 24" in text
    issue = text.split("__device__ __forceinline__ void qk_issue")[1].split("// P's A fragments")[0]
    issue += text.split("__device__ __forceinline__ void pv_issue")[1].split("// the maximum")[0]
    assert "desc_kmajor_sw128" not in issue and "desc_mnmajor_sw128" not in issue
    assert issue.count("+ desc_step(") == 3  # Q, K and V: base + a compile-time step
    consumer = text.split("setmaxnreg_inc<CONSUMER_REGS>")[1].split("// finish:")[0]
    before_loop, loop = consumer.split("for (int item", 1)
    assert before_loop.count("desc_kmajor_sw128(") == 2 and "desc_mnmajor_sw128(" in before_loop
    assert "desc_kmajor_sw128(Qs + cw * 64 * 128, 0)" in before_loop  # this warpgroup's rows
    assert "desc_" not in loop.replace("DESC_STAGE", "")  # no descriptor built per tile
    assert "__shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0)" in text  # a uniform warpgroup
    assert "max_tree<Bc / 8>(v)" in text and "part[i % 4]" in text
    # P is packed right after the softmax of S_0 and after each wait for the previous P V,
    # never between the wait for a stage and the products that follow it
    assert loop.count("pack_p(p, s);") == 2
    body = loop.split("for (int it = 1; it < n_mine; it++) {")[1]
    assert "pack_p" not in body.split("wgmma_wait<0>();")[0]
    assert re.search(r"wgmma_wait<0>\(\);\s+wgmma_fence_acc\(o\);\s+pack_p\(p, s\);", body)
    assert kernel.count("mbar_wait_suspend(") == 2 and "mbar_wait(empty0" not in kernel
    assert "mbar_wait(q_empty" not in kernel
    header = ver.path.read_text().split("#ifndef HEAD_DIM")[0]
    assert "What changes from version 28" in header and "version 29" in header
    assert not re.search(r"\d+(\.\d+)?x\b", header)  # no measured ratio in the header


def test_hopper_header_keeps_mbar_wait_beside_the_suspending_wait():
    """mbar_wait is unchanged (the other versions' PTX stays the same); the new wait passes
    try_wait's suspendTimeHint operand."""
    cuh = (fg.KERNEL_DIR / "common" / "hopper_common.cuh").read_text()
    plain = cuh.split("void mbar_wait(u32 bar, u32 parity)")[1].split("\n}\n")[0]
    assert "shared::cta.b64 p, [%1], %2;" in plain and "%3" not in plain
    suspend = cuh.split("void mbar_wait_suspend(u32 bar, u32 parity, u32 suspend_ns)")[1]
    suspend = suspend.split("\n}\n")[0]
    assert "shared::cta.b64 p, [%1], %2, %3;" in suspend and '"r"(suspend_ns)' in suspend


def test_persistent_block_cap_from_the_environment():
    from flashref.gpu.forward_versions import max_persistent_blocks

    assert max_persistent_blocks(None) is None and max_persistent_blocks("") is None
    assert max_persistent_blocks("3") == 3
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(ValueError, match="FLASHREF_MAX_PERSISTENT_BLOCKS must be an integer"):
            max_persistent_blocks(bad)


@pytest.mark.parametrize("call", ["forward", "backward"])
def test_causal_spellings_on_the_gpu_follow_the_cpu_rule(no_cupy, call):
    """The kernels mask top-left: ``"top_left"`` passes the checks, ``"bottom_right"`` passes
    where it is the same mask (``Nq == Nk``) and is refused before any GPU work, naming the
    kernels, where it is not."""
    q, k = np.zeros((1, 2, 5, 64), np.float16), np.zeros((1, 2, 7, 64), np.float16)

    def run(q, k, causal):
        if call == "forward":
            return fg.flash_attention(q, k, k, causal=causal)
        lse = np.zeros(q.shape[:-1], np.float32)
        return fg.flash_attention_backward(q, k, k, q, lse, q, causal=causal)

    name = "flash_attention" if call == "forward" else "flash_attention_backward"
    with pytest.raises(ValueError, match=rf"Nq = 5, Nk = 7\), and the mask of {name}'s kernels"):
        run(q, k, "bottom_right")
    for spelling, keys in (("top_left", k), ("bottom_right", q), (True, k)):
        with pytest.raises(fg.GPUUnavailableError):  # every check passed: the GPU is next
            run(q, keys, spelling)
