"""``python -m flashref.bench prefill_stamps``: its stamps find their places in the prefill
kernel's source (on the CPU: the text only; the run needs an sm_90a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashref.bench import prefill_stamps
from flashref.gpu.registry import KERNEL_DIR, paste_includes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    return prefill_stamps


@pytest.fixture(scope="module")
def source():
    return paste_includes(KERNEL_DIR / "decode" / "paged_prefill.cu")


def test_every_stamp_is_pasted_once_in_order_of_its_thread(tool, source):
    text = tool.stamped_source(source)
    slots = [int(m) for m in re.findall(r"stamps_\[blockIdx\.x\]\[(\d+)\] = clock64\(\)", text)]
    assert sorted(slots) == list(range(len(tool.STAMPS)))
    producer = [s for s in slots if "threadIdx.x == 0" in tool.STAMPS[s][3]]
    consumer = [s for s in slots if "threadIdx.x == 128" in tool.STAMPS[s][3]]
    assert producer == sorted(producer) and consumer == sorted(consumer)  # in the code's order
    timers = re.findall(r"stamps_\[blockIdx\.x\]\[(\d+)\] = t_;", text)
    assert timers == [str(len(tool.STAMPS)), str(len(tool.STAMPS) + 1)]
    assert len(tool.STAMPS) + 2 <= tool.SLOTS
    # the source around the stamps is untouched: take them out and it is the kernel's again
    body = re.sub(r"if \([^\n]*stamps_\[[^\n]*\n", "", text)
    declaration = f"__device__ unsigned long long stamps_[1024][{tool.SLOTS}];\n"
    assert body.replace(declaration, "") == source


def test_a_stamp_whose_place_is_gone_is_named(tool, source):
    anchor = tool.STAMPS[5][1]
    with pytest.raises(ValueError, match=r"stamp 'q_landed'.* 0 times"):
        tool.stamped_source(source.replace(anchor, "/* moved */"))


def test_the_loop_stamps_sit_in_the_kernels_first_work_tile(tool):
    # every stamp after the start is taken once per block: on its first work tile (n == 0),
    # except the consumer's start, which comes before the loop
    for name, _, _, cond in tool.STAMPS:
        if name not in ("start", "consumer_ready"):
            assert "n == 0" in cond, name
