"""flashref.gpu.flash_attention_backward without a GPU: every argument error is raised before
the GPU is looked for, with the CPU backward's words where the CPU has the same rule; the
backward registry is complete. Runs everywhere (CuPy's absence is simulated)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from reference import causal_refusal

import flashref.gpu as fg
from flashref import naive_attention_backward


def _args(dtype="float16", lead=(2, 3), Nq=16, Nk=20, d=64):
    """q, k, v, o, lse, do of consistent shapes (lse float32, as the forward returns it)."""
    q, kv = np.zeros((*lead, Nq, d), dtype), np.zeros((*lead, Nk, d), dtype)
    return [q, kv, kv.copy(), q.copy(), np.zeros((*lead, Nq), np.float32), q.copy()]


def test_good_arguments_reach_the_gpu_check(no_cupy):
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        fg.flash_attention_backward(*_args(), causal=True, scale=-0.5, version=1)
    with pytest.raises(fg.GPUUnavailableError):
        fg.flash_attention_backward(*_args(d=128))


@pytest.mark.parametrize(
    "which,shape",
    [("o", (2, 3, 15, 64)), ("do", (2, 3, 16, 32)), ("lse", (2, 3, 17)), ("lse", (2, 3, 16, 1))],
)
def test_shapes_have_the_cpu_messages(no_cupy, which, shape):
    args = _args()
    index = ["q", "k", "v", "o", "lse", "do"].index(which)
    args[index] = np.zeros(shape, args[index].dtype)
    with pytest.raises(ValueError) as cpu:
        naive_attention_backward(*args)
    with pytest.raises(ValueError) as gpu:
        fg.flash_attention_backward(*args)
    assert str(gpu.value) == str(cpu.value)
    assert str(gpu.value).startswith(f"{which} has shape {shape}")


@pytest.mark.parametrize("bad", [np.inf, 0.0, 1e300, "0.5", True], ids=repr)
def test_scale_follows_the_cpu_rule(no_cupy, bad):
    args = _args()
    with pytest.raises((TypeError, ValueError)) as cpu:
        naive_attention_backward(*args, scale=bad)
    with pytest.raises(type(cpu.value)) as gpu:
        fg.flash_attention_backward(*args, scale=bad)
    assert str(gpu.value) == str(cpu.value)


@pytest.mark.parametrize("bad", ["False", None, 1, np.int64(0)], ids=repr)
def test_causal_follows_the_cpu_rule(no_cupy, bad):
    args = _args()
    error, want = causal_refusal(bad)
    with pytest.raises(error) as cpu:
        naive_attention_backward(*args, causal=bad)
    with pytest.raises(error) as gpu:
        fg.flash_attention_backward(*args, causal=bad)
    assert str(gpu.value) == str(cpu.value) == want


def test_gpu_only_rules_name_the_argument(no_cupy):
    call = fg.flash_attention_backward
    args = _args()
    cases = [
        (dict(), {"o": args[3].astype(np.float32)}, TypeError, "o has dtype float32; expected q's"),
        (dict(), {"do": args[5].astype(np.float32)}, TypeError, "do has dtype float32"),
        (dict(), {"lse": args[4].astype(np.float16)}, TypeError, "lse has dtype float16; expe"),
        (dict(), {"o": [[0.0]]}, TypeError, "o must be a cupy.ndarray or a torch CUDA tensor"),
        (dict(version=99), {}, ValueError, r"version must be one of \[1, .*\] or None, got 99"),
        (dict(version="1"), {}, TypeError, "version must be an int or None, got str"),
        (dict(version=True), {}, TypeError, "version must be an int or None, got bool"),
    ]
    names = ["q", "k", "v", "o", "lse", "do"]
    for kwargs, replace, error, match in cases:
        a = [replace.get(n, x) for n, x in zip(names, args, strict=True)]
        with pytest.raises(error, match=match):
            call(*a, **kwargs)
    with pytest.raises(ValueError, match="q has head dim d=32; backward version 1 supports d in"):
        call(*_args(d=32))
    with pytest.raises(TypeError, match="q has dtype float32; flash_attention_backward supports"):
        call(*_args("float32"))
    a = _args()  # grouped K/V heads pass the checks: the GPU check comes next
    with pytest.raises(fg.GPUUnavailableError):
        call(a[0], a[1][:, :1], a[2][:, :1], *a[3:])
    with pytest.raises(ValueError, match="k has shape .* but q has head dim 64"):
        call(args[0], args[1][..., :32], *args[2:])


def test_backward_registry_is_complete():
    from flashref.gpu.backward_versions import DQ_ROW_BYTES, pre_post_source

    assert sorted(fg.BWD_VERSIONS) == list(range(1, len(fg.BWD_VERSIONS) + 1))
    for number, ver in fg.BWD_VERSIONS.items():
        text = ver.path.read_text()
        assert ver.number == number and ver.file.startswith(f"bwd{number:02d}_"), ver.file
        assert text.startswith(f"// backward version {number}:"), ver.file
        assert f"flash_bwd{number}(" in text
        if ver.deterministic_dq:  # its own dQ pass, and no atomics anywhere in the file
            assert f"{ver.dq_kernel}(" in text and "atomicAdd" not in text and "red_add" not in text
            assert ver.dq_smem_bytes(128) <= 227 * 1024
        elif ver.dq_bulk:  # the copy engine adds staged rows; no atomics of the threads
            assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in text
            assert not re.search(r"atomicAdd\(|red_add_v[24]\(", text) and ver.dq_kernel is None
            row = re.search(r"constexpr u32 DQ_ROW = (\d+) \* 4 \+ (\d+);", text)
            assert row and int(row[1]) * 4 + int(row[2]) == DQ_ROW_BYTES  # as smem_bytes counts
        elif ver.dq_tensor_map:  # a producer warp adds swizzled boxes through dQacc's map
            assert "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group" in text
            code = "\n".join(ver.code_lines())  # after the header comment
            assert "cp.reduce.async.bulk.global" not in code  # no plain bulk copy left
            assert not re.search(r"atomicAdd\(|red_add_v[24]\(", text) and ver.dq_kernel is None
            assert "TensorMap dqmap)" in text and "dq_stage_addr(" in text
            assert ver.dq_writer and ver.dq_stage_pad == 0 and ver.dq_stage_buffers == 1
            # d / 32 boxes of 64 rows (4 d bytes a row), once per 64 rows of a taller tile
            box = re.search(r"constexpr u32 DQ_BOX = (Br|DQR) \* 128;", text)
            assert box and (box[1] == "Br") == (ver.Br == 64), ver.number
            if ver.Br > 64:
                assert "#define DQR 64 " in text and "DQ_HALF = (D / 32) * DQ_BOX" in text
        elif ver.dq_writer:  # a producer warp adds the staged rows: 4 d + 32 bytes apart
            assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in text
            assert not re.search(r"atomicAdd\(|red_add_v[24]\(", text) and ver.dq_kernel is None
            row = re.search(r"constexpr u32 DQ_ROW = D \* 4(?: \+ (\d+))?;", text)
            assert row and int(row[1] or 0) == ver.dq_stage_pad  # as smem_bytes counts
            two = "dQs_buf = dSs_buf + NWG * 2 * DS_BYTES;  // (2, Br, DQ_ROW bytes)" in text
            assert ver.dq_stage_buffers == (2 if two else 1), ver.dq_stage_buffers
            split = "dq_issue(dq, dSs_buf + (it & 1) * DS_BYTES, Ks, cw);" in text  # its columns
            assert ver.dq_columns_split == split, ver.dq_columns_split
            assert re.search(r"dQs(_buf)? = dSs_buf \+ NWG \* 2 \* DS_BYTES;", text)  # after dS^T
        else:
            assert re.search(r"atomicAdd\(|red_add_v[24]\(", text) and ver.dq_kernel is None
        for d in ver.head_dims:  # the H100/H200 per-block opt-in limit
            assert ver.smem_bytes(d) <= 227 * 1024, (ver.number, d)
        assert '#include "' not in ver.source()  # headers pasted in, as NVRTC is given it
        defines = dict(re.findall(r"^#define (NWARPS|NWG|Br|Bc) (.+?)\s+//", text, re.MULTILINE))
        if ver.arch:  # warpgroups: a producer and NWG consumers of 64 keys each
            nwg = int(defines["NWG"])
            assert ver.threads == 128 * (nwg + 1), "threads in the registry and the .cu differ"
            assert defines["Bc"] == "(NWG * 64)", defines["Bc"]
            Bc = 64 * nwg
        else:
            nwarps = int(defines["NWARPS"])
            assert ver.threads == 32 * nwarps, "threads in the registry and the .cu file differ"
            per_warp = re.fullmatch(r"\(NWARPS \* (\d+)\)", defines["Bc"])  # keys per warp
            Bc = nwarps * int(per_warp[1]) if per_warp else int(defines["Bc"])
        assert (ver.Br, ver.Bc) == (int(defines["Br"]), Bc), "tiles in the registry and .cu differ"
        for d, blocks in ver.blocks_per_sm:  # a promise per supported head dim, once each
            assert d in ver.head_dims and blocks >= 1, (ver.number, ver.blocks_per_sm)
        assert len(dict(ver.blocks_per_sm)) == len(ver.blocks_per_sm), ver.blocks_per_sm
        if ver.blocks_per_sm:  # the kernel asks ptxas for them
            assert "__launch_bounds__(NTHREADS, MIN_BLOCKS)" in text, ver.file
    src = pre_post_source()
    assert "bwd_preprocess(" in src and "bwd_dq_convert(" in src and '#include "' not in src


def test_backward_bench_reports_missing_gpu_and_writes_nothing(no_cupy, tmp_path):
    from flashref.bench import backward

    out = tmp_path / "b.json"
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        backward.main(["--n", "1024", "--out", str(out)])
    assert not out.exists()


def test_backward_table_shows_ratios_to_both_baselines(capsys):
    from flashref.bench.backward import print_table

    def row(impl, direction, version, tflops):
        return {
            "impl": impl,
            "direction": direction,
            "version": version,
            "dtype": "float16",
            "d": 64,
            "causal": False,
            "N": 4096,
            "tflops": tflops,
        }

    rows = [
        row("flashref", "forward", 14, 240.0),
        row("flashref", "backward", 1, 150.0),
        row("sdpa_flash", "backward", None, 300.0),
        row("sdpa_cudnn", "backward", None, 500.0),
        row("sdpa_flash", "forward", None, 300.0),
    ]
    print_table({"meta": {"gpu": "a GPU", "timing": "events"}, "rows": rows})
    text = capsys.readouterr().out
    assert "flashref bwd1 " in text and "150.0 (0.50/0.30)" in text  # 150/300, 150/500
    assert "flashref fwd v14 " in text and "240.0 (0.80/-)" in text  # no cuDNN forward row
    assert "sdpa_flash bwd " in text and "sdpa_flash fwd " in text


def test_backward_versions_answer_the_capability_check():
    # flashref.gpu's capability check asks every version runs_on(cc) and its arch
    from flashref.gpu import BWD_VERSIONS

    for ver in BWD_VERSIONS.values():
        if ver.arch:  # built for one architecture: that compute capability alone
            assert ver.arch == "sm_90a" and ver.min_cc == (9, 0), (ver.number, ver.arch)
            assert ver.runs_on((9, 0)) and not ver.runs_on((10, 0)) and not ver.runs_on((8, 9))
        else:
            assert ver.runs_on((9, 0)) and ver.runs_on((8, 0)) and not ver.runs_on((7, 5))
            assert ver.nvrtc_options() == () and not ver.tma


def _fake_cp(cc: str, name: bytes):
    """A stand-in for CuPy that answers check_capability's two questions."""
    import types

    device = types.SimpleNamespace(compute_capability=cc, id=0)
    cuda = types.SimpleNamespace(
        Device=lambda *a: device,
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": name}),
    )
    return types.SimpleNamespace(cuda=cuda)


