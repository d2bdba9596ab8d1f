"""``python -m flashref.bench training_step``: its summary of the profiler's events, its text and
its arguments, on the CPU without torch (the steps themselves need torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashref.bench import training_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    return training_step


def event(key, count, cpu, gpu=0.0, total=None):
    return SimpleNamespace(
        key=key,
        count=count,
        self_cpu_time_total=cpu,
        cpu_time_total=cpu if total is None else total,
        self_device_time_total=gpu,
    )


def test_summarize_is_per_step_and_ranks_by_self_cpu_time(tool):
    events = [
        event("aten::mm", 40, 400.0, 90.0),
        event("cudaLaunchKernel", 100, 800.0),
        event("cuLaunchKernel", 20, 120.0),
        event("aten::add_", 10, 50.0, 10.0),
        event("flash_fwd_kernel", 2, 0.0, 300.0),
    ]
    s = tool.summarize(events, steps=10, top=2)
    assert s["cpu_us"] == pytest.approx(137.0) and s["gpu_us"] == pytest.approx(40.0)
    assert s["operators"] == [["cudaLaunchKernel", 80.0, 10.0], ["aten::mm", 40.0, 4.0]]
    assert s["api"] == {"cudaLaunchKernel": [10.0, 80.0], "cuLaunchKernel": [2.0, 12.0]}
    run = {
        "attention": "sdpa",
        "step_ms": 10.9,
        "forward_backward_host_ms": 4.0,
        "forward_backward_done_ms": 5.0,
        "profile": s,
    }
    text = tool.lines(run)
    assert text[0].startswith("sdpa: step 10.90 ms; forward + backward: host 4.00 ms")
    assert text[2].split() == ["cudaLaunchKernel", "80.0", "10.0"]
    assert [t.split()[1] for t in text if t.startswith("  api ")] == [
        "cudaLaunchKernel",
        "cuLaunchKernel",
    ]


def test_the_attention_ranges_are_inclusive_and_each_sides_own(tool):
    fwd, bwd = tool.ATTENTION_RANGES["sdpa"]
    events = [
        event(fwd, 4, 20.0, total=300.0),
        event(bwd + "Backward0", 4, 10.0, total=500.0),
        event("_EagerAttention", 4, 50.0, total=900.0),
        event("aten::mm", 8, 70.0),
    ]
    s = tool.summarize(events, steps=2, attention="sdpa")
    assert s["attention_us"] == [150.0, 250.0]  # inclusive, per step; flashref's not counted
    assert tool.summarize(events, steps=2, attention="flashref")["attention_us"] == [450.0, 0.0]
    assert tool.summarize(events, steps=2)["attention_us"] is None
    run = {
        "attention": "sdpa",
        "step_ms": 1.0,
        "forward_backward_host_ms": 1.0,
        "forward_backward_done_ms": 1.0,
        "profile": s,
    }
    want = "  attention's ranges, CPU us per step: forward 150.0, backward 250.0"
    assert tool.lines(run)[1] == want
    with pytest.raises(ValueError, match="attention must be"):
        tool.summarize(events, steps=2, attention="cudnn")


def test_bad_arguments_are_named(tool):
    with pytest.raises(ValueError, match="steps must be"):
        tool.summarize([], steps=0)
    with pytest.raises(ValueError, match="top must be"):
        tool.summarize([], steps=1, top=True)
    with pytest.raises(SystemExit):
        tool.main(["--steps", "0"])


def test_without_torch_it_says_so(tool, capsys):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the tool would train")
    from flashref.bench import cli

    argv = ["--device", "cpu", "--attention", "sdpa", "--steps", "1"]
    assert cli.run(tool.main, tool.PROG, argv) == 3  # as python -m flashref.bench runs it
    assert "torch is not installed" in capsys.readouterr().err
