"""The decode bench's host and kernel times without a GPU: the rules, on made-up input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from flashref.bench import decode as bench
from flashref.bench.timing import call_time

CUDA, CPU = "cuda", "cpu"


def _event(name, us, device=CUDA):
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us)
    )


def test_kernel_time_sums_the_kernels_only():
    events = [
        _event("decode_split_kv_v6", 19.5),
        _event("decode_combine_v3", 1.75),
        _event("Memcpy HtoD (Pageable -> Device)", 3.0),
        _event("Memset (Device)", 1.0),
        _event("aten::empty", 50.0, CPU),
    ]
    assert call_time.kernel_sum_us(events, CUDA) == 21.25
    assert call_time.kernel_sum_us([_event("Memset (Device)", 1.0)], CUDA) is None


def test_host_time_is_the_median_of_calls_each_synchronised(monkeypatch):
    clock = iter([0.0, 1e-6, 1.0, 1.0 + 5e-6, 2.0, 2.0 + 3e-6])  # calls of 1, 5, 3 us
    monkeypatch.setattr(call_time.time, "perf_counter", lambda: next(clock))
    order = []
    us = call_time.host_us(lambda: order.append("run"), lambda: order.append("sync"), calls=3)
    assert us == pytest.approx(3.0, rel=1e-6)
    assert order == ["run", "sync"] * 3


def test_kernel_rows_are_the_default_versions_and_sdpa():
    assert bench.kernel_impls([1, 2, 3, 4, 5, 6, 7], cc=(9, 0)) == {
        "flashref_v7",
        "flashref_paged_v7",
        "sdpa_flash",
        "sdpa_cudnn",
    }
    assert bench.kernel_impls([1, 3], cc=(8, 0)) == {
        "flashref_v3",
        "flashref_paged_v3",
        "sdpa_flash",
        "sdpa_cudnn",
    }
    assert bench.kernel_impls([1], cc=(9, 0)) == {"sdpa_flash", "sdpa_cudnn"}


def test_table_shows_host_and_kernel_times(tmp_path, capsys):
    meta = {"gpu": "G", "hbm_read_gbps": 4000.0, "hbm_copy_gbps": 3000.0, "sm_count": 132}
    base = {"dtype": "float16", "d": 128, "B": 1, "Hq": 32, "Hkv": 8, "Nq": 1, "Nk": 4096}
    rows = [
        {
            **base,
            "impl": "flashref_v6",
            "gbps": 900.0,
            "num_splits": 8,
            "note": None,
            "ratio_to_cudnn": 0.9,
            "fraction_of_read": 0.2,
            "host_us": 41.25,
            "kernel_us": 9.125,
        },
        {
            **base,
            "impl": "flashref_v2",
            "gbps": 800.0,
            "num_splits": 8,
            "note": None,
            "ratio_to_cudnn": 0.8,
            "fraction_of_read": 0.2,
            "host_us": 40.0,
            "kernel_us": None,
        },
        {
            **base,
            "impl": "sdpa_cudnn",
            "gbps": 1000.0,
            "num_splits": None,
            "note": None,
            "ratio_to_cudnn": 1.0,
            "fraction_of_read": 0.25,
            "host_us": 52.0,
            "kernel_us": 9.0,
        },
        {
            **base,
            "impl": "sdpa_math",
            "gbps": None,
            "num_splits": None,
            "note": "refused: X",
            "ratio_to_cudnn": None,
            "fraction_of_read": None,
            "host_us": None,
            "kernel_us": None,
        },
    ]
    bench.print_table({"meta": meta, "rows": rows})
    out = capsys.readouterr().out
    assert "# microseconds per call: host time / kernel time" in out
    assert "41.2 / 9.1" in out and "40.0 / -" in out and "52.0 / 9.0" in out
    assert out.count(" - / -") == 1  # sdpa_math: neither measured
    bench.write_json({"meta": meta, "rows": rows}, tmp_path / "d.json")
    back = json.loads((tmp_path / "d.json").read_text())["rows"]
    assert [r["kernel_us"] for r in back] == [9.125, None, 9.0, None]


def test_meta_states_both_rules():
    runtime = SimpleNamespace(
        driverGetVersion=lambda: 13000,
        runtimeGetVersion=lambda: 13000,
        getDeviceProperties=lambda i: {"name": b"G"},
    )
    device = SimpleNamespace(id=0)
    cp = SimpleNamespace(
        __version__="x", cuda=SimpleNamespace(runtime=runtime, Device=lambda: device)
    )
    meta = bench.run_meta(cp, None, {"gpu": "G", "sm_count": 132}, 4000.0, 3000.0, [6])
    assert meta["gpu"] == "G" and meta["decode_versions"] == [6]  # provenance's, then its own
    assert set(meta["sources"]) == {"decode/6"}
    assert "perf_counter" in meta["host_rule"] and f"{bench.HOST_CALLS} calls" in meta["host_rule"]
    assert "torch.profiler" in meta["kernel_rule"] and "copies and memsets" in meta["kernel_rule"]
