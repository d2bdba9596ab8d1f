"""flashref.recorded.kernel_runs: the rule that says whether a step helped, and the tables
chapters 5 and 7 print, on small made-up benchmark and profile files (every number here is invented
for the test)."""

from __future__ import annotations

import json

import pytest

from flashref.recorded import kernel_runs as rp

NS = (1024, 4096)
DTYPES = ("float16", "bfloat16")


def _row(impl, rounds, run_dtype="float16", d=64, causal=False, N=1024):
    ms = sorted(rounds)[len(rounds) // 2]
    return {
        "impl": impl,
        "run_dtype": run_dtype,
        "d": d,
        "causal": causal,
        "N": N,
        "round_ms": list(rounds),
        "ms": ms,
        "tflops": 100.0 / ms,
        "spread": None,
    }


def _bench(times, name="made-up"):
    """times: {(impl, d, causal): rounds or a function (dtype, N) -> rounds}."""
    rows = []
    for (impl, d, causal), rounds in times.items():
        for dtype in DTYPES:
            for N in NS:
                got = rounds(dtype, N) if callable(rounds) else rounds
                rows.append(_row(impl, got, dtype, d, causal, N))
    return rp.Bench({"meta": {}, "rows": rows}, name)


def _all_shapes(impl, rounds):
    return {(impl, d, c): rounds for d, c in rp.SHAPES}


def _control_identical():
    """v14 and v17 whose rounds overlap everywhere: a control with no noise."""
    return _all_shapes("v14", [1.0, 1.1, 1.2]) | _all_shapes("v17", [1.05, 1.1, 1.15])


# ---- compare_rounds: one shape ----------------------------------------------------------


def test_rounds_that_overlap_are_within_the_spread():
    old, new = _row("v1", [1.0, 1.1, 1.2]), _row("v2", [0.95, 1.05, 1.15])
    assert rp.compare_rounds(old, new) == "within the spread"
    assert rp.compare_rounds(new, old) == "within the spread"


def test_rounds_that_touch_are_within_the_spread():
    # disjoint means every round strictly faster: a shared end point is an overlap
    old, new = _row("v1", [1.0, 1.1]), _row("v2", [0.9, 1.0])
    assert rp.compare_rounds(old, new) == "within the spread"


def test_disjoint_rounds_are_faster_or_slower():
    old, new = _row("v1", [1.0, 1.1, 1.2]), _row("v2", [0.7, 0.8, 0.9])
    assert rp.compare_rounds(old, new) == "faster"
    assert rp.compare_rounds(new, old) == "slower"


def test_a_lower_median_with_overlapping_rounds_is_not_faster():
    # the median moved a lot, but one round of each overlaps: no claim
    old, new = _row("v1", [0.5, 2.0, 2.1]), _row("v2", [1.0, 1.0, 1.0])
    assert new["ms"] < old["ms"]
    assert rp.compare_rounds(old, new) == "within the spread"


def test_a_single_round_is_widened_by_the_widest_spread():
    old, new = _row("v1", [1.0]), _row("v2", [0.85])
    assert rp.compare_rounds(old, new) == "no spread measured"
    assert rp.compare_rounds(old, new, widest=0.05) == "faster"  # 0.8925 < 0.95
    assert rp.compare_rounds(old, new, widest=0.1) == "within the spread"  # 0.935 > 0.9
    assert rp.round_interval(old, 0.1) == pytest.approx((0.9, 1.1))


def test_compare_rounds_names_a_bad_argument():
    with pytest.raises(TypeError, match="new is a list"):
        rp.compare_rounds(_row("v1", [1.0, 2.0]), [1.0])
    with pytest.raises(ValueError, match="no rounds"):
        rp.compare_rounds(_row("v1", [1.0, 2.0]), {"impl": "v2", "round_ms": []})
    with pytest.raises(ValueError, match="widest"):
        rp.round_interval(_row("v1", [1.0]), -0.1)


# ---- step_verdict: the control pair sets the noise floor ----------------------------------


def test_the_control_pair_is_never_a_gain_or_a_loss():
    # v17 slower at every bf16 shape and within the spread at every fp16 one: half the
    # shapes separated, so the control's own share is 0.5, and its verdict must be neither
    times = _all_shapes("v14", [1.0, 1.01, 1.02])
    times |= _all_shapes("v17", lambda dtype, N: [1.1, 1.11] if dtype == "bfloat16" else [1.0])
    bench = _bench(times)
    assert rp.control_share(bench) == 0.5
    for d, causal in rp.SHAPES:
        word, counts = rp.step_verdict(bench, 14, 17, d, causal)
        assert word == "within the spread", (d, causal, counts)


def test_a_step_must_beat_the_control_share():
    # v12 -> v13 faster at 2 of 4 shapes: a gain over a quiet control, not over a noisy one
    faster_half = lambda dtype, N: [0.5, 0.6] if N == 1024 else [1.0, 1.1]  # noqa: E731
    times = _all_shapes("v12", [1.0, 1.1]) | _all_shapes("v13", faster_half)
    quiet = _bench(times | _control_identical())
    assert rp.control_share(quiet) == 0
    word, counts = rp.step_verdict(quiet, 12, 13, 64, False)
    assert counts["faster"] == 2 and counts["within the spread"] == 2
    assert word == "gain"
    assert rp.step_verdict(quiet, 12, 13, 64, False, control=0.5)[0] == "within the spread"
    assert rp.step_verdict(quiet, 13, 12, 64, False)[0] == "loss"


def test_step_verdict_counts_every_dtype_and_length():
    bench = _bench(_control_identical() | _all_shapes("v15", [2.0, 2.1]))
    word, counts = rp.step_verdict(bench, 14, 15, 128, True)
    assert word == "loss"
    assert counts["slower"] == len(DTYPES) * len(NS)


def test_step_verdict_names_what_is_missing():
    bench = _bench(_all_shapes("v14", [1.0, 1.1]))
    with pytest.raises(ValueError, match="pair: made-up has no rows of version 17"):
        rp.control_share(bench)
    with pytest.raises(ValueError, match="old = 0"):
        rp.step_verdict(bench, 0, 14, 64, False, control=0.5)
    with pytest.raises(TypeError, match="causal = 1"):
        rp.step_verdict(bench, 14, 14, 64, 1, control=0.5)
    with pytest.raises(ValueError, match="control = 2"):
        rp.step_verdict(bench, 14, 14, 64, False, control=2)
    with pytest.raises(ValueError, match="share no shape"):
        rp.step_verdict(bench, 14, 99, 64, False, control=0.5)


# ---- tables -------------------------------------------------------------------------------


def test_steps_lines_say_within_the_spread_for_the_control():
    bench = _bench(_control_identical())
    lines = rp.steps_lines(bench, [(14, 17)])
    assert lines[1].split()[:3] == ["v14", "->", "v17"]
    assert lines[1].count("within the spread") == 4
    assert "gain" not in lines[1] and "loss" not in lines[1]


def test_speed_lines_mark_each_shape_and_give_the_verdict():
    bench = _bench(_control_identical() | _all_shapes("v15", [0.5, 0.6]))
    text = "\n".join(rp.speed_lines(bench, 14, 15, at=1024))
    assert text.count("1.83+") == len(DTYPES) * len(rp.SHAPES) * len(NS)
    assert "d = 128, causal gain" in " ".join(text.split())
    assert "TFLOP/s (spread), N = 1024" in text


def test_step_lines_print_speed_at_one_length_and_the_verdict():
    bench = _bench(_control_identical() | _all_shapes("v15", [2.0, 2.2]))
    lines = rp.step_lines(bench, 14, 15, at=4096)
    assert len(lines) == 3
    assert lines[1].split() == [
        "d",
        "=",
        "64",
        "0.50x",
        "loss",
        "(0,",
        "4",
        "of",
        "4)",
        "causal",
        "0.50x",
        "loss",
        "(0,",
        "4",
        "of",
        "4)",
    ]


def test_a_version_of_one_head_dim_steps_only_there():
    # v15 built for d = 64 alone (as backward version 17): no d = 128 line, no error
    only64 = {
        (impl, d, c): r for (impl, d, c), r in _all_shapes("v15", [0.5, 0.6]).items() if d == 64
    }
    bench = _bench(_control_identical() | only64)
    lines = rp.step_lines(bench, 14, 15, at=4096)
    assert len(lines) == 2 and lines[1].split()[:3] == ["d", "=", "64"]
    verdicts = rp.speed_lines(bench, 14, 15)
    assert not [ln for ln in verdicts if "128" in ln]
    assert sum("gain" in ln for ln in verdicts) == 2  # d = 64, with and without the mask


def test_control_lines_report_the_pair():
    lines = rp.control_lines(_bench(_control_identical()))
    assert "overlapping at 4 of 4 shapes" in lines[1]
    assert lines[-1].endswith("0%")


def test_bench_load_reads_a_file_and_refuses_nan(tmp_path):
    data = {"meta": {}, "rows": [_row("v1", [1.0, 1.5])]}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    bench = rp.Bench.load(path)
    assert bench.version(1, "float16", 64, False, 1024)["ms"] == 1.5
    assert bench.version(2, "float16", 64, False, 1024) is None
    assert bench.widest == pytest.approx(0.5 / 1.5)
    path.write_text(json.dumps(data).replace("1.5", "NaN"))
    with pytest.raises(ValueError, match="NaN is not a measurement"):
        rp.Bench.load(path)
    with pytest.raises(ValueError, match=r"rows\[0\] has no 'round_ms'"):
        rp.Bench(
            {
                "rows": [
                    {
                        "impl": "v1",
                        "run_dtype": "float16",
                        "d": 64,
                        "causal": False,
                        "N": 1,
                        "tflops": 1.0,
                    }
                ]
            }
        )


def _profile_row(impl, d, time_ns, ldsm, mma):
    return {
        "impl": impl,
        "d": d,
        "gpu__time_duration.sum": time_ns,
        "smsp__inst_executed_op_ldsm.sum": ldsm,
        "sm__inst_executed_pipe_tensor_op_hmma.sum": mma,
    }


def test_counter_lines_print_values_ratios_and_gaps():
    prof = rp.Profile(
        {
            "meta": {},
            "rows": [
                _profile_row("v3", 64, 2e6, 10, 20),
                _profile_row("v4", 64, 1e6, 5, 20),
                _profile_row("v3", 128, 4e6, 10, 0),
            ],
        }
    )
    lines = rp.counter_lines(prof, [3, 4], ["time in ncu, ms", "ldmatrix per mma"], ratio=True)
    assert lines[0].split() == [
        "v3",
        "d=64",
        "v4",
        "d=64",
        "new/old",
        "v3",
        "d=128",
        "v4",
        "d=128",
        "new/old",
    ]
    assert lines[1].split() == [
        "time",
        "in",
        "ncu,",
        "ms",
        "2.00",
        "1.00",
        "0.50x",
        "4.00",
        "-",
        "-",
    ]
    assert lines[2].split()[-6:] == ["0.500", "0.250", "0.50x", "nan", "-", "-"]
    with pytest.raises(ValueError, match="names: no counter 'speed'"):
        rp.counter_lines(prof, [3], ["speed"])
    with pytest.raises(ValueError, match="ratio=True compares two versions"):
        rp.counter_lines(prof, [3], ["time in ncu, ms"], ratio=True)
    one = rp.counter_lines(prof, [3, 4], ["time in ncu, ms"], dims=[128])
    assert one[0].split() == ["v3", "d=128", "v4", "d=128"] and one[1].split()[-2:] == ["4.00", "-"]
    with pytest.raises(ValueError, match="dims: \\[96\\] is not"):
        rp.counter_lines(prof, [3], ["time in ncu, ms"], dims=[96])