def test_wgmma_backward_registry_entry():
    """Backward version 8: sm_90a and TMA, a producer and two consumer warpgroups, Bc = 128 keys,
    query tiles of 64, dQ by atomics; its shared memory is the .cu file's layout."""
    ver = fg.BWD_VERSIONS[8]
    assert (ver.name, ver.file, ver.kernel) == ("wgmma", "bwd08_wgmma.cu", "flash_bwd8")
    assert ver.arch == "sm_90a" and ver.tma and ver.nvrtc_options() == ("-arch=sm_90a",)
    assert (ver.Bc, ver.Br, ver.threads) == (128, 64, 384) and not ver.deterministic_dq
    # each consumer warpgroup adds its 64 keys' share of dQ: two additions per key tile
    assert ver.dq_adds(1000) == 2 * 8 and ver.dq_adds(1) == 2
    assert fg.BWD_VERSIONS[7].dq_adds(1000) == 16 and fg.BWD_VERSIONS[2].dq_adds(1000) == 0
    assert len(re.findall(r"red_add_v4\(", ver.path.read_text())) == 1  # in the consumers' loop
    assert ver.head_dims == (64, 128) and ver.dtypes == ("float16", "bfloat16")
    # K_j, V_j (128, d); two stages of Q_i, dO_i (64, d); dS^T two buffers of (128, 64);
    # 16-bit, unpadded, + 1024 bytes to align the first tile
    for d in (64, 128):
        assert ver.smem_bytes(d) == 2 * (2 * 128 * d + 4 * 64 * d + 2 * 128 * 64) + 1024
    assert ver.smem_bytes(128) + 1024 + 2 * 2 * 64 * 4 + 40 <= 227 * 1024  # with static smem
    from flashref.gpu.backward_versions import BWD_PREFERENCE

    assert 8 not in BWD_PREFERENCE.values()  # the default is chosen from a recorded run


