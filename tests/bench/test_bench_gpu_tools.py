# ruff: noqa: E501  (the CSV fixtures are single lines, as Nsight Compute writes them)
"""The profiler's and the benchmark's bookkeeping, which needs no GPU: parsing Nsight Compute's
CSV, splitting kernels by marker, the plans, and the clean exits without ncu or a GPU."""

from __future__ import annotations

import json
import shutil

import pytest

from flashref.bench.profile import main as profile
from flashref.bench.profile import ncu
from flashref.bench.profile import source as profile_source
from flashref.gpu import VERSIONS

RAW_CSV = """==PROF== Connected to process 1
"ID","Kernel Name","launch__grid_size","gpu__time_duration.sum","dram__bytes_read.sum","lts__t_bytes.sum","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","nsecond","byte","byte","ratio"
"0","flashref_marker","1","1,000","0","64","0"
"1","flash_v14","512","2,000,000","262,144,000","6,800,000,000","1.53"
"2","flashref_marker","2","1,000","0","64","0"
"3","gemm_kernel","64","500,000","1,000","2,000","0.5"
"4","softmax_kernel","64","1,500,000","3,000","4,000","0.7"
"""


def test_kernels_are_split_at_the_markers_and_summed(tmp_path, monkeypatch):
    log = tmp_path / "ncu.csv"
    log.write_text(RAW_CSV)
    lines = [ln for ln in RAW_CSV.splitlines() if ln.startswith('"')]
    import csv

    rows = list(csv.reader(lines))
    kernels = [{h: ncu.ncu_number(v) for h, v in zip(rows[0], r, strict=True)} for r in rows[2:]]
    groups = ncu.group_by_case(kernels, 2)
    assert [len(g) for g in groups] == [1, 2]
    one, two = ncu.summarise(groups[0]), ncu.summarise(groups[1])
    assert one["kernels"] == 1 and one["dram__bytes_read.sum"] == 262_144_000
    assert one["stalls_per_issue"] == {"wait": 1.53}
    assert two["gpu__time_duration.sum"] == 2_000_000  # summed over the case's kernels
    assert two["lts__t_bytes.sum"] == 6_000
    assert two["stalls_per_issue"] == {"wait": 0.7}  # from the longest kernel
    assert ncu.summarise([]) == {"kernels": 0}


def test_a_kernel_before_any_marker_is_an_error():
    with pytest.raises(RuntimeError, match="before the first marker"):
        ncu.group_by_case([{"Kernel Name": "flash_v1", "launch__grid_size": 4.0}], 1)


def test_io_row_has_the_schema_of_the_io_chapter():
    case = {
        "impl": "v14",
        "N": 4096,
        "B": 8,
        "H": 16,
        "d": 64,
        "causal": False,
        "dtype": "float16",
        "kernels": 1,
        "dram__bytes_read.sum": 1.0,
        "dram__bytes_write.sum": 2.0,
        "lts__t_bytes.sum": 3.0,
        "gpu__time_duration.sum": 2.5e6,
    }
    row = profile.io_row(case)
    assert row["ms"] == 2.5 and row["label"] == "flashref v14" and row["paper_shape"] is False
    assert (row["dram_read_bytes"], row["dram_write_bytes"], row["l2_bytes"]) == (1.0, 2.0, 3.0)


def test_plans_cover_every_version_and_the_paper_shape():
    plan = profile.version_plan()
    assert {c["impl"] for c in plan} == {f"v{n}" for n in VERSIONS}
    assert {c["d"] for c in plan} == {64, 128}
    assert [c["impl"] for c in profile.version_plan(only=[3, 14])] == ["v3", "v14", "v3", "v14"]
    io = profile.io_plan()
    paper = [c for c in io if c.get("paper_shape")]
    assert {(c["N"], c["B"], c["H"], c["d"]) for c in paper} == {(1024, 64, 16, 64)}
    assert {c["N"] for c in io if not c.get("paper_shape")} == set(profile.IO_NS)


SOURCE_CSV = """"Kernel Name","flash_v14",
"Address","Source","Warp Stall Sampling (All Samples)","stall_wait","stall_math","stall_wait (Not Issued)"
"0x10","HMMA.16816.F32 R4, R8, R12, R4","60","40","20","1"
"0x20","@P0 FMNMX R1, R2, R3, !PT","30","10","0","1"
"0x30","MUFU.EX2 R5, R6","10","0","0","0"
"""


def test_source_sampling_is_summarised_by_opcode():
    (kernel,) = profile_source.summarise_source_csv(SOURCE_CSV)
    assert kernel["kernel"] == "flash_v14" and kernel["samples"] == 100
    assert kernel["opcode_share"] == {"HMMA": 0.6, "FMNMX": 0.3, "MUFU": 0.1}
    assert kernel["stall_share"] == {"wait": 0.5, "math": 0.2}  # "(Not Issued)" not counted
    assert kernel["opcode_stall_share"]["HMMA"] == {"wait": 0.4, "math": 0.2}


def test_profile_without_ncu_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    from flashref.bench.cli import EXIT_MISSING

    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "p.json"
    assert profile.main(["--out", str(out)]) == EXIT_MISSING == 3
    err = capsys.readouterr().err
    assert err.startswith("python -m flashref.bench profile: ncu (Nsight Compute) is not on PATH")
    assert err.count("\n") == 1 and not out.exists()


def test_recorded_files_carry_their_provenance():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "results"
    for name in (
        "gpu_bench.json",
        "gpu_profile.json",
        "gpu_io.json",
        "gpu_cold.json",
        "gpu_stall_sampling.json",
    ):
        meta = json.loads((root / name).read_text())["meta"]
        assert meta["gpu"] and meta["date"] and meta["cupy"], name
    bench = json.loads((root / "gpu_bench.json").read_text())["meta"]
    for key in ("mma_sync_tflops", "wgmma_tflops", "l2_read_tbps", "hbm_copy_tbps"):
        assert bench["ceilings"]["roofs"][key] > 0, key


def test_bench_gpu_refuses_unknown_versions_before_any_work(capsys):
    from flashref.bench import forward as gpu

    with pytest.raises(SystemExit):
        gpu.main(["--versions", "14", "99"])
    assert "--versions must be among" in capsys.readouterr().err


def test_driver_and_runtime_versions_without_nvml(monkeypatch):
    # every recorded run reads them through flashref.bench.provenance; without NVML the
    # driver is named by the CUDA version it supports
    import builtins

    from flashref.bench.provenance import driver_version, runtime_version

    class Runtime:
        def driverGetVersion(self):
            return 13020

        def runtimeGetVersion(self):
            return 12080

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert driver_version(Runtime()) == "CUDA driver API 13.2"
    assert runtime_version(Runtime()) == "12.8"
