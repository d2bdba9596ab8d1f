"""Reading results/gpu_training.json, gpu_backward.json and its profile, on synthetic files.

The numbers here are made up for the test and live under pytest's tmp_path only.
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from flashref.recorded.backward import (
    against_flash_lines,
    backward_bench,
    backward_profile,
    backward_table,
    load_backward,
    ratios_to_flash,
    stall_sampling_lines,
)
from flashref.recorded.defaults import best_backward
from flashref.recorded.kernel_runs import counter_lines, step_verdict
from flashref.recorded.training import (
    load_step_profile,
    load_training,
    step_profile_lines,
    training_lines,
    training_summary,
)

STEPS = 60


def _run(attention, seed, start, val):
    loss = [start - 0.01 * i for i in range(STEPS)]
    return {
        "attention": attention,
        "seed": seed,
        "loss": loss,
        "val_loss": val,
        "first_step_s": 1.5,
        "s_per_step": 0.01,
    }


def _training():
    meta = {
        "gpu": "a GPU",
        "driver": "1.0",
        "torch": "2.11",
        "cupy": "14",
        "date": "2026-12-01",
        "model": {"n_layers": 4},
        "steps": STEPS,
        "dtype": "bfloat16",
    }
    runs = [_run("flashref", 0, 4.5, 2.1), _run("sdpa", 0, 4.52, 2.0), _run("sdpa", 1, 4.0, 2.5)]
    return {"meta": meta, "runs": runs}


def _write(tmp_path, data, name="f.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_training_file_and_summary(tmp_path):
    meta, runs = load_training(_write(tmp_path, _training()))
    assert meta["steps"] == STEPS and len(runs) == 3
    s = training_summary(runs, window=10)
    assert s["flashref"] is runs[0] and s["sdpa"] is runs[1] and s["other_seed"] is runs[2]
    assert math.isclose(s["end_gap"], 0.02) and math.isclose(s["max_step_gap"], 0.02)
    assert math.isclose(s["val_gap"], 0.1) and math.isclose(s["seed_val_gap"], 0.5)
    assert math.isclose(s["seed_end_gap"], 0.52)


def _step_run(side, step_ms, host_ms, done_ms, gpu_us, attention_us):
    return {
        "attention": side,
        "step_ms": step_ms,
        "forward_backward_host_ms": host_ms,
        "forward_backward_done_ms": done_ms,
        "profile": {"cpu_us": 9000.0, "gpu_us": gpu_us, "attention_us": attention_us},
    }


def _step_profile():
    meta = {"gpu": "a GPU", "date": "2026-12-02", "commit": "abcdef0123"}
    runs = [
        _step_run("flashref", 12.0, 11.0, 11.05, 6600.0, [300.0, 500.0]),
        _step_run("sdpa", 11.0, 10.0, 10.02, 6400.0, [250.0, 250.0]),
        _step_run("flashref", 14.0, 13.0, 13.08, 7000.0, [320.0, 580.0]),
        _step_run("sdpa", 13.0, 12.0, 12.01, 6500.0, [240.0, 260.0]),
    ]
    return {"meta": meta, "runs": runs}


def test_step_profile_lines(tmp_path):
    meta, runs = load_step_profile(_write(tmp_path, _step_profile()))
    lines = step_profile_lines(meta, runs)
    assert lines[0] == "a GPU, 2026-12-02, commit abcdef0: 2 rounds a side, interleaved"
    clocked = dict(meta, sm_clock={"median_mhz": 1980, "min_mhz": 1980, "max_mhz": 1980})
    assert step_profile_lines(clocked, runs)[0] == (
        "a GPU, 2026-12-02, commit abcdef0, SM 1980 MHz: 2 rounds a side, interleaved"
    )
    assert lines[2].split() == [
        "flashref",
        "12.0",
        "14.0",
        "11.0",
        "13.0",
        "11.1",
        "13.1",
        "6.6",
        "7.0",
        "800",
        "900",
    ]
    assert lines[3].split()[0] == "sdpa" and lines[3].split()[-2:] == ["500", "500"]
    assert lines[4] == "the GPU done at most 0.08 ms after the host, under 2% of a step: True"
    assert lines[5] == "attention's ranges, flashref minus SDPA (medians): +0.35 ms a step"
    late = _step_profile()
    late["runs"][3]["forward_backward_done_ms"] = 12.5  # the GPU busy 0.5 ms after the host
    assert step_profile_lines(*load_step_profile(_write(tmp_path, late)))[4] == (
        "the GPU done at most 0.50 ms after the host, under 2% of a step: False"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["runs"].pop(1) and d["runs"].pop(2), r"runs of \['flashref'\]"),
        (lambda d: d["runs"][0]["profile"].update(attention_us=[1.0]), "expected two numbers"),
        (lambda d: d["runs"][0]["profile"].update(attention_us=None), "attention_us"),
        (lambda d: d["runs"][2].pop("step_ms"), r"runs\[2\] has no 'step_ms'"),
        (lambda d: d["meta"].pop("commit"), "meta has no 'commit'"),
    ],
)
def test_a_broken_step_profile_is_named(tmp_path, change, message):
    data = _step_profile()
    change(data)
    with pytest.raises(ValueError, match=message):
        load_step_profile(_write(tmp_path, data))


def test_training_summary_without_another_seed(tmp_path):
    data = _training()
    data["runs"] = data["runs"][:2][::-1]  # the order of the runs does not matter
    _, runs = load_training(_write(tmp_path, data))
    s = training_summary(runs)
    assert s["other_seed"] is None and "seed_val_gap" not in s
    assert s["flashref"]["attention"] == "flashref"


def _broken(change):
    data = _training()
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("meta"), "has no 'meta'"),
        (lambda d: d["meta"].pop("gpu"), r"meta has no 'gpu'"),
        (lambda d: d["meta"].update(steps=True), r"meta\['steps'\] = True"),
        (lambda d: d["runs"][1].pop("val_loss"), r"runs\[1\] has no 'val_loss'"),
        (lambda d: d["runs"][0]["loss"].pop(), r"runs\[0\] has 59 losses; meta says 60"),
        (lambda d: d["runs"][2]["loss"].__setitem__(7, "x"), r"runs\[2\]\['loss'\]\[7\]"),
        (lambda d: d["runs"][0].update(val_loss=-1), "expected a number >= 0"),
        (lambda d: d["runs"][1].update(seed=5), "no flashref run with an SDPA run"),
    ],
)
def test_broken_training_files_are_named(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        load_training(_write(tmp_path, _broken(change)))


def test_nan_is_not_a_measurement(tmp_path):
    path = tmp_path / "nan.json"
    data = _training()
    data["runs"][0]["loss"][3] = math.nan
    path.write_text(json.dumps(data))  # json writes NaN, which is not JSON
    assert "NaN" in path.read_text()
    with pytest.raises(ValueError, match="NaN is not a measurement"):
        load_training(path)


def _bwd_row(impl, version, N, tflops, direction="backward", causal=False):
    return {
        "impl": impl,
        "direction": direction,
        "version": version,
        "dtype": "float16",
        "d": 64,
        "causal": causal,
        "N": N,
        "B": 8,
        "H": 16,
        "ms": 1.0,
        "ms_min": 0.9,
        "ms_max": 1.1,
        "tflops": tflops,
    }


def _backward():
    rows = [
        _bwd_row("flashref", 3, 4096, 240.0),
        _bwd_row("sdpa_flash", None, 4096, 300.0),
        _bwd_row("sdpa_cudnn", None, 4096, 480.0),
        _bwd_row("flashref", 3, 16384, 150.0, causal=True),
        _bwd_row("sdpa_flash", None, 16384, 200.0, causal=True),
        _bwd_row("flashref", 18, 4096, 500.0, direction="forward"),
    ]
    return {"meta": {"gpu": "a GPU", "driver": "1.0", "date": "2026-12-01"}, "rows": rows}


def test_backward_table(tmp_path):
    meta, rows = load_backward(_write(tmp_path, _backward()))
    lines = backward_table(rows)
    assert lines[0].startswith("backward: TFLOP/s")
    blocks = "\n".join(lines[1:]).strip().split("\n\n")  # one per (dtype, d, causal)
    full, causal = (b.splitlines() for b in blocks)
    assert full[0].split() == [
        "float16,",
        "d",
        "=",
        "64,",
        "causal",
        "False",
        "N",
        "=",
        "4096",
        "N",
        "=",
        "16384",
    ]
    # bwd3 at 4096: 240 TFLOP/s, 240 / 480 to cuDNN, 240 / 300 to FLASH; no row at 16384
    assert full[1].split() == ["bwd3", "240", "0.50", "0.80", "-"]
    assert full[2].split() == ["SDPA", "FLASH", "300", "0.62", "1.00", "-"]
    assert full[3].split() == ["SDPA", "cuDNN", "480", "1.00", "1.60", "-"]
    assert causal[1].split() == ["bwd3", "-", "150", "-", "0.75"]  # no cuDNN row to divide by
    assert causal[3].split() == ["SDPA", "cuDNN", "-", "-"]
    ratios = ratios_to_flash(rows)
    assert [(r["N"], x) for r, x in ratios] == [(4096, 0.8), (16384, 0.75)]
    assert ratios_to_flash(rows, "forward") == []  # no FLASH forward row to divide by
    forward = backward_table(rows, direction="forward")
    assert forward[3].split() == ["v18", "500", "-", "-"]  # no SDPA forward rows
    with pytest.raises(ValueError, match="direction must be one of"):
        backward_table(rows, direction="sideways")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["rows"][0].update(impl="v3"), r"rows\[0\]\['impl'\] = 'v3'"),
        (lambda d: d["rows"][1].update(direction="up"), r"rows\[1\]\['direction'\] = 'up'"),
        (lambda d: d["rows"][2].pop("version"), r"rows\[2\] has no 'version'"),
        (lambda d: d["rows"][3].update(causal=1), r"rows\[3\]\['causal'\] = 1"),
        (lambda d: d["rows"][4].update(tflops=None), r"rows\[4\]\['tflops'\] = None"),
        (lambda d: d["meta"].pop("date"), "meta has no 'date'"),
    ],
)
def test_broken_backward_files_are_named(tmp_path, change, message):
    data = copy.deepcopy(_backward())
    change(data)
    with pytest.raises(ValueError, match=message):
        load_backward(_write(tmp_path, data))


# ---- the backward run handed to flashref.recorded.kernel_runs ----------------------------------


def _rounds_row(impl, version, N, tflops, rounds, causal=False, dtype="float16"):
    row = _bwd_row(impl, version, N, tflops, causal=causal)
    return {**row, "dtype": dtype, "round_ms": rounds}


def _stepped():
    """Versions 1 and 2 at three shapes: 2's rounds all faster at two, overlapping at one;
    version 3 (sm_90a in the made-up registry below) faster than both everywhere."""
    rows = []
    for N, (a, b) in {
        1024: ([1.0, 1.1], [0.8, 0.85]),
        4096: ([2.0, 2.1], [1.6, 1.7]),
        16384: ([4.0, 4.4], [4.1, 4.2]),
    }.items():
        rows.append(_rounds_row("flashref", 1, N, 100.0 / a[0], a))
        rows.append(_rounds_row("flashref", 2, N, 100.0 / b[0], b))
        rows.append(_rounds_row("flashref", 3, N, 1000.0, [0.1, 0.11]))
        rows.append(_rounds_row("sdpa_flash", None, N, 110.0, [0.9, 0.95]))
        rows.append(_rounds_row("sdpa_cudnn", None, N, 200.0, [0.5, 0.55]))
    rows.append(_rounds_row("flashref", 24, 4096, 500.0, [0.1, 0.1]) | {"direction": "forward"})
    return {"meta": {"gpu": "a GPU", "driver": "1.0", "date": "2026-12-01"}, "rows": rows}


def test_backward_bench_is_judged_by_chapter_5s_rule(tmp_path):
    bench = backward_bench(_write(tmp_path, _stepped()))
    assert bench.dtypes == ("float16",) and bench.Ns == (1024, 4096, 16384)
    assert bench.version(2, "float16", 64, False, 4096)["round_ms"] == [1.6, 1.7]
    assert bench.row("sdpa_flash", "float16", 64, False, 4096)["tflops"] == 110.0
    assert not any(r["impl"] == "v24" for r in bench.rows)  # the forward row left out
    word, counts = step_verdict(bench, 1, 2, 64, False, control=0.5)
    assert (word, counts["faster"], counts["within the spread"]) == ("gain", 2, 1)
    assert step_verdict(bench, 1, 2, 64, False, control=0.7)[0] == "within the spread"
    assert step_verdict(bench, 2, 1, 64, False, control=0.5)[0] == "loss"


def test_backward_bench_names_a_row_without_rounds(tmp_path):
    data = _stepped()
    del data["rows"][4]["round_ms"]
    with pytest.raises(ValueError, match=r"rows\[4\] has no rounds"):
        backward_bench(_write(tmp_path, data))


def test_backward_profile_prints_backward_versions(tmp_path):
    rows = [
        {"impl": f"bwd{n}", "d": 64, "lts__t_requests_op_red.sum": r * 1e6}
        for n, r in ((1, 800.0), (2, 0.0))
    ]
    profile = backward_profile(_write(tmp_path, {"meta": {}, "rows": rows}))
    lines = counter_lines(profile, (1, 2), ["L2 reduction requests, M"], ratio=True)
    assert lines[1].split()[-3:] == ["800.0", "0.0", "0.00x"]
    bad = {"meta": {}, "rows": [{"impl": "v1", "d": 64}]}
    with pytest.raises(ValueError, match=r"rows\[0\]\['impl'\] = 'v1'; expected 'bwd<n>'"):
        backward_profile(_write(tmp_path, bad, "bad.json"))


def test_best_backward_and_against_flash(tmp_path):
    _, rows = load_backward(_write(tmp_path, _stepped()))
    assert best_backward(rows, (1, 2)) == {("float16", 64, False): 2}
    assert best_backward(rows, (1, 2, 3)) == {("float16", 64, False): 3}
    picks = {
        "two": lambda dtype, d, causal, N, got: 2,
        "none": lambda dtype, d, causal, N, got: None,
    }
    lines = against_flash_lines(rows, picks, target=0.8, goal=1.0)
    assert lines[0] == "N >= 4096, 2 configurations, TFLOP/s over SDPA FLASH's:"
    # version 2: 100 / 1.6 = 62.5 and 100 / 4.1 = 24.4 TFLOP/s against FLASH's 110
    assert lines[1] == "  two (bwd2): 0.22 to 0.57; >= 0.8 at 0 of 2, >= 1.0 at 0 of 2"
    assert lines[2] == "    over cuDNN's: 0.12 to 0.31"
    # both below the goal: FLASH's rounds (0.9, 0.95 ms) all faster than version 2's
    assert lines[3].endswith("N = 4096: 0.568, rounds slower")
    assert lines[-1] == "  none: not in this file"


def test_training_lines_say_both_results(tmp_path):
    meta, runs = load_training(_write(tmp_path, _training()))
    runs[0]["s_per_step"] = 0.02  # flashref's step twice SDPA's
    lines = training_lines(meta, runs, training_summary(runs))
    assert lines[-2] == "flashref's validation loss as close to SDPA's as two seeds' are: True"
    assert lines[-1] == "flashref's step over SDPA's, same seed: 2.00"
    assert lines[2].split()[:4] == ["flashref,", "seed", "0", "20.0"]
    meta["sm_clock"] = {"median_mhz": 1980, "min_mhz": 1965, "max_mhz": 1980, "samples": 9}
    clocked = training_lines(meta, runs, training_summary(runs))
    assert clocked[0] == "a GPU, torch 2.11, 2026-12-01, SM 1965-1980 MHz:"
    assert clocked[1] == "  4 layers, d_model None, 60 steps in bfloat16"
    assert clocked[2:] == lines[1:]


def test_stall_sampling_lines(tmp_path):
    def write(name, rows):
        return _write(tmp_path, {"meta": {}, "rows": rows}, name)

    a = write(
        "a.json",
        [
            {"d": 64, "stall_share": {"wait": 0.5, "barrier": 0.2, "selected": 0.3}},
            {"d": 128, "stall_share": {"wait": 0.4, "barrier": 0.4}},
        ],
    )
    b = write("b.json", [{"d": 64, "stall_share": {"barrier": 0.1}}])
    lines = stall_sampling_lines({"bwd8": a, "bwd11": b}, top=2)
    # the two largest shares anywhere: wait (0.5), then barrier (0.4 at d = 128)
    assert lines[0].split() == ["share", "of", "samples", "wait", "barrier"]
    assert lines[1].split() == ["bwd8", "d", "=", "64", "50.0%", "20.0%"]
    assert lines[2].split() == ["bwd11", "d", "=", "64", "0.0%", "10.0%"]
    assert lines[3].split() == ["bwd8", "d", "=", "128", "40.0%", "40.0%"]
    with pytest.raises(ValueError, match="no rows with stall shares"):
        stall_sampling_lines({"x": write("c.json", [])})


def test_public_against_cudnn_lines_counts_the_targets():
    from flashref.recorded.backward import public_against_cudnn_lines

    def row(impl, N, tflops, version=None, causal=False):
        return {
            "impl": impl,
            "direction": "backward",
            "dtype": "float16",
            "d": 64,
            "causal": causal,
            "N": N,
            "version": version,
            "tflops": tflops,
        }

    rows = [row("sdpa_cudnn", n, 100.0, causal=c) for n in (1024, 4096) for c in (False, True)]
    rows += [
        row("flashref_public", 4096, 95.0, 14),
        row("flashref_public", 4096, 80.0, 11, True),
        row("flashref_public", 1024, 79.0, 11),
        row("flashref", 1024, 200.0, 11),
    ]
    lines = public_against_cudnn_lines(rows)
    assert lines == [
        "N >= 4096: public call over cuDNN's 0.80 to 0.95; >= 0.9 at 1 of 2 (bwd11, bwd14)",
        "N = 1024: public call over cuDNN's 0.79 to 0.79; >= 0.8 at 0 of 1 (bwd11)",
    ]
    assert public_against_cudnn_lines(rows[:4]) == ["no flashref_public rows in this file"]