def test_wgmma_backward_refuses_other_gpus_by_name():
    """On compute capability 10.0 or 8.0, version 8 stops with the reason before any work; on
    9.0 it passes, and an mma.sync version passes everywhere from 8.0."""
    ver = fg.BWD_VERSIONS[8]
    for cc, name, shown in (("100", b"B200", "10.0"), ("80", b"A100", "8.0")):
        with pytest.raises(
            RuntimeError,
            match=rf"backward version 8 \(wgmma\) is built for "
            rf"sm_90a and needs compute capability 9\.0 exactly; this GPU "
            rf"\({name.decode()}\) has {re.escape(shown)}",
        ):
            fg._runtime.check_capability(_fake_cp(cc, name), ver)
    fg._runtime.check_capability(_fake_cp("90", b"H200"), ver)
    fg._runtime.check_capability(_fake_cp("100", b"B200"), fg.BWD_VERSIONS[7])
    with pytest.raises(
        RuntimeError,
        match=r"backward version 7 \(bc64_occupancy\) needs "
        r"compute capability 8\.0 or higher",
    ):
        fg._runtime.check_capability(_fake_cp("75", b"T4"), fg.BWD_VERSIONS[7])


def test_wgmma_backward_argument_errors_come_before_the_gpu(no_cupy):
    """version=8 goes through the same checks as every version: a bad argument is named before
    the GPU (or its compute capability) is looked at; good ones reach the missing CuPy."""
    args = _args(d=128)
    with pytest.raises(fg.GPUUnavailableError, match="CuPy is not installed"):
        fg.flash_attention_backward(*args, causal=True, version=8)
    with pytest.raises(
        ValueError, match="q has head dim d=96; backward version 8 supports d in 64, 128"
    ):
        fg.flash_attention_backward(*_args(d=96), version=8)
    with pytest.raises(TypeError, match="q has dtype float32; flash_attention_backward supports"):
        fg.flash_attention_backward(*_args(dtype="float32"), version=8)


def test_backward_profile_plan_is_every_version_at_its_head_dims():
    from flashref.bench.profile import main as profile

    plan = profile.backward_plan()
    want = [
        (f"bwd{n}", d) for d in (64, 128) for n, v in fg.BWD_VERSIONS.items() if d in v.head_dims
    ]
    assert ("bwd17", 64) in want and ("bwd17", 128) not in want  # built for d = 64 only
    assert [(c["impl"], c["d"]) for c in plan] == want
    assert all(c["dtype"] == "float16" and not c["causal"] for c in plan)
    assert all((c["B"], c["H"], c["N"]) == (8, 16, 4096) for c in plan)
    assert [c["impl"] for c in profile.backward_plan(only=[4, 5])] == ["bwd4", "bwd5"] * 2


LISTING = """\
Device NVIDIA H200 (GH100)
------------------------------------------------ ---------- ------ ------------------------
Metric Name                                      Metric Type Metric Unit Metric Description
lts__t_sectors_op_red                            Counter    sector # of LTS sectors for reductions
smsp__warps_active                               Counter    warp   # of warps active
"""


def test_available_metrics_keeps_only_names_ncu_lists():
    from flashref.bench.profile.ncu import available_metrics

    want = [
        "lts__t_sectors_op_red.sum",
        "smsp__warps_active.avg.per_cycle_active",
        "smsp__inst_executed_op_global_red.sum",
    ]
    have, missing = available_metrics(want, LISTING)
    assert have == want[:2] and missing == want[2:]
    assert available_metrics(want, "") == ([], want)  # an empty listing keeps nothing


def test_profile_backward_asks_ncu_and_writes_every_case(monkeypatch, tmp_path, capsys):
    import shutil
    import subprocess

    from flashref.bench.profile import main as profile
    from flashref.bench.profile import ncu

    seen = {}

    def fake_profile(plan, metrics):
        seen["metrics"] = metrics
        return [{**c, "kernels": 3, "lts__t_sectors_op_red.sum": 2e6} for c in plan]

    def fake_run(cmd, **kwargs):
        assert cmd == ["ncu", "--query-metrics"], cmd
        return subprocess.CompletedProcess(cmd, 0, LISTING, "")

    monkeypatch.setattr(shutil, "which", lambda name: "/opt/ncu")
    monkeypatch.setattr(fg._runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(
        profile, "run_meta", lambda cp, **measured: {"gpu": "a GPU", "measured": measured}
    )
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    monkeypatch.setattr(profile, "profile", fake_profile)
    monkeypatch.setattr(ncu, "profile", fake_profile)
    out = tmp_path / "bwd.json"
    assert profile.main(["--backward", "--versions", "5", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["impl"] for r in doc["rows"]] == ["bwd5", "bwd5"]
    assert doc["meta"]["measured"] == {"backward": [5]}  # its hashes: backward 5's alone
    assert "lts__t_sectors_op_red.sum" in seen["metrics"]
    assert "smsp__inst_executed_op_global_red.sum" not in seen["metrics"]
    assert "smsp__inst_executed_op_global_red.sum" in doc["meta"]["metrics_missing"]
    assert set(ncu.NCU_METRICS) <= set(doc["meta"]["metrics"])
    assert "L2 red sectors 2.0 M" in capsys.readouterr().out


def test_profile_backward_retries_without_its_counters_when_ncu_refuses(monkeypatch, tmp_path):
    import shutil
    import subprocess

    from flashref.bench.profile import main as profile
    from flashref.bench.profile import ncu

    calls = []

    def fake_profile(plan, metrics):
        calls.append(metrics)
        if len(calls) == 1:
            raise RuntimeError("ncu failed (1): unknown metric")
        return [{**c, "kernels": 3} for c in plan]

    monkeypatch.setattr(shutil, "which", lambda name: "/opt/ncu")
    monkeypatch.setattr(fg._runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(profile, "run_meta", lambda cp, **measured: {})
    monkeypatch.setattr(
        ncu.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "no")
    )
    monkeypatch.setattr(profile, "profile", fake_profile)
    monkeypatch.setattr(ncu, "profile", fake_profile)
    out = tmp_path / "bwd.json"
    assert profile.main(["--backward", "--out", str(out)]) == 0
    assert calls == [ncu.NCU_METRICS, ncu.NCU_METRICS]  # a failed query: none extra
    doc = json.loads(out.read_text())
    assert doc["meta"]["metrics_missing"] == list(profile.BWD_METRICS)
    assert len(doc["rows"]) == sum(len(v.head_dims) for v in fg.BWD_VERSIONS.values())


def test_default_backward_versions_follow_the_rule_on_the_recorded_run():
    """The default tables say what results/gpu_backward.json says under the book's rule
    (flashref.recorded.defaults.best_worst_case: the highest worst-case ratio to the fastest over
    the recorded sequence lengths), among every version for compute capability 9.0
    (BWD_HOPPER_PREFERENCE) and among the versions not built for sm_90a for every other GPU
    (BWD_PREFERENCE)."""
    from pathlib import Path

    from flashref.gpu.backward_versions import BWD_HOPPER_PREFERENCE, BWD_PREFERENCE, BWD_VERSIONS
    from flashref.recorded.backward import load_backward
    from flashref.recorded.defaults import best_backward

    _, rows = load_backward(Path(__file__).resolve().parents[2] / "results" / "gpu_backward.json")
    on_hopper = best_backward(rows, BWD_VERSIONS)
    elsewhere = best_backward(rows, [n for n, v in BWD_VERSIONS.items() if not v.arch])
    assert set(on_hopper) == set(BWD_PREFERENCE) == set(BWD_HOPPER_PREFERENCE), "other cases"
    assert on_hopper == BWD_HOPPER_PREFERENCE
    assert elsewhere == BWD_PREFERENCE


def test_default_backward_version_depends_on_the_compute_capability():
    from flashref.gpu.backward import resolve_bwd_version
    from flashref.gpu.backward_versions import BWD_HOPPER_PREFERENCE, BWD_PREFERENCE, BWD_VERSIONS

    for (dtype, d, causal), number in BWD_HOPPER_PREFERENCE.items():
        ver = resolve_bwd_version(None, dtype, d, causal, (9, 0))
        assert ver.number == number and ver.runs_on((9, 0))
        for cc in ((8, 0), (8, 9), (10, 0), None):
            other = resolve_bwd_version(None, dtype, d, causal, cc)
            assert other.number == BWD_PREFERENCE[dtype, d, causal]
            assert not BWD_VERSIONS[other.number].arch  # runs on any of them
    with pytest.raises(ValueError, match="head dim d=96"):
        resolve_bwd_version(None, "float16", 96, False, (9, 0))


def test_wgmma_backward_tensor_maps_in_the_kernels_order(monkeypatch):
    """launch_backward passes version 8 the maps of Q, K, V, dO (boxes of Br, Bc, Bc, Br rows
    over (B*H*N, d) views) in the order of the kernel's parameters after ``causal``."""
    import sys
    import types

    from flashref.gpu.backward import _tma_maps

    made = []
    fake = types.ModuleType("flashref.gpu._launch")
    fake.tensor_map_of = lambda x2, box_rows: made.append((x2.shape, box_rows)) or len(made)
    monkeypatch.setitem(sys.modules, "flashref.gpu._launch", fake)
    ver = fg.BWD_VERSIONS[8]
    q, k = np.zeros((6, 100, 64)), np.zeros((6, 37, 64))
    assert _tma_maps(ver, q, k, k + 1, q + 1, 64) == (1, 2, 3, 4)
    assert made == [((600, 64), 64), ((222, 64), 128), ((222, 64), 128), ((600, 64), 64)]
    text = ver.path.read_text()
    params = re.findall(r"const __grid_constant__ TensorMap (\w+)", text)
    assert params == ["qmap", "kmap", "vmap", "domap"], params
    assert re.search(r"int Nq, int Nk, float scale, int causal,\s+const __grid_constant__", text)


@pytest.mark.parametrize("backward", [False, True])
def test_profile_source_samples_the_version_it_names(monkeypatch, tmp_path, backward):
    """``profile --source N`` samples forward version N's kernels; with ``--backward``,
    backward version N's main kernel alone (ncu's -k), as a ``bwdN`` case of the target."""
    import shutil

    from flashref.bench.profile import main as profile
    from flashref.bench.profile import source

    seen = {}

    def fake_source_profile(plan, workdir, kernel="regex:^flash_v"):
        seen["plan"], seen["kernel"] = plan, kernel
        return [{"kernel": kernel, "samples": 1.0} for _ in plan]

    monkeypatch.setattr(shutil, "which", lambda name: "/opt/ncu")
    monkeypatch.setattr(fg._runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(profile, "run_meta", lambda cp, **measured: {})
    monkeypatch.setattr(source, "source_profile", fake_source_profile)
    out = tmp_path / "src.json"
    argv = ["--source", "11", "--source-out", str(out), *(["--backward"] if backward else [])]
    assert profile.main(argv) == 0
    impl, kernel = ("bwd11", "regex:^flash_bwd11$") if backward else ("v11", "regex:^flash_v")
    assert [c["impl"] for c in seen["plan"]] == [impl, impl]
    assert [c["d"] for c in seen["plan"]] == [128, 64]
    assert seen["kernel"] == kernel
    assert [r["impl"] for r in json.loads(out.read_text())["rows"]] == [impl, impl]
    if backward:  # a version built for d = 64 alone is sampled there alone
        assert profile.main(["--source", "17", "--source-out", str(out), "--backward"]) == 0
        assert [(c["impl"], c["d"]) for c in seen["plan"]] == [("bwd17", 64)]
    seen.clear()
    with pytest.raises(SystemExit):  # an unknown version: the parser's error, nothing run
        profile.main(["--source", "99", "--source-out", str(out), *argv[4:]])
    assert not seen


def test_a_profile_records_the_hashes_of_the_family_it_measured_only():
    """A backward profile that recorded the forward versions' hashes too went stale with every
    forward edit; each mode now names only what it measures."""
    from flashref.bench.profile import main as profile

    parse = profile.build_parser()  # the command line main parses
    cases = {
        "--backward": {"backward": "all"},
        "--backward --versions 8 11": {"backward": [8, 11]},
        "--backward --source 11": {"backward": [11]},
        "--decode --versions 7": {"decode": [7]},
        "--hopper --versions 29": {"forward": [14, 29]},
        "--versions 3": {"forward": [3, *profile.IO_FLASH_VERSIONS]},
        "--versions 3 --skip-io": {"forward": [3]},
        "--source 29": {"forward": [29]},
        "": {"forward": "all"},
    }
    for argv, want in cases.items():
        assert profile.measured_families(parse.parse_args(argv.split())) == want, argv
